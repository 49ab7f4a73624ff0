"""``opforge run`` and ``opforge convert`` on ONNX models: outputs, latency lines, graph JSON, one-line errors."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import opforge
from helpers import assert_softmax_close, logits_exposed
from opforge.cli import main
from opforge.runtime import blas

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def small_model(path, op_type="Relu", domain=""):
    """y = softmax(relu(x) + b) with x [N, 4] (N a dim_param), b an initializer; z = relu(x) (two outputs)."""
    b = np.arange(4, dtype=np.float32) / 4
    nodes = [helper.make_node(op_type, ["x"], ["r"], domain=domain),
             helper.make_node("Add", ["r", "b"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1),
             helper.make_node("Relu", ["x"], ["z"])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])],
                              initializer=[onnx.numpy_helper.from_array(b, "b")])
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def model(tmp_path):
    return small_model(tmp_path / "small.onnx")


def ort_outputs(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def assert_output_line(out, name, array):
    """``out`` has the line of output ``name`` with ``array``'s shape and dtype, and its min, max and mean."""
    prefix = f"output {name}: shape {list(array.shape)}, {array.dtype}, "
    (line,) = [line for line in out.splitlines() if line.startswith(prefix)]
    printed = dict(item.split(" ") for item in line[len(prefix):].split(", "))
    values = array.astype(np.float64)
    expected = {"min": values.min(), "max": values.max(), "mean": values.mean()}
    assert {k: float(v) for k, v in printed.items()} == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_run_with_random_inputs_prints_outputs_and_latency(model, capsys):
    assert main(["run", str(model)]) == 0
    out = capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)  # the documented random input
    y, z = ort_outputs(model, x)
    assert "input x: not given, random float32 [1, 4] (seed 0)" in out
    assert_output_line(out, "y", y)
    assert_output_line(out, "z", z)
    assert "latency: load " in out and "first run " in out and "bench:" not in out


def test_run_with_given_input_and_bench(model, tmp_path, capsys):
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--bench", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    y, _ = ort_outputs(model, x)
    assert "random" not in out
    assert_output_line(out, "y", y)
    assert "bench: 3 runs, median " in out and " ms, min " in out


def test_run_threads_sets_the_pool_and_leaves_openblas_on_one(model, capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_NUM_THREADS", "1")
    before = opforge.get_num_threads()
    handle = blas.load()
    try:
        assert main(["run", str(model), "--threads", "2", "--seed", "3"]) == 0
        assert os.environ["OPFORGE_NUM_THREADS"] == "2" and opforge.get_num_threads() == 2
        assert handle.scipy_openblas_get_num_threads() == 1
        assert "(seed 3)" in capsys.readouterr().out
    finally:
        opforge.set_num_threads(before)


def test_convert_writes_a_graph_json_that_runs(model, tmp_path, capsys):
    out = tmp_path / "small.json"
    assert main(["convert", str(model), str(out)]) == 0
    assert f"{out}: 1 input(s)" in capsys.readouterr().out
    graph = opforge.Graph.load(out)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    for got, expected in zip(graph(x), ort_outputs(model, x)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_convert_back_to_onnx_and_run_a_graph_json(model, tmp_path, capsys):
    assert main(["convert", str(model), str(tmp_path / "g.json")]) == 0
    assert main(["convert", str(tmp_path / "g.json"), str(tmp_path / "back.onnx"), "--opset", "13"]) == 0
    assert f"{tmp_path / 'back.onnx'}: 1 input(s), " in capsys.readouterr().out
    back = onnx.load(str(tmp_path / "back.onnx"))
    assert back.opset_import[0].version == 13
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    for got, expected in zip(ort_outputs(tmp_path / "back.onnx", x), ort_outputs(model, x)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert main(["run", str(tmp_path / "g.json")]) == 0
    y, _ = ort_outputs(model, np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32))
    assert_output_line(capsys.readouterr().out, "y", y)


def error_of(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    return status, captured.err


@pytest.mark.parametrize("command", ["run", "convert"])
def test_missing_model_file(command, tmp_path, capsys):
    argv = [command, str(tmp_path / "none.onnx")] + ([str(tmp_path / "g.json")] if command == "convert" else [])
    status, err = error_of(capsys, argv)
    assert status == 2 and f"opforge {command}: no model file at" in err


def test_malformed_model(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07not a model at all\xff\xff")
    status, err = error_of(capsys, ["run", str(bad)])
    assert status == 1 and err.startswith("opforge run: ") and "bad.onnx" in err


def test_unsupported_op_is_one_line(tmp_path, capsys):
    path = small_model(tmp_path / "custom.onnx", op_type="NoSuchOp", domain="com.nowhere")
    status, err = error_of(capsys, ["convert", str(path), str(tmp_path / "g.json")])
    assert status == 1 and "com.nowhere::NoSuchOp" in err
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("given, message", [
    ("x", "expected NAME=FILE.npy"),
    ("w={npy}", "the model has no input 'w'; its inputs: x"),
    ("x={missing}", "cannot read"),
    ("x={blank}", "cannot read"),
    ("x={wrong_dtype}", "input 'x' is float32 [?, 4] in the model; the file given holds float64 [2, 4]"),
    ("x={wrong_shape}", "input 'x' is float32 [?, 4] in the model; the file given holds float32 [2, 3]"),
])
def test_bad_input_option_is_a_usage_error(model, tmp_path, capsys, given, message):
    files = {"npy": tmp_path / "ok.npy", "missing": tmp_path / "missing.npy",
             "wrong_dtype": tmp_path / "f64.npy", "wrong_shape": tmp_path / "shape.npy",
             "blank": tmp_path / "blank.npy"}
    files["blank"].write_bytes(b"")
    np.save(files["npy"], np.zeros((2, 4), np.float32))
    np.save(files["wrong_dtype"], np.zeros((2, 4), np.float64))
    np.save(files["wrong_shape"], np.zeros((2, 3), np.float32))
    status, err = error_of(capsys, ["run", str(model), "--input", given.format(**files)])
    assert status == 2 and message in err


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--repeat", "-1"]])
def test_bad_counts_are_rejected(model, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(model)] + argv)
    assert exit_info.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


def test_squeezenet_through_python_m_opforge(tmp_path):
    model = LIGHT / "light_squeezenet.onnx"
    run = subprocess.run([sys.executable, "-m", "opforge", "run", str(model), "--bench", "--repeat", "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "input data_0: not given, random float32 [1, 3, 224, 224] (seed 0)" in run.stdout
    assert "output softmaxout_1: shape [1, 1000, 1, 1], float32" in run.stdout
    assert "bench: 2 runs" in run.stdout
    # Converted with its logits as a second output: its constant fills make logits of about 1e10, whose
    # softmax rounding decides (see helpers.assert_softmax_close); the logits themselves compare.
    exposed = tmp_path / "squeezenet_logits.onnx"
    onnx.save(logits_exposed(onnx.load(str(model))), str(exposed))
    convert = subprocess.run([sys.executable, "-m", "opforge", "convert", str(exposed), str(tmp_path / "sq.json")],
                             capture_output=True, text=True, timeout=600)
    assert convert.returncode == 0, convert.stderr
    graph = opforge.Graph.load(tmp_path / "sq.json")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ours, our_logits = graph(x)
    theirs, their_logits = ort.InferenceSession(str(exposed), providers=["CPUExecutionProvider"]).run(
        None, {"data_0": x})
    assert_softmax_close(ours, theirs, our_logits, their_logits, rtol=1e-3, atol=1e-4)


def test_import_declares_the_ops_of_a_custom_domain(tmp_path, capsys, monkeypatch):
    (tmp_path / "cli_twice_ops.py").write_text(
        "import opforge\n"
        "twice = opforge.op('cli.test::Twice(Tensor x) -> Tensor y')\n"
        "twice.def_infer(opforge.infer.same_as(0))\n"
        "twice.reference(fallback=True)(lambda x: x * 2)\n")
    path = small_model(tmp_path / "twice.onnx", op_type="Twice", domain="cli.test")
    monkeypatch.chdir(tmp_path)
    status, err = error_of(capsys, ["run", str(path)])
    assert status == 1 and "cli.test::Twice" in err
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--import", "cli_twice_ops", "--input", "x=x.npy"]) == 0
    s = 2 * x + np.arange(4, dtype=np.float32) / 4  # y = softmax(Twice(x) + b)
    y = np.exp(s - s.max(axis=1, keepdims=True))
    y /= y.sum(axis=1, keepdims=True)
    assert_output_line(capsys.readouterr().out, "y", y)
    status, err = error_of(capsys, ["convert", str(path), "g.json", "--import", "no_such_module_here"])
    assert status == 2 and "cannot import module 'no_such_module_here'" in err


def dynamic_reshape_model(path):
    """y = x.view(x.size(0) * 2, -1) for x [N, 4]: a shape computed from N, so a DynamicModel."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Mul", ["n", "two"], ["n2"]),
             helper.make_node("Unsqueeze", ["n2", "axes"], ["n2v"]),
             helper.make_node("Concat", ["n2v", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("zero", 0), ("two", 2), ("axes", [0]), ("minus_one", [-1]))]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_a_model_computing_shapes_at_run_time_runs_and_refuses_one_graph_file(tmp_path, capsys):
    path = dynamic_reshape_model(tmp_path / "dyn.onnx")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}"]) == 0
    assert_output_line(capsys.readouterr().out, "y", x.reshape(6, 2))
    assert main(["convert", str(path), str(tmp_path / "g.json")]) == 1
    assert "computes its shapes at run time" in capsys.readouterr().err
    with pytest.raises(opforge.onnx.ModelError, match=r"export\(model.specialize"):
        opforge.onnx.export(opforge.onnx.load(str(path)))
    one = opforge.onnx.load(str(path)).specialize(x)  # one signature's graph exports and runs in onnxruntime
    session = ort.InferenceSession(opforge.onnx.export(one).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x.reshape(6, 2))
