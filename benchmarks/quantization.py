"""Quantized-model ops on one CPU: the quantize_linear / dequantize_linear built-ins against NumPy's formula,
MatMulInteger (a loaded ONNX node: float64 BLAS matmul) against an int32 matmul and onnxruntime, and
RMSNormalization (a loaded node, composed of opforge ops) against NumPy and onnxruntime.

    python benchmarks/quantization.py [--repeat 5]

Each line: best of ``--repeat`` timings, in ms.  Results are checked equal (or close, for RMSNormalization)
before anything is timed.
"""
import argparse
import sys
import timeit
from pathlib import Path

try:
    import opforge  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import opforge.onnx  # noqa: E402

ops = opforge.ops


def best_ms(fn, repeat, number=1):
    fn()  # warm: compiles on a first run
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e3


def one_output(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def quantize_cases(repeat):
    x = np.random.default_rng(0).standard_normal((64, 1 << 16)).astype(np.float32)
    scale, zero = np.float32(0.02), np.uint8(128)
    q = ops.quantize_linear(x, scale, zero)
    assert np.array_equal(q, np.clip(np.rint(x / scale) + np.float32(zero), 0, 255).astype(np.uint8))
    per_axis = (np.random.default_rng(1).random(1 << 16) + 0.5).astype(np.float32)
    zeros = np.zeros(1 << 16, np.uint8)
    yield "quantize_linear 64 x 65536 float32 -> uint8, per tensor", {
        "opforge": best_ms(lambda: ops.quantize_linear(x, scale, zero), repeat, 10),
        "numpy": best_ms(lambda: np.clip(np.rint(x / scale) + np.float32(zero), 0, 255).astype(np.uint8), repeat, 10)}
    yield "quantize_linear 64 x 65536 float32 -> uint8, per axis (the last)", {
        "opforge": best_ms(lambda: ops.quantize_linear(x, per_axis, zeros, axis=1), repeat, 10),
        "numpy": best_ms(lambda: np.clip(np.rint(x / per_axis), 0, 255).astype(np.uint8), repeat, 10)}
    yield "dequantize_linear 64 x 65536 uint8 -> float32, per tensor", {
        "opforge": best_ms(lambda: ops.dequantize_linear(q, scale, zero), repeat, 10),
        "numpy": best_ms(lambda: (q.astype(np.float32) - np.float32(zero)) * scale, repeat, 10)}


def node_model(node, inputs, outputs, initializers, opset):
    graph = helper.make_graph([node], "bench", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs],
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def matmul_integer_case(repeat):
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (256, 1024), dtype=np.uint8)
    b = rng.integers(0, 256, (1024, 1024), dtype=np.uint8)
    model = node_model(helper.make_node("MatMulInteger", ["A", "B", "az", "bz"], ["Y"]),
                       [("A", TensorProto.UINT8, [256, 1024]), ("B", TensorProto.UINT8, [1024, 1024])],
                       [("Y", TensorProto.INT32, [256, 1024])], [("az", np.uint8(128)), ("bz", np.uint8(3))], 10)
    graph = opforge.onnx.load(model)
    assert np.array_equal(one_output(graph(a, b)), (a.astype(np.int64) - 128) @ (b.astype(np.int64) - 3))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a32, b32 = a.astype(np.int32) - 128, b.astype(np.int32) - 3
    yield "MatMulInteger 256 x 1024 @ 1024 x 1024 uint8 -> int32", {
        "opforge (float64 BLAS)": best_ms(lambda: graph(a, b), repeat),
        "int32 matmul (NumPy)": best_ms(lambda: a32 @ b32, repeat),
        "onnxruntime": best_ms(lambda: session.run(None, {"A": a, "B": b}), repeat)}


def rms_normalization_case(repeat):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((64, 4096)).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    model = node_model(helper.make_node("RMSNormalization", ["X", "W"], ["Y"], epsilon=1e-5),
                       [("X", TensorProto.FLOAT, [64, 4096])], [("Y", TensorProto.FLOAT, [64, 4096])], [("W", w)], 23)
    graph = opforge.onnx.load(model)

    def numpy_rms():
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-5)) * w

    np.testing.assert_allclose(one_output(graph(x)), numpy_rms(), rtol=1e-5, atol=1e-6)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    yield "RMSNormalization 64 x 4096 float32, last axis", {
        "opforge (composed)": best_ms(lambda: graph(x), repeat, 20),
        "numpy": best_ms(numpy_rms, repeat, 20),
        "onnxruntime": best_ms(lambda: session.run(None, {"X": x}), repeat, 20)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    for cases in (quantize_cases, matmul_integer_case, rms_normalization_case):
        for what, times in cases(args.repeat):
            print(what)
            for who, ms in times.items():
                print(f"    {who:26s} {ms:9.3f} ms")


if __name__ == "__main__":
    main()
