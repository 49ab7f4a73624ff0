"""A function of opforge ops saved with jax.export in one process runs in another: each custom
call names what it computes (op, attributes, input and output types), and the loading process
plans it on its first call, whatever plans it made before.  A call it cannot plan (the op is not
registered there, or infers other outputs) is an opforge error naming the op, never another op's
kernel (the call once carried only a plan index: tanh came back as relu)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent / "jax_export_script.py"


def run(*args):
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("jax-export") / "program"
    return path, run("save", path)


def test_saved_functions_run_in_another_process(saved):
    path, expected = saved
    loaded = run("load", path)
    assert set(loaded) == {"tanh_then_relu", "softmax", "twice", "layer_norm_no_bias"}
    for name, values in expected.items():
        assert not isinstance(loaded[name], str), loaded[name]
        np.testing.assert_allclose(loaded[name], values, rtol=1e-6, atol=1e-6, err_msg=name)
    x = np.linspace(-2.0, 2.0, 12, dtype=np.float64).reshape(3, 4)
    normalised = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(loaded["layer_norm_no_bias"], normalised * np.linspace(0.5, 2.0, 4), rtol=1e-5,
                               atol=1e-6)


def test_an_op_not_registered_in_the_loading_process_is_an_error(saved):
    path, expected = saved
    loaded = run("load", path, "unregistered")
    np.testing.assert_allclose(loaded["softmax"], expected["softmax"], rtol=1e-6)
    assert "opforge.SchemaError: the program calls op 'texp::twice', which is not registered" in loaded["twice"]


def test_an_op_that_infers_other_outputs_is_an_error(saved):
    path, _ = saved
    message = run("load", path, "mismatched")["twice"]
    assert "opforge.InferenceError: op 'texp::twice': the program was built for outputs [['float32', [3, 4]]]" in message
    assert "infers [['int32', [3, 4]]]" in message
