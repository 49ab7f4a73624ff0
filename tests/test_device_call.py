"""A call on arrays in GPU memory: dispatch by device, pointers straight to the kernel,
the caller's stream, pooled outputs, no synchronization, typed errors.

These run on the fake CUDA runtime (tests/kernels/fake_cudart.c), whose device
memory is host memory: they check what opforge hands the runtime and the kernel,
not CUDA.  The arrays below are a minimal DLPack library of "CUDA" arrays
(device type 2), so the path is the one torch or CuPy arrays take.
"""
import gc
import sys
import types
import weakref

import numpy as np
import pytest

import opforge
from opforge import _native
from opforge.runtime import cuda

from helpers import declare, fake_cuda_log, fake_cuda_runtime

# "GPU" kernels for the fake runtime: host functions on the fake's host-backed pointers.
KERNELS = r"""
#include <stdint.h>
#include <string.h>
extern "C" int Scale2(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = 2 * x[i];
  return 0;
}
extern "C" int Seen(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  int64_t *y = static_cast<int64_t *>(params[1]);
  y[0] = reinterpret_cast<intptr_t>(params[0]);
  y[1] = reinterpret_cast<intptr_t>(stream);
  y[2] = nparam;
  return 0;
}
extern "C" int Fails(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  return 7;
}
// y = a + b, where b may be 0-d; both float32 (5 otherwise).
extern "C" int AddF32(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  if (strcmp(dtypes[0], "float32") != 0 || strcmp(dtypes[1], "float32") != 0) return 5;
  const float *a = static_cast<const float *>(params[0]), *b = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + (ndims[1] == 0 ? b[0] : b[i]);
  return 0;
}
"""


class FakeCudaArray:
    """A NumPy array's memory presented through DLPack as CUDA device 0."""

    def __init__(self, array, owner=None, device_id=0):
        self.array = np.ascontiguousarray(array)
        self.owner = owner  # what keeps imported memory alive
        self.device_id = device_id
        self.streams = []  # the consumer streams __dlpack__ was asked for

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)

    def __dlpack_device__(self):
        return (2, self.device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        export = _native.DLPackExport(self.array.ctypes.data, self.array.shape, self.array.dtype.name, 2,
                                      self.device_id, self.array)
        return export.__dlpack__(max_version=max_version)


def from_dlpack(exported, stream=None):
    """This module as an array library: opforge hands outputs back through it.  Like
    PyTorch, it names its current stream (opforge's here) as the consumer's."""
    if stream is None:
        stream = int(opforge.cuda.current_stream()) or 1  # DLPack's name for the legacy default stream
    view = _native.DLTensorView(exported.__dlpack__(stream=stream, max_version=(1, 0)))
    assert view.device[0] == 2
    count = int(np.prod(view.shape))
    buffer = (np.ctypeslib.as_ctypes_type(np.dtype(view.dtype)) * count).from_address(view.data)
    return FakeCudaArray(np.frombuffer(buffer, view.dtype).reshape(view.shape), owner=view, device_id=view.device[1])


FakeCudaArray.__module__ = __name__  # (the kind is found by the array type's module)
assert hasattr(sys.modules[__name__], "from_dlpack")


@pytest.fixture
def fake(monkeypatch):
    return fake_cuda_runtime(monkeypatch)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("device-call") / "fake_gpu.cc"
    path.write_text(KERNELS)
    return path


@pytest.fixture
def scale(fresh, source):
    op = declare(fresh, "tdev::scale(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:Scale2", device="gpu", dtypes={"x": ["float32"]})
    return op


@pytest.fixture
def seen(fresh, source):
    op = declare(fresh, "tdev::seen(Tensor x) -> Tensor y")

    @op.infer_shape
    def _(x):
        return (3,)

    @op.infer_dtype
    def _(x):
        return "int64"

    op.kernel(source=f"{source}:Seen", device="gpu")
    return op


def test_device_arrays_reach_the_gpu_kernel_and_come_back_as_their_kind(fake, scale):
    x = FakeCudaArray(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = scale(x)
    assert isinstance(y, FakeCudaArray) and y.shape == (2, 3)
    np.testing.assert_array_equal(y.array, 2 * x.array)
    # The output is pool memory on the call's stream; nothing per call touches cudaMalloc or synchronizes.
    assert fake.fake_cuda_calls(b"cudaMallocFromPoolAsync") == 1
    for call in (b"cudaMalloc", b"cudaFree", b"cudaDeviceSynchronize", b"cudaStreamSynchronize", b"cudaMemcpy",
                 b"cudaMemcpyAsync"):
        assert fake.fake_cuda_calls(call) == 0, call
    assert fake.fake_cuda_calls(b"cudaGetLastError") >= 1  # the launch check


def test_the_input_pointer_and_the_callers_stream_reach_the_kernel(fake, seen):
    x = FakeCudaArray(np.ones(4, np.float32))
    with opforge.cuda.stream(0x5000):
        y = seen(x)
    pointer, stream, nparam = y.array.tolist()
    assert pointer == x.array.ctypes.data
    assert stream == 0x5000
    assert nparam == 2
    assert x.streams == [0x5000]  # DLPack: the producer orders its work before the consumer's stream
    y = seen(x)  # no stream set, no framework stream: the legacy default stream, DLPack's 1
    assert y.array.tolist()[1] == 0 and x.streams[-1] == 1


def test_outputs_are_freed_on_their_stream_when_released(fake, scale):
    x = FakeCudaArray(np.ones(8, np.float32))
    y = scale(x)
    assert fake.fake_cuda_calls(b"cudaFreeAsync") == 0
    del y
    assert fake.fake_cuda_calls(b"cudaFreeAsync") == 1
    assert fake.fake_cuda_live_device_blocks() == 0


def test_the_inputs_device_picks_the_kernel(fake, fresh, source):
    op = declare(fresh, "tdev::both(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:Scale2", device="gpu", dtypes={"x": ["float32"]})

    @op.kernel(device="cpu")
    def _(x):
        return x * 3

    host = np.ones(3, np.float32)
    assert op(host).tolist() == [3.0, 3.0, 3.0]  # host arrays: the CPU kernel
    assert op(FakeCudaArray(host)).array.tolist() == [2.0, 2.0, 2.0]  # device arrays: the GPU kernel
    assert fake.fake_cuda_calls(b"cudaMemcpyAsync") == 0


def test_an_op_without_a_gpu_kernel_is_a_device_error(fake, fresh):
    op = declare(fresh, "tdev::host_only(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: x, device="cpu")
    with pytest.raises(opforge.DeviceError, match=r"op 'tdev::host_only' has no gpu kernel .*run on cpu"):
        op(FakeCudaArray(np.ones(2, np.float32)))


def test_host_and_device_arrays_in_one_call_are_a_device_error(fake, fresh, source):
    op = declare(fresh, "tdev::pair(Tensor a, Tensor b) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:Scale2", device="gpu")
    with pytest.raises(opforge.DeviceError, match=r"'a' is test_device_call on cuda:0, 'b' is numpy on cpu"):
        op(FakeCudaArray(np.ones(2, np.float32)), np.ones(2, np.float32))
    with pytest.raises(opforge.DeviceError, match=r"input 'b' is list .*pass every input as an array on cuda:0"):
        op(FakeCudaArray(np.ones(2, np.float32)), [1.0, 2.0])
    with pytest.raises(opforge.DeviceError, match=r"'a' is test_device_call on cuda:0, 'b' is test_device_call on "
                                                  r"cuda:1"):
        op(FakeCudaArray(np.ones(2, np.float32)), FakeCudaArray(np.ones(2, np.float32), device_id=1))


def test_a_launch_error_is_a_cuda_error_naming_op_and_kernel(fake, scale):
    fake.fake_cuda_inject_error(98, 0)  # cudaErrorInvalidDeviceFunction at the next cudaGetLastError
    with pytest.raises(opforge.CudaError, match=r"op 'tdev::scale': kernel 'Scale2'"):
        scale(FakeCudaArray(np.ones(2, np.float32)))


def test_a_sticky_error_says_the_process_must_restart(fake, scale):
    fake.fake_cuda_inject_error(700, 1)  # cudaErrorIllegalAddress: the context is lost
    with pytest.raises(opforge.CudaError, match=r"(?i)sticky|restart"):
        scale(FakeCudaArray(np.ones(2, np.float32)))


def test_a_kernel_returning_non_zero_is_a_kernel_error(fake, fresh, source):
    op = declare(fresh, "tdev::fails(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:Fails", device="gpu")
    with pytest.raises(opforge.KernelError, match=r"op 'tdev::fails': kernel function 'Fails'.* code 7"):
        op(FakeCudaArray(np.ones(2, np.float32)))


def test_empty_inputs_give_zeroed_outputs_without_a_launch(fake, scale):
    y = scale(FakeCudaArray(np.ones((0, 3), np.float32)))
    assert y.shape == (0, 3)
    assert fake.fake_cuda_calls(b"cudaGetLastError") == 0


class InterfaceOnlyArray:
    """A device array that speaks only __cuda_array_interface__ (no DLPack)."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.__cuda_array_interface__ = {"shape": self.array.shape, "typestr": self.array.dtype.str,
                                         "data": (self.array.ctypes.data, False), "version": 3, "strides": None}


InterfaceOnlyArray.__module__ = __name__


def test_cuda_array_interface_arrays_are_taken_without_a_copy(fake, seen, scale):
    x = InterfaceOnlyArray(np.arange(4, dtype=np.float32))
    y = seen(x)
    assert y.array.tolist()[0] == x.array.ctypes.data
    y = scale(x)  # (y.array is the pool's memory: y keeps it alive)
    np.testing.assert_array_equal(y.array, 2 * x.array)


def test_a_cuda_array_interface_stream_is_ordered_before_the_call(fake, scale):
    x, outputs = InterfaceOnlyArray(np.ones(4, np.float32)), []  # (outputs kept: no frees in the logs)
    for producer, expected in ((0x9000, 0x9000), (2, 2), (1, None), (None, None)):  # 1: the legacy stream, too
        x.__cuda_array_interface__["stream"] = producer  # (v3) the producer's work on x is queued there
        start = fake.fake_cuda_log_size()
        outputs.append(scale(x))  # on the legacy default stream
        ordered = [] if expected is None else [("cudaEventRecord", expected, "e0"), ("cudaStreamWaitEvent", 0, "e0")]
        assert event_log(fake, start) == ordered, producer
        np.testing.assert_array_equal(outputs[-1].array, [2, 2, 2, 2])
    x.__cuda_array_interface__["stream"] = 0x9000
    with opforge.cuda.stream(0x6000):
        start = fake.fake_cuda_log_size()
        outputs.append(scale(x))
    assert event_log(fake, start) == [("cudaEventRecord", 0x9000, "e0"), ("cudaStreamWaitEvent", 0x6000, "e0")]
    x.__cuda_array_interface__["stream"] = -3
    with pytest.raises(opforge.DeviceError, match=r"op 'tdev::scale': input 'x'.*stream -3"):
        scale(x)


# -- DLPack stream semantics, memory lifetime, typed errors, scalars ---------------------
def event_log(fake, start=0):
    """The fake's log of event and free calls; events are named e0, e1, ... by the record
    that made them (an address may be reused once an event is destroyed)."""
    names, entries, recorded = {}, [], 0
    for name, stream, target, _ in fake_cuda_log(fake, start):
        if name == "cudaEventRecord":
            names[target], recorded = f"e{recorded}", recorded + 1
        if name in ("cudaEventRecord", "cudaStreamWaitEvent"):
            entries.append((name, stream, names.get(target, "?")))
        elif name == "cudaFreeAsync":
            entries.append((name, stream))
    return entries


def test_an_export_orders_the_consumer_s_stream_after_the_producer_s(fake):
    buffer = cuda.allocate(16, 0x5000)
    export = buffer.export((4,), "float32")
    assert (export.dtype, export.shape, export.device) == ("float32", (4,), (2, 0))
    for same in (0x5000, -1):  # the producer's own stream, or "no synchronization"
        _native.DLTensorView(export.__dlpack__(stream=same))
    assert event_log(fake) == []
    _native.DLTensorView(export.__dlpack__(stream=0x6000))
    assert event_log(fake) == [("cudaEventRecord", 0x5000, "e0"), ("cudaStreamWaitEvent", 0x6000, "e0")]
    start = fake.fake_cuda_log_size()
    _native.DLTensorView(export.__dlpack__())  # no stream: the legacy default stream (1)
    assert event_log(fake, start) == [("cudaEventRecord", 0x5000, "e0"), ("cudaStreamWaitEvent", 1, "e0")]
    start = fake.fake_cuda_log_size()
    _native.DLTensorView(export.__dlpack__(stream=0))  # disallowed by DLPack; CUDA's handle 0 is the legacy one
    assert event_log(fake, start) == [("cudaEventRecord", 0x5000, "e0"), ("cudaStreamWaitEvent", 1, "e0")]
    for refused in (-2, 1.5, "s", True):
        with pytest.raises(BufferError, match="stream must be an int CUDA stream handle"):
            export.__dlpack__(stream=refused)


def test_memory_a_consumer_took_is_freed_after_the_consumer_s_stream(fake):
    buffer = cuda.allocate(16, 0x5000)
    export = buffer.export((4,), "float32")
    for consumer in (0x6000, 0x6000, 2):
        _native.DLTensorView(export.__dlpack__(stream=consumer))
    start = fake.fake_cuda_log_size()
    del buffer, export
    # Each consumer stream's work so far comes before the free on the producing stream.
    assert event_log(fake, start) == [
        ("cudaEventRecord", 0x6000, "e0"), ("cudaStreamWaitEvent", 0x5000, "e0"),
        ("cudaEventRecord", 2, "e1"), ("cudaStreamWaitEvent", 0x5000, "e1"), ("cudaFreeAsync", 0x5000)]
    assert fake.fake_cuda_live_device_blocks() == 0


def consumer_library(name, from_dlpack):
    """An array type whose library (found through __array_namespace__) is ``from_dlpack``'s."""
    library = types.SimpleNamespace(__name__=name, from_dlpack=from_dlpack)
    return type(name, (FakeCudaArray,), {"__array_namespace__": lambda self: library})


def test_an_op_s_outputs_follow_a_consumer_on_another_stream(fake, scale):
    OtherStream = consumer_library("otherstream", lambda exported: from_dlpack(exported, stream=0x7000))
    with opforge.cuda.stream(0x5000):
        y = scale(OtherStream(np.ones(4, np.float32)))
    np.testing.assert_array_equal(y.array, [2, 2, 2, 2])
    assert event_log(fake) == [("cudaEventRecord", 0x5000, "e0"), ("cudaStreamWaitEvent", 0x7000, "e0")]
    start = fake.fake_cuda_log_size()
    del y
    assert event_log(fake, start) == [("cudaEventRecord", 0x7000, "e0"), ("cudaStreamWaitEvent", 0x5000, "e0"),
                                      ("cudaFreeAsync", 0x5000)]


def test_an_input_its_library_will_not_share_is_a_device_error(fake, scale):
    class Refusing(FakeCudaArray):
        def __dlpack__(self, **kwargs):
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")

    with pytest.raises(opforge.DeviceError, match=r"op 'tdev::scale': input 'x' \(Refusing\) cannot be shared "
                                                  r"through DLPack: .*detach") as caught:
        scale(Refusing(np.ones(2, np.float32)))
    assert isinstance(caught.value, TypeError)


def test_an_output_its_library_will_not_take_is_a_device_error(fake, scale):
    def refuse(exported):
        exported.__dlpack__(stream=-7)  # not a stream: the export says so

    Refuses = consumer_library("refuses", refuse)
    with pytest.raises(opforge.DeviceError, match=r"op 'tdev::scale': output 'y' cannot be handed to refuses "
                                                  r"through DLPack: .*stream must be an int CUDA stream"):
        scale(Refuses(np.ones(2, np.float32)))


def test_a_64_bit_output_a_library_narrows_is_a_dtype_error_on_the_gpu_too(fake, seen):
    def narrowing(exported):  # what JAX without 64-bit types does
        return FakeCudaArray(from_dlpack(exported).array.astype(np.int32))

    Narrowing = consumer_library("jax", narrowing)
    with pytest.raises(opforge.DTypeError, match=r"op 'tdev::seen': output 'y' is int64, but jax made it int32 "
                                                 r"\(64-bit types are off in JAX"):
        seen(Narrowing(np.ones(4, np.float32)))


@pytest.fixture
def add32(fresh, source):
    op = declare(fresh, "tdev::add32(Tensor a, Tensor b) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:AddF32", device="gpu")
    return op


def test_python_scalars_join_device_arrays_as_on_the_cpu(fake, add32):
    x = FakeCudaArray(np.arange(4, dtype=np.float32))
    for k in range(3):
        y = add32(x, 2)  # an int, taken as float32 like x (as NumPy and opforge's CPU path do)
        np.testing.assert_array_equal(y.array, x.array + 2)
    assert fake.fake_cuda_calls(b"cudaMemcpyAsync") == 1  # the value went to the device once
    y = add32(x, np.float32(0.5))  # (y owns the memory y.array reads)
    np.testing.assert_array_equal(y.array, x.array + 0.5)
    y = add32(x, True)
    np.testing.assert_array_equal(y.array, x.array + 1)
    assert fake.fake_cuda_calls(b"cudaMemcpyAsync") == 3
    for stalls in (b"cudaStreamSynchronize", b"cudaDeviceSynchronize", b"cudaMemcpy"):
        assert fake.fake_cuda_calls(stalls) == 0, stalls
    with pytest.raises(opforge.KernelError, match="AddF32"):  # a NumPy scalar keeps its dtype: float64 here
        add32(x, np.float64(1))
    with pytest.raises(opforge.DeviceError, match=r"input 'b' is list .*or a Python or NumPy scalar"):
        add32(x, [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(opforge.DTypeError, match=r"input 'b': the scalar np.str_\('one'\) cannot be passed to a "
                                                 r"GPU kernel as a 0-d <U3 array: .*not supported by the kernel ABI"):
        add32(x, np.str_("one"))


def test_a_scalar_uploaded_on_one_stream_is_waited_for_on_another(fake, add32):
    x = FakeCudaArray(np.zeros(2, np.float32))
    fake.fake_cuda_set_events_pending(1)  # the upload has not finished yet
    with opforge.cuda.stream(0x5000):
        add32(x, 7.0)
    with opforge.cuda.stream(0x6000):
        start = fake.fake_cuda_log_size()
        y = add32(x, 7.0)
    assert [e[:2] for e in event_log(fake, start)] == [("cudaStreamWaitEvent", 0x6000)]
    fake.fake_cuda_set_events_pending(0)  # done: nothing to wait for from now on
    start = fake.fake_cuda_log_size()
    with opforge.cuda.stream(0x6000):
        z = add32(x, 7.0)
    assert event_log(fake, start) == []
    np.testing.assert_array_equal(y.array, [7, 7])
    np.testing.assert_array_equal(z.array, [7, 7])


def test_scalars_past_the_cache_are_uploaded_per_call_and_freed_after_it(fake, add32, monkeypatch):
    monkeypatch.setattr(cuda, "_CONSTANTS_MAX", 0)
    x = FakeCudaArray(np.zeros(2, np.float32))
    live = fake.fake_cuda_live_device_blocks()
    with opforge.cuda.stream(0x5000):
        y = add32(x, 3.0)
    np.testing.assert_array_equal(y.array, [3, 3])
    assert fake.fake_cuda_live_device_blocks() == live + 1  # the output alone
    frees = [e for e in fake_cuda_log(fake) if e[0] == "cudaFreeAsync"]
    assert [e[1] for e in frees] == [0x5000]  # the scalar's copy, after the kernel on its stream


# -- remembered calls: after its first call, a call on GPU arrays runs in C (_native.DeviceRoutes) --------
ROUTED = r"""
#include "custom_aot_extra.h"
extern "C" int RoutedInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  extra->SetWorkSpace({static_cast<size_t>(n) * sizeof(float)});
  return 0;
}
// y = x * factor (through the workspace), z = x + 1; fails with 9 when x[0] < 0.
extern "C" int Routed(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  float factor = static_cast<AotExtra *>(extra)->Attr<float>("factor");
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]), *z = static_cast<float *>(params[2]);
  float *scratch = static_cast<float *>(params[3]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  if (nparam != 4 || (n > 0 && x[0] < 0)) return 9;
  for (int64_t i = 0; i < n; i++) scratch[i] = x[i] * factor;
  for (int64_t i = 0; i < n; i++) {
    y[i] = scratch[i];
    z[i] = x[i] + 1;
  }
  return 0;
}
"""


@pytest.fixture
def routed(fresh, tmp_path):
    path = tmp_path / "routed.cc"
    path.write_text(ROUTED)
    op = declare(fresh, "tdev::routed(Tensor x, *, float factor=2.0) -> (Tensor y, Tensor z)")
    op.def_infer(lambda x, factor: (x, x))
    op.kernel(source=f"{path}:Routed", device="gpu", dtypes={"x": ["float32"]})
    return op


def routes(op, **attrs):
    return opforge.runtime.dispatch.launcher_for(op, op.resolve_attrs(attrs), 1).planner.device_routes


def test_a_second_call_runs_in_c_with_the_same_results_memory_and_stream(fake, routed):
    x = FakeCudaArray(np.arange(6, dtype=np.float32).reshape(2, 3))
    with opforge.cuda.stream(0x5000):
        first = routed(x)
    assert routes(routed).stats == {"routes": 1, "hits": 0}
    start, live = fake.fake_cuda_log_size(), fake.fake_cuda_live_device_blocks()
    with opforge.cuda.stream(0x6000):  # the stream is asked for each call, not remembered
        y, z = routed(x)
    assert routes(routed).stats == {"routes": 1, "hits": 1}
    np.testing.assert_array_equal(y.array, 2 * x.array)
    np.testing.assert_array_equal(z.array, x.array + 1)
    assert x.streams[-1] == 0x6000  # the consumer stream DLPack was told
    log = fake_cuda_log(fake, start)
    # two outputs and the workspace from opforge's pool on the caller's stream; the workspace freed after the kernel
    allocations = [e for e in log if e[0] == "cudaMallocFromPoolAsync"]
    assert [e[1] for e in allocations] == [0x6000] * 3
    assert [e[:2] for e in log if e[0] == "cudaFreeAsync"] == [("cudaFreeAsync", 0x6000)]
    assert fake.fake_cuda_live_device_blocks() == live + 2
    assert fake.fake_cuda_calls(b"cudaStreamSynchronize") == fake.fake_cuda_calls(b"cudaDeviceSynchronize") == 0
    del y, z, first
    gc.collect()
    assert fake.fake_cuda_live_device_blocks() == 0 and fake.fake_cuda_bad_frees() == 0


def test_other_signatures_and_attributes_are_worked_out_in_python_then_remembered(fake, routed):
    a, b = FakeCudaArray(np.ones(4, np.float32)), FakeCudaArray(np.ones((2, 2), np.float32))
    for x in (a, b, a, b):
        y, _ = routed(x)  # (y.array is the pool's memory: y keeps it alive)
        np.testing.assert_array_equal(y.array, 2 * x.array)
    assert routes(routed).stats == {"routes": 2, "hits": 2}
    for _ in range(2):  # another launcher, with routes of its own
        y, _ = routed(a, factor=3.0)
        np.testing.assert_array_equal(y.array, [3, 3, 3, 3])
    assert routes(routed, factor=3.0).stats == {"routes": 1, "hits": 1}
    with pytest.raises(opforge.DTypeError, match="float64"):  # no float64 kernel: Python's rules, Python's message
        routed(FakeCudaArray(np.ones(4, np.float64)))


def test_errors_on_a_remembered_call_name_the_op_and_kernel(fake, routed):
    x = FakeCudaArray(np.ones(4, np.float32))
    routed(x)
    with pytest.raises(opforge.KernelError, match=r"tdev::routed.*Routed.*9"):
        routed(FakeCudaArray(-np.ones(4, np.float32)))
    fake.fake_cuda_inject_error(98, 0)  # the launch fails
    with pytest.raises(opforge.CudaError, match=r"op 'tdev::routed': kernel 'Routed'"):
        routed(x)
    assert routes(routed).stats["hits"] == 2  # both were raised from C
    y, _ = routed(x)  # the error was read once: the next call goes through
    np.testing.assert_array_equal(y.array, [2, 2, 2, 2])
    assert routes(routed).stats["hits"] == 3
    gc.collect()
    assert fake.fake_cuda_live_device_blocks() == 2 and fake.fake_cuda_bad_frees() == 0


def test_a_sticky_error_on_a_remembered_call_is_raised_by_the_python_path(fake, routed):
    x = FakeCudaArray(np.ones(4, np.float32))
    routed(x)
    fake.fake_cuda_inject_error(700, 1)  # every call fails from here: the pool refuses, nothing runs in C
    with pytest.raises(opforge.CudaError, match=r"(?i)sticky|restart"):
        routed(x)


def test_remembered_calls_keep_no_argument_alive_and_the_collector_sees_them(fake, routed):
    x = FakeCudaArray(np.ones(4, np.float32))
    routed(x)
    routed(x)
    held = routes(routed)
    assert held.stats == {"routes": 1, "hits": 1}
    seen = weakref.ref(x)
    del x
    gc.collect()
    assert seen() is None
    # A route's callables reach the op, whose launcher holds the routes: a cycle the collector must see.
    remembered = [r for r in gc.get_referents(held) if isinstance(r, tuple) and FakeCudaArray in r]
    assert gc.is_tracked(held) and len(remembered) == 1
    held.forget()
    assert held.stats["routes"] == 0 and gc.get_referents(held) == [opforge.runtime.dispatch.INTERCEPTORS]


def test_a_new_interceptor_takes_calls_the_routes_made_before(fake, routed, monkeypatch):
    x = FakeCudaArray(np.ones(4, np.float32))
    routed(x)
    taken = []

    def intercept(op, attrs, args):
        taken.append(op.name)
        return "intercepted"

    monkeypatch.setattr(opforge.runtime.dispatch, "INTERCEPTORS", opforge.runtime.dispatch.INTERCEPTORS)
    opforge.runtime.dispatch.INTERCEPTORS.append(intercept)
    try:
        assert routed(x) == "intercepted" and taken == ["tdev::routed"]
        assert routes(routed).stats["routes"] == 0
    finally:
        opforge.runtime.dispatch.INTERCEPTORS.remove(intercept)


def test_a_call_remembered_after_an_interceptor_came_drops_the_routes_made_before(fake, routed):
    planner = opforge.runtime.dispatch.launcher_for(routed, routed.resolve_attrs({}), 1).planner
    routed(FakeCudaArray(np.ones(4, np.float32)))
    assert routes(routed).stats["routes"] == 1
    declining = lambda op, attrs, args: NotImplemented  # noqa: E731  (a bridge that takes none of these)
    opforge.runtime.dispatch.INTERCEPTORS.append(declining)
    try:
        planner.prepare((FakeCudaArray(np.ones(2, np.float32)),))  # the Python path, straight: it remembers
        assert routes(routed).stats["routes"] == 1  # the new call's alone: the older one predates the interceptor
    finally:
        opforge.runtime.dispatch.INTERCEPTORS.remove(declining)


def test_a_remembered_call_on_a_second_device_switches_there_and_back(fake, routed):
    fake.fake_cuda_set_device_count(2)
    x = FakeCudaArray(np.ones(4, np.float32), device_id=1)
    routed(x)
    start = fake.fake_cuda_log_size()
    y, _ = routed(x)
    assert routes(routed).stats["hits"] == 1
    assert {e[3] for e in fake_cuda_log(fake, start) if e[0] == "cudaMallocFromPoolAsync"} == {1}
    assert cuda.current_device() == 0
    np.testing.assert_array_equal(y.array, [2, 2, 2, 2])


def test_a_call_worked_out_again_replaces_its_route(fake, routed):
    x = FakeCudaArray(np.ones(4, np.float32))
    planner = opforge.runtime.dispatch.launcher_for(routed, routed.resolve_attrs({}), 1).planner
    for _ in range(3):  # the Python path, each time remembering the call
        y, _ = planner.prepare((x,)).value
        np.testing.assert_array_equal(y.array, [2, 2, 2, 2])
    assert routes(routed).stats == {"routes": 1, "hits": 0}


class OrderingArray(FakeCudaArray):
    """A producer that orders its pending work (on stream 0x9000) before the consumer's stream as torch
    does: with the streams of the device current when __dlpack__ is called."""

    refuse = False

    def __dlpack__(self, *, stream=None, **kwargs):
        if self.refuse:
            raise BufferError("refused")
        if stream not in (None, -1):
            cuda.order_after(0x9000, stream)
        return super().__dlpack__(stream=stream, **kwargs)


def test_a_remembered_call_takes_its_inputs_with_their_device_current(fake, routed):
    fake.fake_cuda_set_device_count(2)
    x = OrderingArray(np.ones(4, np.float32), device_id=1)
    with opforge.cuda.stream(0x6000):
        routed(x)
        start = fake.fake_cuda_log_size()
        y, _ = routed(x)
    assert routes(routed).stats["hits"] == 1
    ordering = [e for e in fake_cuda_log(fake, start) if e[0] in ("cudaEventRecord", "cudaStreamWaitEvent")]
    assert [(name, stream, device) for name, stream, _, device in ordering] == [
        ("cudaEventRecord", 0x9000, 1), ("cudaStreamWaitEvent", 0x6000, 1)]
    assert cuda.current_device() == 0
    OrderingArray.refuse = True  # the route cannot take it: back to Python, with device 0 current again
    try:
        with pytest.raises(opforge.DeviceError, match="refused"):
            routed(x)
    finally:
        OrderingArray.refuse = False
    assert cuda.current_device() == 0
    np.testing.assert_array_equal(y.array, [2, 2, 2, 2])


def test_a_call_failing_in_a_free_is_not_blamed_on_a_kernel(fake, routed):
    x = FakeCudaArray(np.ones(4, np.float32))
    routed(x)
    fake.fake_cuda_fail_next(b"cudaFreeAsync", 1)  # the remembered call's workspace free fails, after its launch
    y, _ = routed(x)
    assert routes(routed).stats["hits"] == 1
    buffer = cuda.allocate(16, 0x5000)
    _native.DLTensorView(buffer.export((4,), "float32").__dlpack__(stream=0x6000))
    fake.fake_cuda_fail_next(b"cudaStreamWaitEvent", 1)  # freeing it after its consumer fails
    del buffer
    gc.collect()
    y, _ = routed(x)  # the next launch check does not find the free's error
    np.testing.assert_array_equal(y.array, [2, 2, 2, 2])
    buffer = cuda.allocate(16, 0x5000)
    fake.fake_cuda_inject_error(700, 1)  # a sticky error while freeing stays, and is reported as sticky
    del buffer
    with pytest.raises(opforge.CudaError, match=r"(?i)sticky"):
        routed(x)
