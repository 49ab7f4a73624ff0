"""The built-in ops' CUDA kernels (builtins/*.cu).

Three layers, by what the machine has:

* always: the declarations (which ops have a GPU kernel, for which dtypes,
  not in the prebuilt set), host arrays never dispatched to them, and the
  kernels' own checks of bad input, which return before touching memory;
* nvcc (CI's image has it): every GPU kernel builds and loads -- one nvcc
  build per .cu file;
* a CUDA device: every op on device arrays against its NumPy reference.
  Arrays are CUDA torch tensors, else CuPy arrays, else this module's own
  minimal DLPack arrays in cudaMalloc'd memory.
"""
import concurrent.futures
import ctypes
import sys

import numpy as np
import pytest

import opforge
from opforge import TensorSpec, _native
from opforge.builtins import common
from opforge.registry import registered_ops
from opforge.runtime import cuda, prebuilt
from opforge.runtime.compilers import CompilerNotFoundError, find_compiler
from opforge.runtime.dispatch import kernel_error, select_kernel

ops = opforge.ops
GPU_OPS = {  # op -> the .cu file and function of its GPU kernel, and the dtypes it takes
    "add": ("elementwise.cu", "AddGpu", common.GPU_NUMERIC),
    "sub": ("elementwise.cu", "SubGpu", common.GPU_NUMERIC),
    "mul": ("elementwise.cu", "MulGpu", common.GPU_NUMERIC),
    "div": ("elementwise.cu", "DivGpu", common.GPU_FLOATS),
    "maximum": ("elementwise.cu", "MaximumGpu", common.GPU_NUMERIC),
    "minimum": ("elementwise.cu", "MinimumGpu", common.GPU_NUMERIC),
    "neg": ("elementwise.cu", "NegGpu", common.GPU_NUMERIC),
    "abs": ("elementwise.cu", "AbsGpu", common.GPU_NUMERIC),
    "sqrt": ("elementwise.cu", "SqrtGpu", common.GPU_FLOATS),
    "log": ("elementwise.cu", "LogGpu", common.GPU_FLOATS),
    "relu": ("elementwise.cu", "ReluGpu", common.GPU_NUMERIC),
    "leaky_relu": ("elementwise.cu", "LeakyReluGpu", common.GPU_FLOATS),
    "exp": ("elementwise.cu", "ExpGpu", common.GPU_FLOATS),
    "tanh": ("elementwise.cu", "TanhGpu", common.GPU_FLOATS),
    "sigmoid": ("elementwise.cu", "SigmoidGpu", common.GPU_FLOATS),
    "softmax": ("softmax.cu", "SoftmaxGpu", common.GPU_FLOATS),
    "reduce_sum": ("reduce_sum.cu", "ReduceSumGpu", common.GPU_NUMERIC),
    "transpose": ("transpose.cu", "TransposeGpu", None),  # any dtype: elements are moved by size
    "matmul": ("matmul.cu", "MatMulGpu", common.FLOATS),
}


def gpu_kernel(name):
    (kernel,) = [k for k in opforge.lookup(name).kernels if k.device == "gpu"]
    return kernel


def all_gpu_kernels():
    """The built-in ops' GPU kernels (ops other tests register have a namespace, and may be left registered)."""
    return [(op, k) for op in registered_ops() if "::" not in op.name for k in op.kernels if k.device == "gpu"]


# -- declarations ---------------------------------------------------------------
def test_each_gpu_builtin_has_one_cuda_kernel_from_its_source():
    for name, (file, function, dtypes) in GPU_OPS.items():
        kernel = gpu_kernel(name)
        assert kernel.path.name == file and kernel.path.parent.name == "builtins", name
        assert kernel.path.exists(), kernel.path
        assert kernel.function_name == function
        if dtypes is None:
            assert kernel.dtypes is None
        else:
            arity = len(opforge.lookup(name).inputs)
            assert kernel.dtypes == [(d,) * arity for d in dtypes], name


def test_gpu_kernels_are_not_prebuilt():
    for _, kernel in all_gpu_kernels():
        assert kernel.builtin
        assert prebuilt.kernel_key(kernel) is None, kernel.name
    assert not [k for _, k in prebuilt.builtin_kernels() if k.device != "cpu"]


@pytest.mark.parametrize("name, args, attrs", [
    ("add", [np.ones((2, 3), np.float32), np.ones(3, np.float32)], {}),
    ("relu", [np.array([-1, 2], np.int64)], {}),
    ("relu", [np.array([-1, np.nan, 2], np.float16)], {}),  # no CPU kernel takes float16: the reference runs
    ("softmax", [np.ones((2, 3), np.float16)], {"axis": -1}),
    ("matmul", [np.ones((2, 3), np.float64), np.ones((3, 2), np.float64)], {}),
    ("transpose", [np.ones((2, 3), np.bool_)], {"perm": []}),
])
def test_host_arrays_never_go_to_a_gpu_kernel(name, args, attrs):
    op = opforge.lookup(name)
    specs = [TensorSpec(a.shape, a.dtype.name) for a in args]
    assert select_kernel(op, specs).device == "cpu"
    got = getattr(ops, name)(*args, **attrs)  # a GPU kernel here would need a device (none, or the wrong memory)
    want = op.reference_kernel.fn(*args, **{**attrs})
    np.testing.assert_allclose(got, want, rtol=1e-3)


# -- the kernels' checks, before any launch ----------------------------------------
@pytest.fixture(scope="module")
def built():
    """Every GPU kernel loaded (built with nvcc, in parallel: one build per .cu file)."""
    if not cuda_toolkit_nvcc():
        pytest.skip("nvcc is not installed: the GPU kernels cannot be compiled here")
    kernels = [k for _, k in all_gpu_kernels()]
    with concurrent.futures.ThreadPoolExecutor(len(kernels)) as pool:
        list(pool.map(lambda k: k.load(), kernels))
    return {k.function_name: k for k in kernels}


def cuda_toolkit_nvcc():
    """Whether opforge finds nvcc (on PATH, $OPFORGE_NVCC or $CUDA_HOME/bin)."""
    try:
        return bool(find_compiler("cuda"))
    except CompilerNotFoundError:
        return False


def test_every_gpu_kernel_builds_and_loads(built):
    assert set(built) == {function for _, function, _ in GPU_OPS.values()}
    libraries = {}
    for function, kernel in built.items():
        assert kernel.library is not None and kernel._function, function
        libraries.setdefault(kernel.path.name, set()).add(str(kernel.library.path))
    assert all(len(paths) == 1 for paths in libraries.values()), libraries  # one library per .cu file
    assert len(libraries) == 5


def call(kernel, shapes, dtypes, extra=None):
    """The kernel called directly on null pointers: only for inputs it must refuse before launching."""
    pointers = [0] * len(shapes)
    return _native.call_kernel(kernel._function, pointers, shapes, dtypes, 0, extra)


def extra_for(kernel, op_name, attrs):
    return _native.Extra(op_name, attrs, kernel.library.cxx11_abi)


@pytest.mark.parametrize("function, shapes, dtypes, code", [
    ("AddGpu", [(3,), (3,), (3,)], ["float32", "float64", "float32"], 1),  # mixed dtypes
    ("AddGpu", [(3,), (3,), (3,)], ["bool", "bool", "bool"], 3),  # a dtype it was not declared for
    ("AddGpu", [(2, 3), (2, 3), (3,)], ["float32"] * 3, 4),  # an input of higher rank than y
    ("ReluGpu", [(3,), (3,)], ["float32", "int32"], 1),
    ("ReluGpu", [(3,), (4,)], ["float32", "float32"], 2),
    ("ExpGpu", [(3,), (3,)], ["int32", "int32"], 3),  # exp has no integer variant
    ("MatMulGpu", [(2, 3), (2, 3), (2, 3)], ["float32"] * 3, 2),  # k differs
    ("MatMulGpu", [(2, 3), (3, 2), (2, 2)], ["float16"] * 3, 6),
])
def test_gpu_kernels_refuse_bad_input_with_a_code(built, function, shapes, dtypes, code):
    rc, error = call(built[function], shapes, dtypes)
    assert (rc, error) == (code, None)


def test_attribute_checks_return_codes(built):
    rc, error = call(built["SoftmaxGpu"], [(2, 3), (2, 3)], ["float32"] * 2,
                     extra_for(built["SoftmaxGpu"], "softmax", {"axis": 2}))
    assert (rc, error) == (2, None)
    rc, error = call(built["ReduceSumGpu"], [(2, 3), (2,)], ["float32"] * 2,
                     extra_for(built["ReduceSumGpu"], "reduce_sum", {"axes": [1, -1], "keep_dims": False}))
    assert (rc, error) == (2, None)  # the same axis twice
    rc, error = call(built["ReduceSumGpu"], [(2, 3), (2, 1)], ["float32"] * 2,
                     extra_for(built["ReduceSumGpu"], "reduce_sum", {"axes": [1], "keep_dims": False}))
    assert (rc, error) == (3, None)  # y's rank disagrees with keep_dims
    rc, error = call(built["TransposeGpu"], [(2, 3), (3, 2)], ["float32"] * 2,
                     extra_for(built["TransposeGpu"], "transpose", {"perm": [0, 0]}))
    assert (rc, error) == (2, None)


@pytest.mark.skipif(cuda.device_count() > 0, reason="with a device, cuBLAS may load and then gemm would run")
def test_matmul_without_cublas_is_a_kernel_error_that_says_so(built):
    kernel = built["MatMulGpu"]
    rc, error = call(kernel, [(2, 3), (3, 2), (2, 2)], ["float32"] * 3)
    assert error is not None and "cuBLAS" in error[1]  # not found, or found with no device to run on
    raised = kernel_error(opforge.lookup("matmul"), kernel, rc, error)
    assert isinstance(raised, opforge.KernelError)
    assert "op 'matmul'" in str(raised) and "MatMulGpu" in str(raised) and "cuBLAS" in str(raised)


# -- on a device ------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(cuda.device_count() == 0,
                               reason="no CUDA device (opforge.runtime.cuda.device_count() == 0): the GPU kernels "
                                      "are compiled and checked above, not run")


def torch_cuda():
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return None
    return torch if torch.cuda.is_available() else None


def cupy_module():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


class RawCudaArray:
    """A minimal CUDA array library: cudaMalloc'd memory, shared through DLPack."""

    def __init__(self, pointer, shape, dtype, owner=None):
        self.pointer, self.shape, self.dtype, self.owner = pointer, tuple(shape), np.dtype(dtype), owner

    @classmethod
    def from_numpy(cls, array):
        array = np.ascontiguousarray(array)
        lib = cuda.runtime()
        pointer = ctypes.c_void_p()
        assert lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(max(array.nbytes, 1))) == 0
        assert lib.cudaMemcpy(pointer, ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), 1) == 0
        return cls(pointer.value, array.shape, array.dtype)

    def __del__(self):
        if self.owner is None and self.pointer:
            cuda.runtime().cudaFree(ctypes.c_void_p(self.pointer))

    def numpy(self):
        out = np.empty(self.shape, self.dtype)
        lib = cuda.runtime()
        assert lib.cudaDeviceSynchronize() == 0
        assert lib.cudaMemcpy(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(self.pointer),
                              ctypes.c_size_t(out.nbytes), 2) == 0
        return out

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        export = _native.DLPackExport(self.pointer, self.shape, self.dtype.name, 2, 0, self)
        return export.__dlpack__(max_version=max_version)


def from_dlpack(exported):
    """This module as RawCudaArray's library: opforge hands outputs back through it."""
    view = _native.DLTensorView(exported.__dlpack__(max_version=(1, 0)))
    assert view.device[0] == 2
    return RawCudaArray(view.data, view.shape, view.dtype, owner=view)


RawCudaArray.__module__ = __name__  # (the kind is found by the array type's module)


def on_device(array):
    torch = torch_cuda()
    if torch is not None:
        return torch.from_numpy(np.ascontiguousarray(array)).cuda()
    cupy = cupy_module()
    if cupy is not None:
        return cupy.asarray(array)
    return RawCudaArray.from_numpy(array)


def to_host(value):
    assert value.__dlpack_device__()[0] == 2, "the output is not on the GPU"
    if hasattr(value, "cpu"):
        return value.cpu().numpy()
    if hasattr(value, "get"):
        return value.get()
    return value.numpy()


def tolerance(dtype):
    return {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=1e-5, atol=1e-6),
            "float64": dict(rtol=1e-12, atol=1e-12)}.get(np.dtype(dtype).name, dict(rtol=0, atol=0))


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) > 0.5
    return rng.standard_normal(shape).astype(dtype)


def check_on_gpu(name, arrays, **attrs):
    op = opforge.lookup(name)
    with np.errstate(all="ignore"):  # NaN from log(-1), overflow to inf: as on the GPU
        if any(a.dtype == np.float16 for a in arrays):  # the kernels compute float16 in float: so does the reference
            wide = [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays]
            want = op.reference_kernel.fn(*wide, **attrs).astype(np.float16)
        else:
            want = op.reference_kernel.fn(*arrays, **attrs)
    got = getattr(ops, name)(*[on_device(a) for a in arrays], **attrs)
    got = to_host(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), equal_nan=True,
                               **tolerance(want.dtype), err_msg=f"{name} {[a.shape for a in arrays]} {attrs}")


@needs_gpu
def test_calls_after_the_first_run_in_c_on_the_gpu_with_the_same_results():
    """The remembered route (runtime.device_call, _native.DeviceRoutes) on real device memory and a real
    launch; RawCudaArray, so that no framework bridge takes the calls first."""
    add = opforge.lookup("add")
    a, b = sample((3, 5), "float32", 1), sample((3, 5), "float32", 2)
    da, db = RawCudaArray.from_numpy(a), RawCudaArray.from_numpy(b)
    routes = opforge.runtime.dispatch.launcher_for(add, add.resolve_attrs({}), 2).planner.device_routes
    before = routes.stats["hits"]
    results = [add(da, db) for _ in range(3)]
    assert routes.stats["hits"] - before >= 2
    for result in results:
        np.testing.assert_array_equal(result.numpy(), a + b)


@needs_gpu
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum"])
@pytest.mark.parametrize("dtype", common.GPU_NUMERIC)
@pytest.mark.parametrize("shapes", [
    [(4,), (4,)],
    [(1 << 20) + 3, (1 << 20) + 3],  # the 16-byte path and its tail
    [(3, 1, 5), (4, 5)],  # broadcast on both sides
    [(2, 3, 4), ()],  # a scalar
    [(), (2, 3, 4)],
    [(2, 1, 3, 1, 2), (1, 4, 3, 5, 1)],
])
def test_binary_ops_on_gpu(name, dtype, shapes):
    if dtype not in GPU_OPS[name][2]:
        pytest.skip(f"{name} has no {dtype} kernel")
    a = sample(shapes[0] if isinstance(shapes[0], tuple) else (shapes[0],), dtype, 1)
    b = sample(shapes[1] if isinstance(shapes[1], tuple) else (shapes[1],), dtype, 2)
    if dtype.startswith("float") and a.size > 2 and b.size > 2:
        a.flat[0], b.flat[1] = np.nan, np.nan  # NaN on either side (maximum and minimum propagate it)
    check_on_gpu(name, [a, b])


@needs_gpu
@pytest.mark.parametrize("name, attrs", [("neg", {}), ("abs", {}), ("relu", {}), ("leaky_relu", {"alpha": 0.25}),
                                         ("exp", {}), ("log", {}), ("sqrt", {}), ("tanh", {}), ("sigmoid", {})])
@pytest.mark.parametrize("dtype", common.GPU_NUMERIC)
@pytest.mark.parametrize("size", [1, 7, 4099])
def test_unary_ops_on_gpu(name, attrs, dtype, size):
    # (alpha 0.25: exact in float32, the type alpha crosses the ABI in, so float64 matches the reference exactly)
    if dtype not in GPU_OPS[name][2]:
        pytest.skip(f"{name} has no {dtype} kernel")
    x = sample((size,), dtype)
    if name in ("log", "sqrt"):
        x = np.abs(x) + np.linspace(0.5, 2, size).astype(dtype)  # positive, and many values near 1 for log
        x[-1] = -1  # NaN from both
    if dtype.startswith("float") and size > 1:
        x[0] = np.nan
    check_on_gpu(name, [x], **attrs)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exp_tanh_log_sigmoid_stay_accurate_over_their_range(dtype):
    # nvcc compiles with --use_fast_math; these must not be its approximate intrinsics
    x = np.concatenate([np.linspace(-80, 80, 20001), np.linspace(-1e-3, 1e-3, 2001)]).astype(dtype)
    for name in ("exp", "tanh", "sigmoid"):
        check_on_gpu(name, [x])
    check_on_gpu("log", [np.abs(x) + np.asarray(1e-30, dtype)])


@needs_gpu
def test_unary_on_an_unaligned_view():
    torch = torch_cuda()
    if torch is None:
        pytest.skip("needs CUDA torch for an offset view of device memory")
    x = torch.randn(1001, device="cuda")[1:]  # 4 bytes past an aligned start: the element-by-element path
    np.testing.assert_allclose(to_host(ops.relu(x)), np.maximum(x.cpu().numpy(), 0))


@needs_gpu
@pytest.mark.parametrize("dtype", common.GPU_FLOATS)
@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((4, 1000), 1), ((5, 3), 0), ((2, 3, 4), 1), ((7,), 0),
                                         ((3, 128), -1), ((2, 5000, 3), 1)])
def test_softmax_on_gpu(dtype, shape, axis):
    check_on_gpu("softmax", [sample(shape, dtype) * 3], axis=axis)


@needs_gpu
@pytest.mark.parametrize("dtype", common.GPU_NUMERIC)
@pytest.mark.parametrize("shape, axes, keep_dims", [
    ((5, 3), [], False), ((5, 3), [0], False), ((5, 3), [-1], True), ((2, 3, 4), [0, 2], False),
    ((4096, 3), [0], True), ((3, 5000), [1], False), ((2, 1, 3), [1], False)])
def test_reduce_sum_on_gpu(dtype, shape, axes, keep_dims):
    x = sample(shape, dtype)
    if dtype == "float16":
        x = (x * 0.1).astype(dtype)  # keep long float16 sums representable
    check_on_gpu("reduce_sum", [x], axes=axes, keep_dims=keep_dims)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "bool"])
@pytest.mark.parametrize("shape, perm", [((5, 7), []), ((3, 33, 65), []), ((2, 3, 4), [2, 0, 1]),
                                         ((2, 3, 4, 5), [0, 2, 1, 3]), ((1, 4, 1), [2, 1, 0]), ((6,), [0])])
def test_transpose_on_gpu(dtype, shape, perm):
    check_on_gpu("transpose", [sample(shape, dtype)], perm=perm)


@needs_gpu
@pytest.mark.parametrize("dtype", common.FLOATS)
@pytest.mark.parametrize("shapes", [[(4, 5), (5, 3)], [(2, 3, 4, 5), (2, 3, 5, 6)], [(3, 4, 5), (1, 5, 6)],
                                    [(1, 4, 5), (3, 5, 6)], [(2, 1, 4, 5), (1, 3, 5, 6)]])
def test_matmul_on_gpu_through_cublas(dtype, shapes):
    a, b = sample(shapes[0], dtype, 1), sample(shapes[1], dtype, 2)
    try:
        got = to_host(ops.matmul(on_device(a), on_device(b)))
    except opforge.KernelError as error:
        if "cuBLAS was not found" in str(error):
            pytest.skip(f"no cuBLAS on this machine: {error}")
        raise
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4 if dtype == "float32" else 1e-10, atol=1e-5)


# -- the cuBLAS loader ------------------------------------------------------------
def test_cublas_is_found_in_an_nvidia_wheel(tmp_path, monkeypatch):
    from opforge.runtime import cublas

    folder = tmp_path / "nvidia" / "cublas" / "lib"
    folder.mkdir(parents=True)
    for name in ("libcublas.so.12", "libcublasLt.so.12"):
        (folder / name).write_bytes(b"not a library")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path)])
    assert cublas.wheel_library() == str(folder / "libcublas.so.12")
    # A library that does not load is left to the kernel, which reports what it searched.
    monkeypatch.setattr(cublas, "_done", False)
    monkeypatch.setattr(cublas, "_handle", None)
    monkeypatch.delenv("OPFORGE_CUBLAS", raising=False)
    assert cublas.prepare() is None and cublas.preload() is None and cublas._done
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere")])
    assert cublas.wheel_library() is None


def test_a_preloaded_wheel_library_is_found_by_soname_and_stays_out_of_the_global_scope(tmp_path, monkeypatch):
    import subprocess

    from opforge.runtime import cublas

    folder = tmp_path / "nvidia" / "cublas" / "lib"
    folder.mkdir(parents=True)
    source = tmp_path / "probe.c"
    source.write_text("int opforge_cublas_probe(void) { return 7; }\n")
    subprocess.run([find_compiler("c"), "-shared", "-fPIC", "-Wl,-soname,libcublas.so.99", "-o",
                    str(folder / "libcublas.so.99"), str(source)], check=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(cublas, "_done", False)
    monkeypatch.setattr(cublas, "_handle", None)
    monkeypatch.delenv("OPFORGE_CUBLAS", raising=False)
    assert cublas.preload() is not None
    assert ctypes.CDLL("libcublas.so.99").opforge_cublas_probe() == 7  # what the kernel's dlopen by soname gets
    with pytest.raises(AttributeError):  # not global: later libraries' symbols keep binding where they did
        ctypes.CDLL(None).opforge_cublas_probe


def test_gpu_matmul_asks_for_cublas_but_is_never_skipped_for_it():
    from opforge.runtime import cublas

    kernel = gpu_kernel("matmul")
    assert kernel.requires is cublas.prepare
    specs = [TensorSpec((2, 3), "float32"), TensorSpec((3, 4), "float32")]
    assert kernel.reject_reason(opforge.lookup("matmul"), specs) is None  # a missing cuBLAS is the kernel's error
