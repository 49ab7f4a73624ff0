"""opforge ops on JAX values sharded over a mesh of 4 host devices (a child process, which
JAX starts with XLA_FLAGS=--xla_force_host_platform_device_count=4): results and gradients
equal the single-device run, under shard_map and under jax.jit, where each call is
partitioned by the op's SBP signatures: no collective where a signature fits.  Each check
runs with both of XLA's partitioners (Shardy, JAX's default, and GSPMD), and jax.vmap
works whatever the device count."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "jax_sharding_script.py"


@pytest.fixture(scope="module", params=["shardy", "gspmd"])
def results(request):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, str(SCRIPT), request.param], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]  # (GSPMD aborted the process on an operand with no sharding)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_four_devices(results):
    assert results["devices"] == 4
    assert results["partitioner"] in ("shardy", "gspmd")


@pytest.mark.parametrize("check", ["shard_map_value", "shard_map_grad_x", "shard_map_grad_w"])
def test_shard_map_with_check_vma(results, check):
    assert results[check] is True


@pytest.mark.parametrize("check", ["jit_value", "jit_grad_x", "jit_grad_w", "column_sums", "two_outputs",
                                   "numpy_constant"])
def test_jit_on_sharded_inputs(results, check):
    assert results[check] is True


def test_an_eager_call_on_a_sharded_array_stays_sharded(results):
    assert results["eager_sharded"] == [True, "P('i',)"]


@pytest.mark.parametrize("check", ["vmap_elementwise", "vmap_sequential", "jit_of_vmap", "vmap_of_jit",
                                   "vmap_unbatched_input", "vmap_of_grad", "vmap_two_outputs", "vmap_sharded"])
def test_vmap_with_several_devices(results, check):
    # custom_partitioning has no batching rule ("Batching rule for 'custom_partitioning' not implemented")
    assert results[check] is True


def test_the_result_stays_sharded_and_elementwise_ops_need_no_collective(results):
    assert results["jit_value_sharding"] == "P('i',)"
    assert results["elementwise_collectives"] == []
    assert results["rows_matmul_collectives"] == []  # a:S(0), b:B -> y:S(0)
    assert results["row_sums_collectives"] == []
    assert results["column_sums_collectives"] == ["all-reduce"]  # x:S(0) -> y:P, summed
