"""Graphs on arrays in GPU memory: a GPU kernel per node, a pooled device arena, the
caller's stream, and the whole plan captured once into a CUDA graph and replayed.

Most tests run on the fake CUDA runtime (tests/kernels/fake_cudart.c): its device
memory is host memory and its "GPU" kernels are host functions, so they check what
opforge asks of the runtime (which calls, how often, on which stream, with which
pointers), not CUDA.  The fake records a capture without running anything on
replay: kernels run while being captured, and cudaGraphLaunch runs nothing, so a
replay's results are checked through the calls it made.  The last test runs on a
real GPU and skips without one.
"""
import ctypes
import gc

import numpy as np
import pytest

import opforge
from opforge import _native
from opforge.runtime import cuda

from helpers import declare, fake_cuda_log, fake_cuda_runtime
from test_device_call import FakeCudaArray, consumer_library
from test_device_call import from_dlpack as fake_cuda_from_dlpack

# "GPU" kernels for the fake runtime: host functions, counting their runs and noting their stream.
KERNELS = r"""
#include <stdint.h>
extern "C" {
long launches = 0;
void *last_stream = 0;
static int64_t count(int *ndims, int64_t **shapes) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  return n;
}
int Inc(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  for (int64_t i = 0, n = count(ndims, shapes); i < n; i++) y[i] = x[i] + 1;
  launches++;
  last_stream = stream;
  return 0;
}
int Twice(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  for (int64_t i = 0, n = count(ndims, shapes); i < n; i++) y[i] = 2 * x[i];
  launches++;
  last_stream = stream;
  return 0;
}
int Plus(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra) {
  const float *a = static_cast<const float *>(params[0]);
  const float *b = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  for (int64_t i = 0, n = count(ndims, shapes); i < n; i++) y[i] = a[i] + b[i];
  launches++;
  last_stream = stream;
  return 0;
}
}
"""

STREAM = 0x5A0  # a caller's stream handle (the fake takes any)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.delenv("OPFORGE_CUDA_GRAPHS", raising=False)
    return fake_cuda_runtime(monkeypatch)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-graph") / "fake_gpu_graph.cc"
    path.write_text(KERNELS)
    return path


def gpu_op(fresh, source, name, function, arity=1, device="gpu"):
    args = ", ".join(f"Tensor x{k}" for k in range(arity))
    op = declare(fresh, f"tgg::{name}({args}) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:{function}", device=device, dtypes={"x0": ["float32"]})
    return op


@pytest.fixture
def chain(fresh, source):
    """y = 2 * (a + 1) + b, three GPU nodes; and the kernels' library, to read its counters."""
    inc, twice = gpu_op(fresh, source, "inc", "Inc"), gpu_op(fresh, source, "twice", "Twice")
    plus = gpu_op(fresh, source, "plus", "Plus", arity=2)
    spec = opforge.TensorSpec([2, 3], "float32")
    graph = opforge.trace(lambda a, b: plus(twice(inc(a)), b), spec, spec, name="chain")
    library = inc.kernels[0].load().library.handle
    return graph, library


def counter(library, name, ctype=ctypes.c_long):
    return ctype.in_dll(library, name).value


def inputs(seed):
    a = np.arange(6, dtype=np.float32).reshape(2, 3) + seed
    return a, np.full((2, 3), 10 * seed, np.float32)


def call(graph, a, b):
    return graph(FakeCudaArray(a), FakeCudaArray(b))


def values(result):
    """A result's values (a copy: the buffer goes with the result)."""
    return result.array.copy()


def test_a_graph_on_device_arrays_is_captured_once_and_replayed(fake, chain):
    graph, library = chain
    start = counter(library, "launches")
    with opforge.cuda.stream(STREAM):
        a, b = inputs(1)
        first = call(graph, a, b)  # a warm-up: node by node on the caller's stream
        assert isinstance(first, FakeCudaArray)
        np.testing.assert_array_equal(first.array, 2 * (a + 1) + b)
        assert counter(library, "launches") - start == 3
        assert counter(library, "last_stream", ctypes.c_void_p) == STREAM
        assert fake.fake_cuda_calls(b"cudaStreamBeginCapture") == 0

        a, b = inputs(2)
        second = call(graph, a, b)  # captured (the fake runs kernels while capturing) and launched
        np.testing.assert_array_equal(second.array, 2 * (a + 1) + b)
        assert counter(library, "launches") - start == 6
        captured_on = counter(library, "last_stream", ctypes.c_void_p)
        assert captured_on not in (None, STREAM)  # opforge's own capture stream, whatever the caller's is
        assert fake.fake_cuda_calls(b"cudaStreamBeginCapture") == 1
        assert fake.fake_cuda_calls(b"cudaGraphInstantiate") == 1
        assert fake.fake_cuda_calls(b"cudaGraphLaunch") == 1
        assert fake.fake_cuda_last_stream() == STREAM  # the output copy, after the launch, on the caller's stream

        mallocs = fake.fake_cuda_calls(b"cudaMallocFromPoolAsync")
        later = [call(graph, *inputs(3 + k)) for k in range(3)]
        assert counter(library, "launches") - start == 6  # no kernel launched node by node: one graph launch
        assert fake.fake_cuda_calls(b"cudaGraphLaunch") == 4
        assert fake.fake_cuda_calls(b"cudaStreamBeginCapture") == 1
        # Per call: one fresh output buffer, one copy per input and per output; nothing else.
        assert fake.fake_cuda_calls(b"cudaMallocFromPoolAsync") - mallocs == 3
        assert fake.fake_cuda_calls(b"cudaMemcpyAsync") >= 3 * 3
    for name in (b"cudaMalloc", b"cudaFree", b"cudaDeviceSynchronize", b"cudaStreamSynchronize"):
        assert fake.fake_cuda_calls(name) == 0, name
    # Each output is its own buffer: a later call never writes an earlier result.
    pointers = {o.array.ctypes.data for o in [first, second] + later}
    assert len(pointers) == 5
    np.testing.assert_array_equal(second.array, 2 * (inputs(2)[0] + 1) + inputs(2)[1])
    assert fake.fake_cuda_capturing() == 0


def test_cuda_graphs_off_launches_node_by_node(fake, chain, monkeypatch):
    monkeypatch.setenv("OPFORGE_CUDA_GRAPHS", "0")
    graph, library = chain
    start = counter(library, "launches")
    for seed in range(4):
        a, b = inputs(seed)
        np.testing.assert_array_equal(values(call(graph, a, b)), 2 * (a + 1) + b)
    assert counter(library, "launches") - start == 12
    assert fake.fake_cuda_calls(b"cudaStreamBeginCapture") == 0
    assert fake.fake_cuda_calls(b"cudaGraphLaunch") == 0
    assert fake.fake_cuda_calls(b"cudaMalloc") == 0


def test_a_launch_error_during_capture_is_a_cuda_error_naming_the_node(fake, chain):
    graph, _ = chain
    a, b = inputs(1)
    call(graph, a, b)
    fake.fake_cuda_inject_error(1, 0)  # the next cudaGetLastError: the first node's launch check, in the capture
    node = next(n for n in graph.nodes if not n.is_constant)
    with pytest.raises(opforge.CudaError, match=rf"graph 'chain': node '{node.name}': op 'tgg::inc': kernel 'Inc'"):
        call(graph, a, b)
    assert fake.fake_cuda_capturing() == 0  # the capture was ended: the stream is usable
    np.testing.assert_array_equal(values(call(graph, a, b)), 2 * (a + 1) + b)  # captured this time
    assert fake.fake_cuda_calls(b"cudaStreamBeginCapture") == 2
    assert fake.fake_cuda_calls(b"cudaGraphLaunch") == 1


def test_kernels_that_cannot_be_captured_run_node_by_node(fake, chain):
    graph, library = chain
    a, b = inputs(1)
    call(graph, a, b)
    fake.fake_cuda_inject_error(906, 0)  # cudaErrorStreamCaptureImplicit: a kernel used the legacy stream
    np.testing.assert_array_equal(values(call(graph, a, b)), 2 * (a + 1) + b)
    start = counter(library, "launches")
    a, b = inputs(5)
    np.testing.assert_array_equal(values(call(graph, a, b)), 2 * (a + 1) + b)
    assert counter(library, "launches") - start == 3
    assert fake.fake_cuda_calls(b"cudaStreamBeginCapture") == 1  # not tried again
    assert fake.fake_cuda_calls(b"cudaGraphLaunch") == 0
    assert fake.fake_cuda_capturing() == 0


def test_a_call_on_another_stream_waits_for_the_arena_s_last_user(fake, chain):
    graph, _ = chain
    a, b = inputs(1)
    with opforge.cuda.stream(STREAM):
        call(graph, a, b)
        call(graph, a, b)
    assert fake.fake_cuda_calls(b"cudaStreamWaitEvent") == 0
    with opforge.cuda.stream(STREAM + 16):
        call(graph, a, b)
        call(graph, a, b)
    assert fake.fake_cuda_calls(b"cudaEventRecord") == 1
    assert fake.fake_cuda_calls(b"cudaStreamWaitEvent") == 1


def test_graph_outputs_order_a_consumer_s_stream_and_are_freed_after_it(fake, chain):
    graph, _ = chain
    OtherStream = consumer_library("otherstream", lambda exported: fake_cuda_from_dlpack(exported, stream=0x7000))
    a, b = inputs(2)
    start = fake.fake_cuda_log_size()
    with opforge.cuda.stream(STREAM):
        y = graph(OtherStream(a), OtherStream(b))
    np.testing.assert_array_equal(y.array, 2 * (a + 1) + b)
    log = [(name, stream) for name, stream, _, _ in fake_cuda_log(fake, start)]
    assert [e for e in log if "Event" in e[0]] == [("cudaEventRecord", STREAM), ("cudaStreamWaitEvent", 0x7000)]
    start = fake.fake_cuda_log_size()
    del y  # the consumer lets go: the free waits for its stream
    log = [(name, stream) for name, stream, _, _ in fake_cuda_log(fake, start)]
    assert log == [("cudaEventRecord", 0x7000), ("cudaStreamWaitEvent", STREAM), ("cudaFreeAsync", STREAM)]


def test_a_node_without_a_gpu_kernel_is_a_device_error(fake, fresh, source):
    inc = gpu_op(fresh, source, "inc_cpu", "Inc", device="cpu")
    graph = opforge.trace(lambda a: inc(a), opforge.TensorSpec([3], "float32"))
    with pytest.raises(opforge.DeviceError, match=r"op 'tgg::inc_cpu' has no gpu kernel"):
        graph(FakeCudaArray(np.zeros(3, np.float32)))


def test_a_node_with_a_python_gpu_kernel_is_a_device_error(fake, fresh):
    op = declare(fresh, "tgg::py_gpu(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: x, device="gpu")
    graph = opforge.trace(lambda a: op(a), opforge.TensorSpec([3], "float32"))
    node = graph.nodes[0]
    with pytest.raises(opforge.DeviceError, match=rf"graph '<lambda>': node '{node.name}' \(op 'tgg::py_gpu'\): its GPU "
                                                  r"kernel '.*' is a Python function"):
        graph(FakeCudaArray(np.zeros(3, np.float32)))


def test_a_failing_gpu_kernel_in_a_graph_is_a_kernel_error(fake, fresh, tmp_path):
    path = tmp_path / "fails.cc"
    path.write_text('#include <stdint.h>\nextern "C" int Fails(int n, void **p, int *d, int64_t **s, const char **t, '
                    'void *stream, void *extra) { return 7; }\n')
    op = declare(fresh, "tgg::fails(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{path}:Fails", device="gpu")
    graph = opforge.trace(lambda a: op(a), opforge.TensorSpec([3], "float32"))
    for _ in range(2):  # eagerly, then while capturing
        with pytest.raises(opforge.KernelError, match=r"tgg::fails.*Fails"):
            graph(FakeCudaArray(np.zeros(3, np.float32)))
        assert fake.fake_cuda_capturing() == 0


def test_outputs_that_are_inputs_are_fresh_copies(fake, fresh, source):
    inc = gpu_op(fresh, source, "inc", "Inc")
    graph = opforge.trace(lambda a: (inc(a), a), opforge.TensorSpec([3], "float32"))
    x = FakeCudaArray(np.array([1, 2, 3], np.float32))
    for _ in range(3):
        y, same = graph(x)
        np.testing.assert_array_equal(y.array, [2, 3, 4])
        np.testing.assert_array_equal(same.array, [1, 2, 3])
        assert same.array.ctypes.data != x.array.ctypes.data


def test_constants_go_to_the_device_once_per_plan(fake, fresh, source):
    plus = gpu_op(fresh, source, "plus", "Plus", arity=2)
    graph = opforge.trace(lambda a: plus(a, np.array([5, 6, 7], np.float32)), opforge.TensorSpec([3], "float32"))
    assert sum(n.is_constant for n in graph.nodes) == 1
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(values(graph(FakeCudaArray(x))), [6, 8, 10])
    copies = fake.fake_cuda_calls(b"cudaMemcpyAsync")
    np.testing.assert_array_equal(values(graph(FakeCudaArray(x + 1))), [7, 9, 11])  # captured
    graph(FakeCudaArray(x))
    assert fake.fake_cuda_calls(b"cudaMemcpyAsync") - copies == 4  # per call: the input in, the output out


def test_cpu_arrays_still_take_the_cpu_plan(fake, fresh, source):
    inc = gpu_op(fresh, source, "inc_host", "Inc", device="cpu")
    graph = opforge.trace(lambda a: inc(a), opforge.TensorSpec([3], "float32"))
    np.testing.assert_array_equal(graph(np.ones(3, np.float32)), [2, 2, 2])
    assert fake.fake_cuda_calls(b"cudaMallocFromPoolAsync") == 0


# -- a real GPU ---------------------------------------------------------------------
CUDA_KERNEL = r"""
#include <stdint.h>
__global__ void axpb(const float *x, float *y, int64_t n, float a, float b) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
extern "C" int Step(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  axpb<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
      (const float *)params[0], (float *)params[1], n, 0.5f, 1.0f);
  return 0;
}
"""


class DeviceArray:
    """Real device memory (from opforge's pool) presented through DLPack as CUDA device 0."""

    def __init__(self, buffer, shape, dtype, owner=None):
        self.buffer, self.shape, self.dtype = buffer, tuple(shape), np.dtype(dtype)
        self.owner = owner  # what keeps imported memory alive

    @classmethod
    def of(cls, array):
        array = np.ascontiguousarray(array)
        buffer = cuda.allocate(array.nbytes, 0)
        _memcpy(buffer.pointer, array.ctypes.data, array.nbytes, 1)  # synchronous, after the allocation
        return cls(buffer, array.shape, array.dtype)

    @property
    def pointer(self):
        return self.buffer if isinstance(self.buffer, int) else self.buffer.pointer

    def numpy(self):
        out = np.empty(self.shape, self.dtype)
        _memcpy(out.ctypes.data, self.pointer, out.nbytes, 2)
        return out

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        export = _native.DLPackExport(self.pointer, self.shape, self.dtype.name, 2, 0, self)
        return export.__dlpack__(max_version=max_version)


def from_dlpack(exported):
    """This module as an array library: opforge hands graph outputs back through it."""
    view = _native.DLTensorView(exported.__dlpack__(max_version=(1, 0)))
    return DeviceArray(view.data, view.shape, view.dtype, owner=view)


def _memcpy(destination, source, nbytes, kind):
    lib = cuda.runtime()
    code = lib.cudaMemcpy(ctypes.c_void_p(destination), ctypes.c_void_p(source), ctypes.c_size_t(nbytes),
                          ctypes.c_int(kind))
    assert code == 0, f"cudaMemcpy: cudaError {code}"


@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA device (opforge.runtime.cuda.device_count() == 0)")
def test_a_captured_graph_replays_on_a_real_gpu(fresh, tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_CUDA_GRAPHS", raising=False)
    path = tmp_path / "step.cu"
    path.write_text(CUDA_KERNEL)
    step = declare(fresh, "tgg::step(Tensor x) -> Tensor y")
    step.def_infer(opforge.infer.same_as(0))
    step.kernel(source=f"{path}:Step", device="gpu")

    def chain(x):
        for _ in range(20):
            x = step(x)
        return x

    graph = opforge.trace(chain, opforge.TensorSpec([1000], "float32"))
    lib = cuda.runtime()
    own = ctypes.c_void_p()
    assert lib.cudaStreamCreateWithFlags(ctypes.byref(own), 1) == 0
    for stream in (0, own.value):  # the legacy default stream (which cannot be captured), then a stream of its own
        with opforge.cuda.stream(stream):
            results = []
            for seed in range(5):
                x = np.arange(1000, dtype=np.float32) + seed
                y = graph(DeviceArray.of(x))
                assert isinstance(y, DeviceArray) and y.shape == (1000,)
                for _ in range(20):
                    x = np.float32(0.5) * x + np.float32(1)
                results.append((y, x))
            opforge.cuda.synchronize(stream)
            for y, expected in results:  # earlier outputs were not overwritten by later calls
                np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)
    (plan,) = [p for p in graph._executor.plans.values() if hasattr(p, "captures")]
    assert plan.captures == 1 and plan.mode == "graph" and plan.capture_error is None
    # An int stream must outlive what was made on it: the outputs and the graph's memory are freed on it.
    del results, y, plan, graph
    gc.collect()
    opforge.cuda.synchronize(own.value)
    lib.cudaStreamDestroy(own)
