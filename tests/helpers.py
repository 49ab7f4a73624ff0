"""Helpers shared by several test modules."""
import os
import subprocess
import sys
import textwrap

import numpy as np

import opforge


def declare(fresh, schema, **kwargs):
    """``opforge.op(schema)`` for a test; the ``fresh`` fixture unregisters it afterwards."""
    op = opforge.op(schema, **kwargs)
    fresh.append(op.name)
    return op


# Writes where each input and the output arrived, so a test sees what reached the kernel.
ADDRESSES = r"""
#include <cstdint>
extern "C" int Addresses(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  int64_t *y = static_cast<int64_t *>(params[2]);
  for (int k = 0; k < 3; k++) y[k] = reinterpret_cast<int64_t>(params[k]);
  return 0;
}
"""


def addresses_op(fresh, name):
    """``name(a, b) -> y``: y (int64, 3 values) holds the addresses of a, b and y as the kernel saw them."""
    op = declare(fresh, f"{name}(Tensor a, Tensor b) -> Tensor y")

    @op.infer_shape
    def _(a, b):
        return (3,)

    @op.infer_dtype
    def _(a, b):
        return "int64"

    op.kernel(code=ADDRESSES, function="Addresses")
    return op


# Reports which ISA the variant was compiled for, so dispatch can be observed.
WHICH_ISA = r"""
#include "custom_aot_extra.h"
extern "C" int WhichIsa(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  float *y = static_cast<float *>(params[1]);
#if defined(__AVX512F__)
  y[0] = 512;
#elif defined(__AVX2__)
  y[0] = 2;
#elif defined(__SSE4_1__)
  y[0] = 41;
#else
  y[0] = 0;
#endif
  return 0;
}
"""


def encode_probe(values):
    """What attr_probe.cc writes for ``values`` (see the layout in its header comment)."""
    f32 = lambda v: float(np.float32(v))  # noqa: E731 - the kernel narrows to float
    row = [float(values["flag"]), float(values["width"]), f32(values["ratio"])]
    label = values["label"].encode("utf-8")
    row += [len(label), *label]
    row += [len(values["ints"]), *values["ints"]]
    row += [len(values["floats"]), *map(f32, values["floats"])]
    row += [len(values["grid"])]
    for r in values["grid"]:
        row += [len(r), *r]
    row += [len(values["table"])]
    for r in values["table"]:
        row += [len(r), *map(f32, r)]
    row += [1.0, 0.0, f32(values["width"])]  # HasAttr("flag"), HasAttr("no_such_attr"), Attr<float>("width")
    assert len(row) <= values["width"]
    row += [-1.0] * (values["width"] - len(row))
    return np.array([row, row], dtype=np.float64)


def fake_cuda_runtime(monkeypatch):
    """Point opforge's CUDA runtime at tests/kernels/fake_cudart.c (built with opforge.build).

    The fake backs device memory with host memory, so GPU plumbing (pool
    allocation, copies, the stream given to kernels, launch checks) runs
    without a GPU; it checks the calls opforge makes, not CUDA.  Returns the
    fake as a ctypes library with its hooks (``fake_cuda_calls(b"cudaMalloc")``,
    ``fake_cuda_last_stream()``, ``fake_cuda_inject_error(code, sticky)``, ...),
    counters reset.  opforge's loaded CUDA state is set aside for the test and
    put back when ``monkeypatch`` undoes its changes.
    """
    import ctypes
    import gc
    import pathlib

    from opforge.runtime import cuda

    gc.collect()  # device buffers earlier tests left in reference cycles are freed before the counts start
    library = opforge.build(pathlib.Path(__file__).parent / "kernels" / "fake_cudart.c")
    fake = ctypes.CDLL(str(library.path))
    fake.fake_cuda_calls.argtypes, fake.fake_cuda_calls.restype = [ctypes.c_char_p], ctypes.c_long
    fake.fake_cuda_last_stream.restype = ctypes.c_void_p
    for name in ("fake_cuda_live_device_blocks", "fake_cuda_live_host_blocks", "fake_cuda_bad_frees"):
        getattr(fake, name).restype = ctypes.c_long
    fake.fake_cuda_release_threshold.restype = fake.fake_cuda_pool_threshold.restype = ctypes.c_uint64
    fake.fake_cuda_pool_threshold.argtypes = fake.fake_cuda_pool_of.argtypes = [ctypes.c_void_p]
    fake.fake_cuda_pool_of.restype = fake.fake_cuda_default_pool.restype = ctypes.c_void_p
    fake.fake_cuda_log_size.restype = fake.fake_cuda_dead_stream_uses.restype = ctypes.c_long
    fake.fake_cuda_log_entry.argtypes = [ctypes.c_long, ctypes.POINTER(ctypes.c_char_p),
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_int)]
    fake.fake_cuda_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_int]
    fake.fake_cuda_reset()
    monkeypatch.setenv("OPFORGE_CUDART", str(library.path))
    # Fresh state for the fake; undo() puts back whatever was loaded before (the real runtime, or nothing).
    monkeypatch.setattr(cuda, "_runtime", None)
    for name in ("_pools", "_pinned_free", "_constants"):
        monkeypatch.setattr(cuda, name, {})
    monkeypatch.setattr(cuda, "_pinned_pending", [])
    return fake


def fake_cuda_log(fake, start=0):
    """The fake CUDA runtime's stream-ordered calls since its reset (from ``start``), as
    (name, stream, object, device) tuples: what each call acted on (see fake_cudart.c)."""
    import ctypes

    entries = []
    name, stream, target, device = ctypes.c_char_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    for i in range(start, fake.fake_cuda_log_size()):
        assert fake.fake_cuda_log_entry(i, ctypes.byref(name), ctypes.byref(stream), ctypes.byref(target),
                                        ctypes.byref(device)), "the fake's log keeps 4096 calls"
        entries.append((name.value.decode(), stream.value or 0, target.value or 0, device.value))
    return entries


def random_weights(model, seed=0):
    """One of onnx's light models with each ConstantOfShape replaced by a seeded random
    initializer: conv and dense weights (rank >= 2) uniform with the variance that keeps
    activations in scale (He), zero mean; vectors (biases, batch-norm scale, mean and
    variance) the fill times a factor in [0.5, 1.5].  The fills make the models' logits
    huge and almost equal, so their softmax turns rounding differences into different
    outputs; random weights give outputs that compare at a tolerance."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    initializers = {t.name: numpy_helper.to_array(t) for t in changed.graph.initializer}
    kept = []
    for node in changed.graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in initializers:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in initializers[node.input[0]])
        fill = numpy_helper.to_array(helper.get_attribute_value(node.attribute[0])).reshape(())
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else max(shape)
            value = rng.uniform(-1.0, 1.0, shape) * np.sqrt(6.0 / fan_in)
        else:
            value = fill * rng.uniform(0.5, 1.5, shape)
        changed.graph.initializer.append(numpy_helper.from_array(value.astype(fill.dtype), node.output[0]))
    del changed.graph.node[:]
    changed.graph.node.extend(kept)
    return changed


def assert_native(name, *arrays):
    """The op's native kernel takes these inputs (else a NumPy fallback would pass any test)."""
    from opforge import TensorSpec
    from opforge.operator import PyKernel
    from opforge.runtime.dispatch import select_kernel

    kernel = select_kernel(opforge.lookup(name), [TensorSpec(a.shape, str(a.dtype)) for a in arrays])
    assert not isinstance(kernel, PyKernel), f"{name} ran {kernel}"


def run_without_compiler(tmp_path, code, **settings):
    """Run ``code`` in a child with no way to find a compiler and an empty cache (and no other OPFORGE_
    variable); (the finished process, the cache folder).  ``settings``: more environment variables (the
    child's environment is fixed before opforge reads it); an OPFORGE_CC/OPFORGE_CXX there is the child's
    compiler.  The child's tests/ is on sys.path; ``BUILDS`` lists the sources it tried to build."""
    cache = tmp_path / "cache"
    empty_bin = tmp_path / "bin"
    cache.mkdir()
    empty_bin.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPFORGE_")}
    env.update(CC=str(tmp_path / "no-cc"), CXX=str(tmp_path / "no-c++"), PATH=str(empty_bin),
               OPFORGE_CACHE_DIR=str(cache), HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.update(settings)
    blocked = [language for language, variable in (("c", "OPFORGE_CC"), ("c++", "OPFORGE_CXX"))
               if not os.access(settings.get(variable, ""), os.X_OK)]
    prologue = textwrap.dedent(f"""\
        import json, sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})  # helpers
        import numpy as np
        import opforge
        from opforge.runtime import build as _build
        from opforge.runtime.compilers import find_compiler
        for language in {blocked!r}:
            try:
                find_compiler(language)
            except opforge.CompilerNotFoundError:
                pass
            else:
                raise SystemExit(f"a {{language}} compiler is still reachable")
        BUILDS = []
        _real_build = _build.build
        def _counting_build(*args, **kwargs):
            BUILDS.append(str(args[0]))
            return _real_build(*args, **kwargs)
        _build.build = _counting_build
        """)
    done = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    return done, cache


#: How far apart two correct float32 implementations may put a logit made by a long sum (a conv over
#: thousands of channels, a gemm), relative to the logits' magnitude: the sums are added in other orders.
#: (Measured: 8e-7 on squeezenet's last conv; this leaves room.)
LOGIT_ROUNDING = 1e-5


def logits_exposed(model):
    """A copy of an ONNX classifier whose final Softmax's input (its logits) is a second graph output;
    the model itself when it does not end in a Softmax."""
    import onnx
    from onnx import helper

    last = model.graph.node[-1]
    if last.op_type != "Softmax":
        return model
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.append(helper.make_empty_tensor_value_info(last.input[0]))
    return exposed


def assert_softmax_close(ours, theirs, our_logits, their_logits, *, rtol, atol):
    """A classifier's softmax output against a reference's, given the logits each was computed from.

    The logits must agree at rtol / atol (each relative to its own magnitude).  The probabilities then
    agree too only where rounding cannot move them: logits that differ by LOGIT_ROUNDING of their
    magnitude change a probability by a factor of up to exp(2 * that).  onnx's light models filled with
    constant weights have logits of 1e9 to 1e31 (squeezenet's: 9.5e9), which two correct runs put
    thousands apart: their softmax is a coin toss between tied classes, and comparing it tests nothing.
    There the test checks instead that our probabilities are the softmax of our own logits (so the
    Softmax is right, and the logits were checked above).  Whether the probabilities were compared."""
    np.testing.assert_allclose(our_logits, their_logits, rtol=rtol, atol=atol, err_msg="logits")
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    if 2 * LOGIT_ROUNDING * float(np.abs(their_logits).max()) <= rtol:
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, err_msg="probabilities")
        return True
    # ONNX's Softmax before opset 13 (these models'): over all dims after the first, as one row each
    z = our_logits.astype(np.float64).reshape(len(our_logits), -1)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ours.reshape(p.shape), p, rtol=1e-4, atol=1e-7, err_msg="softmax of our logits")
    return False
