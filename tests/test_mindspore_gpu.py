"""MindSpore-style GPU ops: which device a Custom op's kernel runs on, and what it is given.

A Custom op is a GPU op with a ``.cu`` source, a GPU registration, or no
registration after ``set_context(device_target="GPU")`` (prebuilt libraries
included: MindSpore's own way to run a GPU kernel).  The device choice and the
pointers a kernel gets are checked on the fake CUDA runtime
(tests/kernels/fake_cudart.c, whose device memory is host memory), so they run
in CI; the tests marked ``needs_gpu`` run the seed's CUDA kernel on a real GPU
and skip without one.  The Python blocks of docs/gpu.md run here too.
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge
import opforge.compat.mindspore as ms
import opforge.compat.mindspore.ops as ops
from opforge import _native
from opforge.compat.mindspore import Tensor
from opforge.compat.mindspore.ops import CustomRegOp, DataType
from opforge.runtime import cuda

from helpers import fake_cuda_log, fake_cuda_runtime

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SEED_CU = EXAMPLES / "aot" / "add_mul_div.cu"
CUDA_DEVICE, HOST_DEVICE = 2, 1

needs_gpu = pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA device (opforge.cuda.device_count() == 0): "
                               "the fake-runtime tests cover the device choice and the pointers kernels get")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (a .cu source needs it)")

# For the fake runtime a "GPU" kernel is a host function: its pointers are the fake's host-backed device memory.
# y = a + b, and p records the three pointers the kernel was given.
RECORDING_KERNEL = r"""
#include <stdint.h>
extern "C" int AddRecording(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 4) return 1;
  const float *a = static_cast<const float *>(params[0]), *b = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
  int64_t *p = static_cast<int64_t *>(params[3]);
  for (int k = 0; k < 3; k++) p[k] = reinterpret_cast<intptr_t>(params[k]);
  return 0;
}
"""


def out_shape(a, b):
    return (a, [3])


OUT_DTYPE = (ms.float32, ms.int64)


@pytest.fixture
def context():
    """Each test starts on MindSpore's default device_target, CPU, and leaves it there."""
    saved = dict(ms.context._settings)
    ms.set_context(device_target="CPU")
    yield ms
    ms.context._settings.clear()
    ms.context._settings.update(saved)


@pytest.fixture(scope="module")
def kernel_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("ms-gpu") / "recording.cc"
    path.write_text(RECORDING_KERNEL)
    return path


@pytest.fixture(scope="module")
def prebuilt(kernel_source):
    """The kernel compiled beforehand: MindSpore's prebuilt-library pattern, ``"lib.so:Func"``."""
    library = opforge.build(kernel_source)
    assert library.path.suffix == ".so"
    return library.path


def registration(target):
    info = CustomRegOp().input(0, "a").input(1, "b").output(0, "y").output(1, "p") \
        .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default, DataType.I64_Default)
    return (info if target is None else info.target(target)).get_op_info()


def recording_op(path, reg_info=None):
    return ops.Custom(f"{path}:AddRecording", out_shape, OUT_DTYPE, "aot", reg_info=reg_info)


# -- which device: the three GPU cases, and CPU otherwise ------------------------------------------
def test_a_gpu_registration_is_a_gpu_op_whatever_the_context(context, kernel_source, prebuilt):
    for target in ("CPU", "GPU"):
        context.set_context(device_target=target)
        assert recording_op(kernel_source, registration("GPU")).aot_kernel.device == "gpu"
        assert recording_op(prebuilt, registration("GPU")).aot_kernel.device == "gpu"
        assert recording_op(kernel_source, registration("CPU")).aot_kernel.device == "cpu"


def test_no_registration_runs_on_the_context_device_target(context, kernel_source, prebuilt):
    for path in (prebuilt, kernel_source):
        assert recording_op(path).aot_kernel.device == "cpu"
    context.set_context(device_target="GPU")
    for path in (prebuilt, kernel_source):
        assert recording_op(path).aot_kernel.device == "gpu"  # MindSpore's reg_info=None GPU call
        assert recording_op(path, registration(None)).aot_kernel.device == "gpu"  # a registration naming no target
    context.set_context(device_target="CPU")
    cpu_op = recording_op(prebuilt)
    context.set_device("GPU")
    assert cpu_op.aot_kernel.device == "cpu"  # the context is read when the op is made, as in MindSpore
    assert recording_op(prebuilt).aot_kernel.device == "gpu"


def test_a_list_of_registrations_takes_the_context_target(context, prebuilt):
    both = [CustomRegOp().input(0, "a").input(1, "b").output(0, "y").output(1, "p").target(t) for t in ("CPU", "GPU")]
    assert recording_op(prebuilt, both).aot_kernel.device == "cpu"
    context.set_context(device_target="GPU")
    assert recording_op(prebuilt, both).aot_kernel.device == "gpu"
    assert recording_op(prebuilt, both[:1]).aot_kernel.device == "cpu"  # only a CPU one: that one


@needs_nvcc
def test_a_cu_source_is_a_gpu_op_without_registration_or_context(context):
    op = ops.Custom(f"{SEED_CU}:CustomAddMulDiv", ([3], [3], [3]), (ms.float32,) * 3, "aot")
    assert ms.get_context("device_target") == "CPU"
    assert op.aot_kernel.device == "gpu"


def test_a_cpu_op_runs_its_kernel_on_the_arrays_own_memory(context, prebuilt):
    a, b = np.arange(5, dtype=np.float32), np.full(5, 2.0, np.float32)
    y, p = recording_op(prebuilt)(a, b)
    np.testing.assert_array_equal(y, a + b)
    assert p[:2].tolist() == [a.ctypes.data, b.ctypes.data] and p[2] == y.ctypes.data


# -- what a GPU kernel is given (fake CUDA runtime) ------------------------------------------------
@pytest.fixture
def fake(monkeypatch):
    return fake_cuda_runtime(monkeypatch)


def calls(fake, name):
    count = fake.fake_cuda_calls(name.encode())
    assert count >= 0, name
    return count


def _pointer_type(pointer):
    """cudaPointerAttributes.type: 2 for device memory (the fake's pool blocks), 1 for pinned host memory."""
    class Attributes(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("device_pointer", ctypes.c_void_p),
                    ("host_pointer", ctypes.c_void_p)]

    attributes = Attributes()
    assert cuda.runtime().cudaPointerGetAttributes(ctypes.byref(attributes), pointer) == 0
    return attributes.type


@pytest.mark.parametrize("how", ["prebuilt, no registration, GPU context", "source, GPU registration"])
def test_host_arrays_reach_a_gpu_kernel_as_device_copies(fake, context, kernel_source, prebuilt, how):
    if how.startswith("prebuilt"):
        context.set_context(device_target="GPU")
        op = recording_op(prebuilt)
    else:
        op = recording_op(kernel_source, registration("GPU"))
    a, b = np.arange(1000, dtype=np.float32), np.linspace(0, 1, 1000, dtype=np.float32)
    y, p = op(a, b)
    np.testing.assert_array_equal(y, a + b)
    given = p.tolist()
    assert a.ctypes.data not in given and b.ctypes.data not in given and y.ctypes.data not in given
    assert calls(fake, "cudaMallocFromPoolAsync") == 4  # 2 inputs in, 2 outputs out
    assert calls(fake, "cudaMemcpyAsync") == 4
    assert calls(fake, "cudaHostAlloc") == 4  # staged through pinned buffers
    assert fake.fake_cuda_live_device_blocks() == 0  # the device copies went back to the pool
    assert calls(fake, "cudaMalloc") == calls(fake, "cudaDeviceSynchronize") == 0


def test_the_kernel_sees_pool_pointers_while_it_runs(fake, context, prebuilt):
    """The pointers the kernel got were the fake's device blocks (checked while they are still live)."""
    context.set_context(device_target="GPU")
    op = recording_op(prebuilt)
    seen = []
    real_release = cuda.DeviceBuffer.release

    def release(buffer):
        if buffer.pointer:
            seen.append((buffer.pointer, _pointer_type(buffer.pointer)))
        real_release(buffer)

    cuda.DeviceBuffer.release = release
    try:
        x = np.ones(16, np.float32)
        _, p = op(x, x)
    finally:
        cuda.DeviceBuffer.release = real_release
    device_blocks = {pointer for pointer, kind in seen if kind == 2}
    assert set(p.tolist()) <= device_blocks and len(set(p.tolist())) == 3


def device_array(values, stream=0):
    """A float32 array in (fake) device memory, as DLPack sees a CUDA array."""
    values = np.ascontiguousarray(values, np.float32)
    buffer = cuda.allocate(values.nbytes, stream)
    ctypes.memmove(buffer.pointer, values.ctypes.data, values.nbytes)
    return _native.DLPackExport(buffer.pointer, values.shape, "float32", CUDA_DEVICE, 0, buffer), buffer.pointer


def read_back(export, dtype):
    view = _native.DLTensorView(export.__dlpack__())
    assert view.device == (CUDA_DEVICE, 0)
    return np.frombuffer(ctypes.string_at(view.data, view.nbytes), dtype).reshape(view.shape), view.data


def test_device_arrays_reach_a_gpu_kernel_unchanged(fake, context, prebuilt):
    context.set_context(device_target="GPU")
    op = recording_op(prebuilt)
    (a, a_pointer), (b, b_pointer) = device_array(np.arange(6)), device_array(np.full(6, 0.5))
    fake.fake_cuda_reset()
    with opforge.cuda.stream(0x4321):
        y, p = op(a, b)
    y_values, y_pointer = read_back(y, np.float32)
    p_values, _ = read_back(p, np.int64)
    np.testing.assert_array_equal(y_values, np.arange(6) + 0.5)
    assert p_values.tolist() == [a_pointer, b_pointer, y_pointer]  # the inputs' own device memory, no copies
    assert calls(fake, "cudaMemcpyAsync") == calls(fake, "cudaHostAlloc") == 0
    allocations = [entry for entry in fake_cuda_log(fake) if entry[0] == "cudaMallocFromPoolAsync"]
    assert [stream for _, stream, _, _ in allocations] == [0x4321, 0x4321]  # the outputs, on the call's stream
    assert calls(fake, "cudaStreamSynchronize") == calls(fake, "cudaDeviceSynchronize") == 0


def test_a_cpu_op_refuses_device_arrays(fake, context, prebuilt):
    op = recording_op(prebuilt)
    assert op.aot_kernel.device == "cpu"
    (a, _), (b, _) = device_array(np.ones(3)), device_array(np.ones(3))
    with pytest.raises(opforge.DeviceError, match="no gpu kernel"):
        op(a, b)


# -- a real GPU ---------------------------------------------------------------------------------------
def run_python(args, cwd=ROOT):
    done = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=dict(os.environ), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def seed_library():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    return opforge.build(SEED_CU).path


@needs_gpu
def test_the_gpu_seed_prints_three_threes():
    assert run_python([EXAMPLES / "seed_add_mul_div.py", "--gpu"]) == "[3. 3. 3.]\n"


@needs_gpu
def test_the_prebuilt_library_pattern_on_a_gpu(context, seed_library):
    context.set_context(device_target="GPU")
    program = ops.Custom(f"{seed_library}:CustomAddMulDiv", lambda x, y: (x, x, x), (ms.float32,) * 3, "aot")
    assert program.aot_kernel.device == "gpu"
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5000).astype(np.float32)
    y = rng.uniform(0.5, 2.0, 5000).astype(np.float32)
    added, multiplied, divided = program(Tensor(x), Tensor(y))
    np.testing.assert_array_equal(added, x + y)
    np.testing.assert_array_equal(multiplied, x * y)
    np.testing.assert_allclose(divided, x / y, rtol=1e-6)
    ones = Tensor(np.ones(3, np.float32))
    first = ops.Custom(f"{seed_library}:CustomAddMulDiv", ([3], [3], [3]), (ms.float32,) * 3, "aot")(ones, ones)
    assert str(ops.Mul()(ops.Add()(first[0], first[1]), first[2])) == "[3. 3. 3.]"


def real_device_array(values):
    values = np.ascontiguousarray(values, np.float32)
    buffer = cuda.allocate(values.nbytes, 0)
    assert cuda.runtime().cudaMemcpyAsync(buffer.pointer, values.ctypes.data, values.nbytes, 1, 0) == 0
    return _native.DLPackExport(buffer.pointer, values.shape, "float32", CUDA_DEVICE, 0, buffer)


def real_read_back(export):
    view = _native.DLTensorView(export.__dlpack__())
    out = np.empty(view.shape, np.float32)
    assert cuda.runtime().cudaMemcpyAsync(out.ctypes.data, view.data, view.nbytes, 2, 0) == 0
    opforge.cuda.synchronize(0)
    return out


@needs_gpu
def test_the_seed_kernel_on_device_arrays(context, seed_library):
    context.set_context(device_target="GPU")
    program = ops.Custom(f"{seed_library}:CustomAddMulDiv", lambda x, y: (x, x, x), (ms.float32,) * 3, "aot")
    x, y = np.arange(1, 3001, dtype=np.float32), np.full(3000, 4.0, np.float32)
    outputs = program(real_device_array(x), real_device_array(y))
    assert all(_native.DLTensorView(o.__dlpack__()).device == (CUDA_DEVICE, 0) for o in outputs)
    added, multiplied, divided = (real_read_back(o) for o in outputs)
    np.testing.assert_array_equal(added, x + y)
    np.testing.assert_array_equal(multiplied, x * y)
    np.testing.assert_allclose(divided, x / y, rtol=1e-6)  # nvcc --use_fast_math divides approximately


@needs_gpu
def test_the_seed_kernel_on_torch_cuda_tensors(context, seed_library):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA (a CPU build)")
    program = ops.Custom(f"{seed_library}:CustomAddMulDiv", lambda x, y: (x, x, x), (ms.float32,) * 3, "aot",
                         reg_info=CustomRegOp().input(0, "x1").input(1, "x2").output(0, "y1").output(1, "y2")
                         .output(2, "y3").target("GPU"))
    x = torch.arange(1, 1001, dtype=torch.float32, device="cuda")
    y = torch.full((1000,), 2.0, device="cuda")
    added, multiplied, divided = program(x, y)
    assert isinstance(added, torch.Tensor) and added.device == x.device
    torch.testing.assert_close(added, x + y)
    torch.testing.assert_close(multiplied, x * y)
    torch.testing.assert_close(divided, x / y)


# -- docs/gpu.md ------------------------------------------------------------------------------------
GPU_DOC = ROOT / "docs" / "gpu.md"
DOC_TEXT = GPU_DOC.read_text() if GPU_DOC.exists() else ""
DOC_BLOCKS = re.findall(r"```python\n(.*?)```", DOC_TEXT, re.S)


@pytest.fixture(scope="module")
def doc_folder(tmp_path_factory):
    """Where the page's blocks run, in order: its CUDA blocks are the files their first line names."""
    folder = tmp_path_factory.mktemp("gpu-doc")
    for code in re.findall(r"```cuda\n(.*?)```", DOC_TEXT, re.S):  # "// scale.cu"
        (folder / code.split()[1]).write_text(code)
    return folder


def test_the_gpu_page_has_blocks_that_run_here_and_blocks_for_a_gpu():
    needing = [code for code in DOC_BLOCKS if code.startswith("# needs a GPU")]
    assert len(needing) >= 3 and len(DOC_BLOCKS) > len(needing)
    for index, code in enumerate(DOC_BLOCKS):  # the ones skipped here are at least Python
        compile(code, f"docs/gpu.md python block {index}", "exec")


@pytest.mark.parametrize("index", range(len(DOC_BLOCKS)))
def test_gpu_page_python_block_runs(doc_folder, index):
    """Blocks opening with "# needs a GPU" run only where there is one; the rest run everywhere."""
    code = DOC_BLOCKS[index]
    if code.startswith("# needs a GPU"):
        if cuda.device_count() == 0:
            pytest.skip("no CUDA device (opforge.cuda.device_count() == 0)")
        if "import torch" in code and not _torch_has_cuda():
            pytest.skip("this torch has no CUDA (a CPU build), or torch is missing")
        if "import cupy" in code and not _importable("cupy"):
            pytest.skip("CuPy is not installed")
        if "opforge.build(" in code and shutil.which("nvcc") is None:
            pytest.skip("nvcc not found")
    done = subprocess.run([sys.executable, "-c", code], cwd=doc_folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"docs/gpu.md python block {index} failed:\n{code}\n{done.stderr[-3000:]}"
    # A print whose line ends in a comment documents its output: hold the page to it.
    documented = [line.split("#", 1)[1].strip() for line in code.splitlines()
                  if line.startswith("print(") and "#" in line]
    if documented:
        assert done.stdout.strip().splitlines() == documented


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _torch_has_cuda():
    if not _importable("torch"):
        return False
    import torch

    return torch.cuda.is_available()
