"""Built-in kernels prebuilt at package build (opforge.runtime.prebuilt).

The set is made by ``pip install .`` / ``pip install -e .`` / ``python setup.py
build_ext --inplace``.  A run with every route to a compiler blocked (CC, CXX,
OPFORGE_CC, OPFORGE_CXX, PATH) and an empty cache folder must run built-ins and
a light ONNX model without compiling anything; a user's op there must still
say that no compiler was found.
"""
import copy
import io
import json
import os

import numpy as np
import pytest

import opforge
from helpers import run_without_compiler
from opforge.runtime import prebuilt

REBUILD = "rebuild it: python setup.py build_ext --inplace (or pip install -e .)"


def test_every_builtin_kernel_is_in_the_prebuilt_set():
    pairs = prebuilt.builtin_kernels()
    assert len(pairs) > 50
    index = prebuilt.load_index()
    assert index, f"no prebuilt set in {prebuilt.PREBUILT_DIR}; {REBUILD}"
    missing = [f"{op.name} {kernel.name}" for op, kernel in pairs if prebuilt.lookup(kernel) is None]
    assert not missing, f"{len(missing)} built-in kernel(s) not prebuilt or stale ({', '.join(missing[:8])}); {REBUILD}"
    # ISA variants the build machine may lack are in the set too
    isas = {kernel.isa for _, kernel in pairs if kernel.isa}
    assert {"sse41", "avx2", "avx512"} <= isas


def test_builtins_and_a_model_run_with_no_compiler(tmp_path):
    done, cache = run_without_compiler(tmp_path, """
        import os
        import onnx, onnxruntime
        import opforge.onnx
        from helpers import assert_softmax_close, logits_exposed
        from opforge.runtime.cpu import isa_reject_reason
        rng = np.random.default_rng(0)
        x = rng.standard_normal((3, 5)).astype(np.float32)
        checks = {
            "relu": (opforge.ops.relu(x), np.maximum(x, 0)),
            "add": (opforge.ops.add(x.astype(np.float64), 1.0), x.astype(np.float64) + 1),
            "mul": (opforge.ops.mul(np.arange(6, dtype=np.int32), np.int32(3)), np.arange(6, dtype=np.int32) * 3),
            "matmul": (opforge.ops.matmul(x, x.T), x @ x.T),
            "softmax": (opforge.ops.softmax(x), np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
            "leaky_relu": (opforge.ops.leaky_relu(x, alpha=0.1), np.where(x > 0, x, 0.1 * x)),
            "concat": (opforge.ops.concat(x, x, axis=1), np.concatenate([x, x], axis=1)),
            "cast": (opforge.ops.cast(x, dtype="float64"), x.astype(np.float64)),
            "transpose": (opforge.ops.transpose(x), x.T),
            "reduce_sum": (opforge.ops.reduce_sum(x, axes=[1]), x.sum(1)),
        }
        for name, (got, want) in checks.items():
            assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
        loaded, unusable_loaded = [], []
        for name in checks:
            for kernel in opforge.lookup(name).kernels:
                if getattr(kernel, "library", None) is not None:
                    loaded.append(str(kernel.library.path))
                    if kernel.isa and isa_reject_reason(kernel.isa):
                        unusable_loaded.append(kernel.name)

        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        model = logits_exposed(onnx.load(os.path.join(light, "light_squeezenet.onnx")))
        graph = opforge.onnx.load(model)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (info,) = session.get_inputs()
        image = rng.random([d if isinstance(d, int) else 1 for d in info.shape], dtype=np.float32)
        ours, our_logits = graph(image)
        theirs, their_logits = session.run(None, {info.name: image})
        assert_softmax_close(ours, theirs, our_logits, their_logits, rtol=1e-3, atol=1e-4)
        print(json.dumps({"builds": BUILDS, "loaded": loaded, "unusable_loaded": unusable_loaded,
                          "model_shape": list(ours.shape)}))
        """)
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n(a built-in that compiled means the set is stale; {REBUILD})"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["builds"] == []
    assert report["model_shape"] == [1, 1000, 1, 1]
    assert len(report["loaded"]) >= 10
    assert all(os.path.dirname(p) == str(prebuilt.PREBUILT_DIR) for p in report["loaded"]), report["loaded"]
    assert report["unusable_loaded"] == []
    assert list(cache.iterdir()) == []  # no inline source written, no cache entry


def test_a_user_op_still_needs_a_compiler(tmp_path):
    done, cache = run_without_compiler(tmp_path, """
        op = opforge.op("mine::twice(Tensor x) -> Tensor y")
        op.def_infer(opforge.infer.same_as(0))
        op.kernel(function="Twice", dtypes={"x": ["float32"]}, code='''
        #include "custom_aot_extra.h"
        extern "C" int Twice(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
          return 0;
        }
        ''')
        assert op.kernels[0].builtin is False
        try:
            op(np.ones(3, np.float32))
        except opforge.CompilerNotFoundError as error:
            print("CompilerNotFoundError:", error)
        else:
            raise SystemExit("the user op ran without a compiler")
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CompilerNotFoundError: no C++ compiler found" in done.stdout
    assert "OPFORGE_CXX" in done.stdout


def _relu_kernel():
    return next(k for k in opforge.lookup("relu").kernels if isinstance(k, opforge.AotKernel))


def test_the_key_ignores_the_compiler_but_not_flags_or_source(monkeypatch, fresh):
    kernel = _relu_kernel()
    key = prebuilt.kernel_key(kernel)
    assert key is not None and len(key) == 64
    monkeypatch.setenv("CXX", "/somewhere/else/clang++")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert prebuilt.kernel_key(kernel) == key

    monkeypatch.setenv("OPFORGE_CXXFLAGS", "-DUSER_FLAG=1")
    assert prebuilt.kernel_key(kernel) != key
    monkeypatch.delenv("OPFORGE_CXXFLAGS")

    edited = copy.copy(kernel)
    edited.code = kernel.code + "\n// edited\n"
    assert prebuilt.kernel_key(edited) not in (None, key)
    assert prebuilt.lookup(edited) is None
    other_flags = copy.copy(kernel)
    other_flags.cflags = kernel.cflags + ("-DOTHER=1",)
    assert prebuilt.kernel_key(other_flags) not in (None, key)

    # the same source declared by a user is not a built-in: no key, no prebuilt library
    fresh.append("mine::relu_copy")
    user = opforge.op("mine::relu_copy(Tensor x) -> Tensor y")
    user_kernel = user.kernel(function="Relu", dtypes={"x": ["float32"]}, code=kernel.code)
    assert user_kernel.builtin is False
    assert prebuilt.kernel_key(user_kernel) is None and prebuilt.lookup(user_kernel) is None


def test_prebuild_compiles_reuses_and_checks_files(tmp_path):
    relu = opforge.lookup("relu")
    concat = opforge.lookup("concat")
    pairs = [(relu, _relu_kernel()), (relu, _relu_kernel()),  # the same variant twice compiles once
             (concat, next(k for k in concat.kernels if isinstance(k, opforge.AotKernel)))]
    stream = io.StringIO()
    summary = prebuilt.prebuild(tmp_path, kernels=pairs, jobs=2, stream=stream)
    assert (summary["variants"], summary["compiled"], summary["reused"], summary["failed"]) == (2, 2, 0, [])
    assert "prebuilt 2/2" in stream.getvalue()
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["format"] == prebuilt.FORMAT
    assert sorted(e["op"] for e in index["kernels"].values()) == ["concat", "relu"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index.json"] +
                                                                [e["file"] for e in index["kernels"].values()])

    found = prebuilt.lookup(pairs[0][1], folder=tmp_path)
    assert found is not None and found.path.parent == tmp_path and found.from_cache

    again = prebuilt.prebuild(tmp_path, kernels=pairs, jobs=2, stream=io.StringIO())
    assert (again["compiled"], again["reused"]) == (0, 2)

    # a damaged library is not used (the kernel then builds as usual) and is rebuilt by the next prebuild
    library = found.path
    library.write_bytes(library.read_bytes()[:100])
    prebuilt._loaded.clear()
    assert prebuilt.lookup(pairs[0][1], folder=tmp_path) is None
    assert prebuilt.prebuild(tmp_path, kernels=pairs, jobs=1, stream=io.StringIO())["compiled"] == 1
    prebuilt._loaded.clear()
    assert prebuilt.lookup(pairs[0][1], folder=tmp_path) is not None


def test_opforge_prebuilt_0_ignores_the_set(monkeypatch):
    kernel = _relu_kernel()
    if prebuilt.lookup(kernel) is None:
        pytest.fail(f"relu is not in the prebuilt set; {REBUILD}")
    monkeypatch.setenv("OPFORGE_PREBUILT", "0")
    assert prebuilt.lookup(kernel) is None
