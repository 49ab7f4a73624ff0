"""The GPU runtime (opforge.runtime.cuda, opforge.cuda).

Most tests run on the fake CUDA runtime (tests/kernels/fake_cudart.c): it
backs device memory with host memory, so they check the calls opforge makes
(pool allocation, no cudaMalloc or device synchronization per call, the
stream kernels get, launch-error handling), not CUDA itself.  The tests at the
end run on a real GPU and skip without one.
"""
import ctypes
import gc
import pickle
import shutil
import sys
import threading
import types

import numpy as np
import pytest

import opforge
from opforge.compat.mindspore.ops import CustomRegOp
from opforge.runtime import cuda, cuda_graph

from helpers import fake_cuda_log, fake_cuda_runtime

# A "GPU" kernel for the fake runtime: a host function, given the fake's host-backed pointers.
FAKE_KERNELS = r"""
#include <stdint.h>
extern "C" int AddAndStream(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  const float *a = static_cast<const float *>(params[0]), *b = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
  *static_cast<int64_t *>(params[3]) = reinterpret_cast<intptr_t>(stream);
  return 0;
}
extern "C" int Refuses(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  return 3;
}
"""


@pytest.fixture
def fake(monkeypatch):
    return fake_cuda_runtime(monkeypatch)


def calls(fake, name):
    count = fake.fake_cuda_calls(name.encode())
    assert count >= 0, f"{name} is not a call the fake runtime counts"
    return count


@pytest.fixture(scope="module")
def kernel_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-kernels") / "fake_gpu.cc"
    path.write_text(FAKE_KERNELS)
    return path


def gpu_op(source, function, out_shape, out_dtype):
    info = CustomRegOp().input(0, "a").input(1, "b").output(0, "y").output(1, "s").target("GPU").get_op_info()
    op = opforge.Custom(f"{source}:{function}", out_shape, out_dtype, "aot", reg_info=info)
    assert op.aot_kernel.device == "gpu"
    return op


@pytest.fixture
def add_op(kernel_source):
    return gpu_op(kernel_source, "AddAndStream", lambda a, b: (a, [1]), ("float32", "int64"))


# -- loading ----------------------------------------------------------------
def test_the_fake_runtime_is_loaded_from_opforge_cudart(fake):
    assert cuda.device_count() == 1
    assert opforge.cuda.is_available()
    assert calls(fake, "cudaGetDeviceCount") >= 1


def test_no_device_is_a_cuda_error_and_a_count_of_zero(fake, add_op):
    fake.fake_cuda_set_device_count(0)
    assert cuda.device_count() == 0
    assert not opforge.cuda.is_available()
    with pytest.raises(opforge.CudaError, match="no CUDA device"):
        cuda.allocate(16, 0)
    x = np.ones(3, np.float32)
    with pytest.raises(opforge.CudaError):
        add_op(x, x)


def test_a_missing_runtime_named_by_opforge_cudart(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFORGE_CUDART", str(tmp_path / "libcudart-missing.so"))
    monkeypatch.setattr(cuda, "_runtime", None)
    assert cuda.device_count() == 0
    with pytest.raises(opforge.CudaError, match="OPFORGE_CUDART"):
        cuda.runtime()


# -- device memory -----------------------------------------------------------
def test_allocate_takes_pool_memory_on_the_stream_and_frees_it_there(fake):
    buffers = [cuda.allocate(256 * (k + 1), 42) for k in range(5)]
    assert [b.nbytes for b in buffers] == [256, 512, 768, 1024, 1280]
    assert all(b.pointer and b.device_id == 0 and b.stream == 42 for b in buffers)
    assert len({b.pointer for b in buffers}) == 5
    assert fake.fake_cuda_last_stream() == 42
    assert calls(fake, "cudaMallocFromPoolAsync") == 5
    assert fake.fake_cuda_live_device_blocks() == 5
    # opforge's own pool, made once per device, keeps freed memory (its release threshold is raised).
    pool = cuda.memory_pool(0)
    assert calls(fake, "cudaMemPoolCreate") == calls(fake, "cudaMemPoolSetAttribute") == 1
    assert all(fake.fake_cuda_pool_of(b.pointer) == pool for b in buffers)
    assert fake.fake_cuda_pool_threshold(pool) == 2**64 - 1
    buffers[0].release()
    buffers[0].release()  # a second release does nothing
    del buffers[1:]  # the last reference frees too
    assert calls(fake, "cudaFreeAsync") == 5
    assert fake.fake_cuda_live_device_blocks() == 0
    assert fake.fake_cuda_bad_frees() == 0
    assert calls(fake, "cudaMalloc") == calls(fake, "cudaFree") == 0


def test_device_memory_comes_from_allocate_only_and_a_kept_buffer_is_never_freed(fake):
    with pytest.raises(TypeError, match="allocate"):
        cuda.DeviceBuffer()
    buffer = cuda.allocate(64, 7)
    assert isinstance(buffer, cuda.DeviceBuffer) and "64 bytes" in repr(buffer)
    buffer.keep()  # what the per-device scalar constants do: kept for the process
    assert buffer.pointer == 0
    del buffer
    gc.collect()
    assert calls(fake, "cudaFreeAsync") == 0 and fake.fake_cuda_live_device_blocks() == 1


def test_a_buffer_s_stream_takes_int_handles_only(fake):
    buffer = cuda.allocate(16, 7)
    buffer.stream = 9  # the graph executor moves a buffer to the stream that used it last
    with pytest.raises(TypeError, match="stream"):
        buffer.stream = "9"
    with pytest.raises(TypeError, match="users"):
        buffer.users = (3,)
    buffer.release()
    assert fake.fake_cuda_last_stream() == 9 and fake.fake_cuda_live_device_blocks() == 0


def test_allocate_on_another_device_switches_and_switches_back(fake):
    fake.fake_cuda_set_device_count(2)
    buffer = cuda.allocate(64, 0, device_id=1)
    assert buffer.device_id == 1
    assert cuda.current_device() == 0
    assert calls(fake, "cudaSetDevice") == 2  # to device 1 and back
    assert fake.fake_cuda_pool_threshold(cuda.memory_pool(1)) == 2**64 - 1
    assert fake.fake_cuda_pool_of(buffer.pointer) == cuda.memory_pool(1)
    assert calls(fake, "cudaMemPoolCreate") == 1  # device 0's pool was never used
    with cuda.on_device(1):
        assert cuda.current_device() == 1
        before = calls(fake, "cudaSetDevice")
        cuda.allocate(64, 0, device_id=1)  # already current: no switch
        assert calls(fake, "cudaSetDevice") == before
        assert cuda.pointer_device(buffer.pointer) == 1
    assert cuda.current_device() == 0
    with pytest.raises(opforge.CudaError, match="device 5.*invalid device ordinal") as caught:
        cuda.allocate(64, 0, device_id=5)
    assert caught.value.sticky is False and "sticky" not in str(caught.value)


def test_the_default_pools_are_left_as_they_are(fake):
    fake.fake_cuda_set_device_count(2)
    buffers = [cuda.allocate(64, 0, device_id=d) for d in (0, 1)]
    for device, buffer in enumerate(buffers):
        # Other libraries allocate from the default pools: opforge sets nothing there.
        assert fake.fake_cuda_release_threshold(device) == 0
        assert fake.fake_cuda_pool_of(buffer.pointer) not in (None, fake.fake_cuda_default_pool(device))
    assert calls(fake, "cudaMallocAsync") == calls(fake, "cudaDeviceGetDefaultMemPool") == 0


def test_a_buffer_on_another_device_is_freed_on_that_device_s_default_stream(fake):
    fake.fake_cuda_set_device_count(2)
    buffer = cuda.allocate(64, 0, device_id=1)  # the legacy default stream names the current device's
    pointer, start = buffer.pointer, fake.fake_cuda_log_size()
    assert cuda.current_device() == 0
    del buffer
    assert fake_cuda_log(fake, start) == [("cudaFreeAsync", 0, pointer, 1)]
    assert cuda.current_device() == 0


def test_memset_fills_a_buffer_on_its_stream(fake):
    buffer = cuda.allocate(8, 9)
    cuda.memset(buffer, 0x7F, 9)
    assert ctypes.string_at(buffer.pointer, 8) == b"\x7f" * 8
    assert fake.fake_cuda_last_stream() == 9


# -- streams -----------------------------------------------------------------
class ProtocolStream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_stream_accepts_handles_and_stream_objects():
    torch_like = types.SimpleNamespace(cuda_stream=0x2000)
    cupy_like = type("Stream", (), {"__module__": "cupy.cuda.stream", "ptr": 0x3000})()
    for given, handle in [(0, 0), (0x1000, 0x1000), (np.int64(5), 5), (ProtocolStream(0x4000), 0x4000),
                          (torch_like, 0x2000), (cupy_like, 0x3000)]:
        with opforge.cuda.stream(given) as entered:
            assert entered is given
            assert cuda.current_stream("torch", 0) == handle
            assert opforge.cuda.current_stream() == handle
    assert opforge.cuda.current_stream() == 0


class OwnedStream:
    """A stream object that destroys its CUDA stream when collected, as a CuPy stream does."""

    def __init__(self, lib):
        handle = ctypes.c_void_p()
        assert lib.cudaStreamCreate(ctypes.byref(handle)) == 0
        self.lib, self.handle = lib, handle.value

    def __cuda_stream__(self):
        return (0, self.handle)

    def __del__(self):
        self.lib.cudaStreamDestroy(ctypes.c_void_p(self.handle))


def test_a_stream_object_lives_as_long_as_memory_made_on_it(fake):
    with opforge.cuda.stream(OwnedStream(fake)) as given:
        buffer = cuda.allocate(64, opforge.cuda.current_stream())
        handle = given.handle
    del given  # the caller is done with its stream; the buffer is not
    gc.collect()
    assert buffer.stream == handle and isinstance(buffer.stream.owner, OwnedStream)
    assert calls(fake, "cudaStreamDestroy") == 0
    del buffer  # freed on its stream, which is then let go
    gc.collect()
    assert calls(fake, "cudaFreeAsync") == calls(fake, "cudaStreamDestroy") == 1
    assert fake.fake_cuda_dead_stream_uses() == 0


def test_framework_streams_come_with_their_owners(monkeypatch):
    current = types.SimpleNamespace(ptr=0x700)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda device: current)))
    handle = cuda.current_stream("cupy", 0)  # CuPy destroys a stream it collects: the handle keeps it
    assert handle == 0x700 and handle.owner is current
    assert pickle.loads(pickle.dumps(handle)) == 0x700
    assert cuda.stream_handle(5) == 5 and type(cuda.stream_handle(5)) is int  # an int has nothing to keep


def test_torch_s_stream_is_read_as_a_raw_handle_where_torch_has_the_query(monkeypatch):
    asked = []
    torch = types.SimpleNamespace(_C=types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda device: asked.append(device) or 0x900 + device))
    monkeypatch.setitem(sys.modules, "torch", torch)
    handle = cuda.current_stream("torch", 3)
    # torch never destroys the streams it hands out: a plain int (as __dlpack__(stream=) wants it)
    assert handle == 0x903 and type(handle) is int and asked == [3]


def test_inputs_on_their_library_s_own_stream_are_told_there_is_nothing_to_order(monkeypatch):
    torch = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0x900))
    monkeypatch.setitem(sys.modules, "torch", torch)
    # the producer queued its work on torch's current stream, where the call runs: DLPack's -1
    assert cuda.call_stream("torch", 0) == (0x900, -1)
    assert cuda.call_stream("numpy", 0) == (0, 1)  # a stream of no library's: the legacy default, named 1
    with opforge.cuda.stream(0x77):  # another stream than the library's: the producer orders its work before it
        stream, consumer = cuda.call_stream("torch", 0)
        assert (stream, consumer) == (0x77, 0x77) and type(consumer) is int
    with opforge.cuda.stream(ProtocolStream(0x78)):
        assert type(cuda.call_stream("torch", 0)[1]) is int  # a StreamHandle's plain value


def test_streams_nest_and_are_per_thread():
    seen = []
    with opforge.cuda.stream(11):
        with opforge.cuda.stream(22):
            worker = threading.Thread(target=lambda: seen.append(opforge.cuda.current_stream()))
            worker.start()
            worker.join()
            assert opforge.cuda.current_stream() == 22
            with opforge.cuda.stream(None):  # no override inside
                assert opforge.cuda.current_stream() == 0
        assert opforge.cuda.current_stream() == 11
    assert seen == [0]
    assert opforge.cuda.current_stream() == 0


@pytest.mark.parametrize("bad", ["stream", -1, True, 1.5, object(), ProtocolStream("x"), ProtocolStream(-4)])
def test_a_stream_that_is_not_one_is_a_device_error(bad):
    with pytest.raises(opforge.DeviceError, match="opforge.cuda.stream") as caught:
        with opforge.cuda.stream(bad):
            pass
    assert isinstance(caught.value, TypeError)
    assert opforge.cuda.current_stream() == 0


def test_current_stream_follows_torch_and_cupy_when_they_are_imported(monkeypatch):
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=0x500 + device)))

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            cupy_state.append(self.index)

        def __exit__(self, *exc):
            cupy_state.pop()

    cupy_state = [0]
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(  # a CuPy before 13: get_current_stream takes no device
        Device=Device, get_current_stream=lambda: types.SimpleNamespace(ptr=0x600 + cupy_state[-1])))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert cuda.current_stream("torch", 1) == 0x501
    assert cuda.current_stream("cupy", 2) == 0x602
    assert cupy_state == [0]
    assert cuda.current_stream("numpy", 0) == 0
    assert cuda.current_stream("jax", 0) == 0
    with opforge.cuda.stream(7):  # opforge's own stream wins
        assert cuda.current_stream("torch", 1) == cuda.current_stream("cupy", 0) == 7
    monkeypatch.delitem(sys.modules, "cupy")
    assert cuda.current_stream("cupy", 0) == 0  # never imported by opforge


def test_synchronize_waits_for_a_stream_or_the_device(fake):
    opforge.cuda.synchronize(ProtocolStream(0x77))
    assert calls(fake, "cudaStreamSynchronize") == 1
    assert fake.fake_cuda_last_stream() == 0x77
    assert calls(fake, "cudaDeviceSynchronize") == 0
    opforge.cuda.synchronize()
    assert calls(fake, "cudaDeviceSynchronize") == 1


# -- launch errors -------------------------------------------------------------
def test_a_launch_error_names_op_and_kernel(fake):
    fake.fake_cuda_inject_error(9, 0)  # cudaErrorInvalidConfiguration: this launch only
    with pytest.raises(opforge.CudaError, match=r"op 'scale': kernel 'ScaleKernel'.*cudaError 9") as caught:
        cuda.check_launch("scale", "ScaleKernel")
    assert caught.value.code == 9 and caught.value.sticky is False
    assert "sticky" not in str(caught.value)
    cuda.check_launch("scale", "ScaleKernel")  # the error was cleared


@pytest.mark.parametrize("code", [700, 719, 999])
def test_a_sticky_error_says_the_process_must_restart(fake, code):
    fake.fake_cuda_inject_error(code, 1)  # 999 is not in the list: found by cudaPeekAtLastError
    with pytest.raises(opforge.CudaError, match="sticky device error.*restart the process") as caught:
        cuda.check_launch("scale", "ScaleKernel")
    assert caught.value.code == code and caught.value.sticky
    with pytest.raises(opforge.CudaError, match="sticky"):
        opforge.cuda.synchronize(0)


# -- CUDA graphs -------------------------------------------------------------------
def test_capture_records_a_stream_and_replays_it_as_one_launch(fake):
    buffer = cuda.allocate(16, 0x99)
    recorded = []

    def record(stream):
        assert fake.fake_cuda_capturing() == 1
        recorded.append(stream)
        cuda.memset(buffer, 1, stream)

    graph = cuda_graph.capture(record, 0)
    assert len(recorded) == 1 and recorded[0] not in (0, 0x99)  # opforge's own capture stream
    assert fake.fake_cuda_capturing() == 0
    assert calls(fake, "cudaStreamBeginCapture") == calls(fake, "cudaStreamEndCapture") == 1
    assert calls(fake, "cudaGraphInstantiate") == calls(fake, "cudaGraphDestroy") == 1
    for _ in range(3):
        graph.launch(0x99)
    assert calls(fake, "cudaGraphLaunch") == 3 and fake.fake_cuda_last_stream() == 0x99
    graph.close()
    graph.close()
    assert calls(fake, "cudaGraphExecDestroy") == 1
    with pytest.raises(opforge.CudaError, match="closed"):
        graph.launch(0x99)


def test_a_failed_capture_is_ended_and_its_error_goes_on(fake):
    def record(stream):
        raise opforge.KernelError("op 'x': the kernel refused")

    with pytest.raises(opforge.KernelError, match="refused"):
        cuda_graph.capture(record, 0)
    assert fake.fake_cuda_capturing() == 0
    assert calls(fake, "cudaGraphDestroy") == 1 and calls(fake, "cudaGraphInstantiate") == 0


def test_cuda_graphs_have_one_home():
    assert not hasattr(cuda, "CapturedGraph") and not hasattr(cuda, "capture")
    assert cuda_graph.order_after is cuda.order_after


# -- host arrays given to a GPU kernel: the slow path ---------------------------
def test_host_arrays_go_through_pinned_pooled_copies(fake, add_op):
    a, b = np.arange(1000, dtype=np.float32), np.full(1000, 0.5, np.float32)
    y, s = add_op(a, b)
    np.testing.assert_array_equal(y, a + b)
    assert s.tolist() == [0]  # the legacy default stream
    pinned = calls(fake, "cudaHostAlloc")
    assert pinned == 4  # two inputs, two outputs staged
    for k in range(3):
        with opforge.cuda.stream(0x1234):
            y, s = add_op(a, b * k)
        np.testing.assert_array_equal(y, a + b * k)
        assert s.tolist() == [0x1234]
    assert calls(fake, "cudaHostAlloc") == pinned  # staging buffers are reused
    assert calls(fake, "cudaMallocFromPoolAsync") == 4 * 4  # inputs and outputs from the pool, every call
    assert calls(fake, "cudaFreeAsync") == 4 * 4
    assert calls(fake, "cudaMemcpyAsync") == 4 * 4
    assert calls(fake, "cudaStreamSynchronize") == 4  # one stream wait per call...
    assert fake.fake_cuda_last_stream() == 0x1234
    for never in ("cudaMalloc", "cudaFree", "cudaMemcpy", "cudaDeviceSynchronize", "cudaFreeHost"):
        assert calls(fake, never) == 0, never  # ...and nothing per call that stalls the device
    assert fake.fake_cuda_live_device_blocks() == 0
    assert fake.fake_cuda_bad_frees() == 0


def test_host_arrays_of_another_layout_are_copied_in_order(fake, add_op):
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not contiguous
    y, _ = add_op(a, np.ones((4, 3), np.float32))
    np.testing.assert_array_equal(y, a + 1)


def test_a_launch_error_on_host_arrays_frees_everything(fake, add_op):
    x = np.ones(8, np.float32)
    add_op(x, x)
    fake.fake_cuda_inject_error(9, 0)
    with pytest.raises(opforge.CudaError, match="kernel 'AddAndStream'"):
        add_op(x, x)
    assert fake.fake_cuda_live_device_blocks() == 0
    assert calls(fake, "cudaHostAlloc") == 4  # the staging buffers went back to the pool
    np.testing.assert_array_equal(add_op(x, x)[0], x + x)


def test_a_kernel_that_returns_non_zero_is_a_kernel_error(fake, kernel_source):
    op = gpu_op(kernel_source, "Refuses", lambda a, b: (a, [1]), ("float32", "int64"))
    x = np.ones(4, np.float32)
    with pytest.raises(opforge.KernelError, match="Refuses"):
        op(x, x)
    assert fake.fake_cuda_live_device_blocks() == 0


def test_the_host_array_path_has_one_name():
    # runtime.device_call.run_on_device is the device-array path; the host-array one is not called so too.
    assert not hasattr(cuda, "run_on_device")
    assert callable(cuda.run_host_arrays)


# -- a real GPU ---------------------------------------------------------------
needs_gpu = pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA device (opforge.cuda.device_count() == 0); "
                               "the fake-runtime tests above cover the calls")

CUDA_KERNELS = r"""
#include <cstdint>
__global__ void AddKernel(const float *a, const float *b, float *y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}
extern "C" int CudaAdd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  int threads = 256;
  AddKernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, (cudaStream_t)stream>>>(
      (const float *)params[0], (const float *)params[1], (float *)params[2], n);
  return 0;
}
extern "C" int CudaBadLaunch(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  AddKernel<<<1, 4096, 0, (cudaStream_t)stream>>>(nullptr, nullptr, nullptr, 0);  // too many threads per block
  return 0;
}
"""


@pytest.fixture(scope="module")
def cuda_source(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    path = tmp_path_factory.mktemp("cuda-kernels") / "real_gpu.cu"
    path.write_text(CUDA_KERNELS)
    return path


def single_output_gpu_op(source, function):
    info = CustomRegOp().input(0, "a").input(1, "b").output(0, "y").target("GPU").get_op_info()
    return opforge.Custom(f"{source}:{function}", lambda a, b: a, "float32", "aot", reg_info=info)


def test_cuda_kernels_compile(cuda_source):
    library = opforge.build(cuda_source)
    assert library.path.is_file()


@needs_gpu
def test_host_arrays_on_a_real_gpu_on_the_default_and_a_created_stream(cuda_source):
    op = single_output_gpu_op(cuda_source, "CudaAdd")
    a = np.arange(100_000, dtype=np.float32)
    b = np.linspace(0, 1, 100_000, dtype=np.float32)
    np.testing.assert_array_equal(op(a, b), a + b)
    lib = cuda.runtime()
    handle = ctypes.c_void_p()
    assert lib.cudaStreamCreate(ctypes.byref(handle)) == 0
    try:
        with opforge.cuda.stream(handle.value):
            for k in range(3):
                np.testing.assert_array_equal(op(a, b * k), a + b * k)
        opforge.cuda.synchronize(handle.value)
    finally:
        lib.cudaStreamDestroy(handle)


@needs_gpu
def test_a_real_launch_error_is_a_cuda_error_and_not_sticky(cuda_source):
    bad = single_output_gpu_op(cuda_source, "CudaBadLaunch")
    x = np.ones(4, np.float32)
    with pytest.raises(opforge.CudaError, match="kernel 'CudaBadLaunch'") as caught:
        bad(x, x)
    assert caught.value.sticky is False
    good = single_output_gpu_op(cuda_source, "CudaAdd")
    np.testing.assert_array_equal(good(x, x), x + x)  # the context still works


def pool_attribute(lib, attribute, pool):
    value = ctypes.c_uint64()
    lib.cudaMemPoolGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    assert lib.cudaMemPoolGetAttribute(ctypes.c_void_p(pool), attribute, ctypes.byref(value)) == 0
    return value.value


def default_pool(lib, device=0):
    pool = ctypes.c_void_p()
    assert lib.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), device) == 0
    return pool.value


@needs_gpu
def test_pool_memory_is_reused_on_a_real_gpu():
    lib, stream = cuda.runtime(), 0
    threshold = pool_attribute(lib, 4, default_pool(lib))  # the default pool's, whoever set it
    cuda.allocate(1 << 20, stream).release()
    opforge.cuda.synchronize(stream)
    pool = cuda.memory_pool(0)
    assert pool_attribute(lib, 4, pool) == 2**64 - 1  # cudaMemPoolAttrReleaseThreshold: keep freed memory
    assert pool_attribute(lib, 4, default_pool(lib)) == threshold  # the default pool is not opforge's to change
    reserved = pool_attribute(lib, 5, pool)  # cudaMemPoolAttrReservedMemCurrent
    for _ in range(100):
        buffer = cuda.allocate(1 << 20, stream)
        cuda.memset(buffer, 1, stream)
        del buffer  # freed on the stream, reused by the next allocation
    opforge.cuda.synchronize(stream)
    assert pool_attribute(lib, 5, pool) == reserved
    buffer = cuda.allocate(1 << 20, stream)
    cuda.memset(buffer, 1, stream)
    host = np.zeros(1 << 20, np.uint8)
    assert lib.cudaMemcpyAsync(host.ctypes.data, buffer.pointer, host.nbytes, 2, stream) == 0
    opforge.cuda.synchronize(stream)
    assert (host == 1).all()


@needs_gpu
def test_a_captured_graph_replays_on_a_real_gpu():
    lib = cuda.runtime()
    handle = ctypes.c_void_p()
    assert lib.cudaStreamCreate(ctypes.byref(handle)) == 0
    stream = handle.value
    try:
        buffer = cuda.allocate(4096, stream)
        cuda.memset(buffer, 0, stream)
        opforge.cuda.synchronize(stream)  # the capture stream is opforge's own: the zeros must be there first
        graph = cuda_graph.capture(lambda s: cuda.memset(buffer, 3, s), 0)
        host = np.zeros(4096, np.uint8)
        assert lib.cudaMemcpyAsync(host.ctypes.data, buffer.pointer, host.nbytes, 2, stream) == 0
        opforge.cuda.synchronize(stream)
        assert (host == 0).all()  # capturing ran nothing
        graph.launch(stream)
        assert lib.cudaMemcpyAsync(host.ctypes.data, buffer.pointer, host.nbytes, 2, stream) == 0
        opforge.cuda.synchronize(stream)
        assert (host == 3).all()
        graph.close()
        buffer.release()
        opforge.cuda.synchronize(stream)
    finally:
        lib.cudaStreamDestroy(handle)
