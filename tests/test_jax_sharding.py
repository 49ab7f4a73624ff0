"""opforge ops on JAX values sharded over a mesh of 4 host devices (a child process, which
JAX starts with XLA_FLAGS=--xla_force_host_platform_device_count=4): results and gradients
equal the single-device run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "jax_sharding_script.py"


@pytest.fixture(scope="module")
def results():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_four_devices(results):
    assert results["devices"] == 4


@pytest.mark.parametrize("check", ["shard_map_value", "shard_map_grad_x", "shard_map_grad_w"])
def test_shard_map_with_check_vma(results, check):
    assert results[check] is True
