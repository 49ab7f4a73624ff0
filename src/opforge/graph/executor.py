"""Running a Graph on arrays.

For each distinct input signature (shapes, dtypes) the executor makes a plan
once: whole-graph inference with the concrete shapes, a kernel per node (the
layout pass's choice, else dispatch), Init per node, and a memory plan that
places every intermediate in one arena, reusing the space of values whose
lifetimes are over, with one workspace region shared by all nodes.  When
every node has a native CPU kernel the plan is a ``_native.Program`` that
runs all kernels in C (a ``view`` op's output -- reshape, squeeze, unsqueeze
-- is its input's memory there, and a concat along an axis with only size-1
dims before it has its parts made in place, one after another in its output:
neither runs a kernel); otherwise, and in checked mode (guard pages for every
buffer, see ``runtime.checks``), nodes run one by one through their kernels.
Every buffer a kernel writes is followed by room for a canary that the
program checks after each step.  A new input shape makes a new plan; a known
one reuses its plan.

Arrays of another kind (torch, JAX, CuPy, ...) are taken through DLPack and
the outputs handed back as that kind.  Arrays in GPU memory run the whole
graph on the GPU (``DevicePlan``): a GPU kernel per node, intermediates and
workspaces in one pooled device arena laid out by the same memory plan, every
launch on the caller's stream, no synchronization; from the second call on,
the launches are captured once into a CUDA graph and replayed with one
``cudaGraphLaunch`` per call (``OPFORGE_CUDA_GRAPHS=0``: launches node by node).
"""
from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, cast

import numpy as np

from .. import _native
from ..bounded_cache import BoundedCache
from ..errors import AllocationError, ArityError, CudaError, DeviceError, OpforgeError
from ..runtime.aot import WORKSPACE_ALIGN, AotKernel, present, workspace_sizes
from ..runtime import cpu
from ..runtime.arrays import CUDA, device_name, host_view, placement
from ..runtime.cuda_graph import copy_async
from ..runtime.checks import checks_enabled
from ..runtime.dispatch import kernel_error, select_kernel, skips_kernel
from ..spec import TensorSpec
from .fusion import fuse_steps
from .passes import infer_shapes, plan_memory

if TYPE_CHECKING:  # (annotations only: nothing here runs)
    from collections.abc import Callable, Sequence
    from typing import Any, TypeAlias, TypeVar

    import numpy.typing as npt

    from ..operator import Kernel
    from ..runtime.arrays import Placement
    from ..runtime.cuda import DeviceBuffer
    from ..runtime.cuda_graph import CapturedGraph
    from .ir import Graph, Node, Value

    _K = TypeVar("_K", bound=Kernel)
    #: One op node of a plan: (node, its kernel, input specs (None: an absent optional input), output specs).
    Step: TypeAlias = tuple[Node, _K, list[TensorSpec | None], list[TensorSpec]]
    #: (buffer, offset): where a value lives; buffer 0 is the arena.
    Ref: TypeAlias = tuple[int, int]
    #: One node of a DevicePlan: (node, kernel, pointer refs, shapes, dtype names, Init's state,
    #: whether the kernel is skipped, every output being empty).
    DeviceStep: TypeAlias = tuple[Node, AotKernel, tuple[Ref, ...], tuple[tuple[int, ...], ...], tuple[str, ...],
                                  Any, bool]

MAX_PLANS = 16


def _as_array(value: object) -> npt.NDArray[Any]:
    array = np.asarray(value)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array if array.flags.c_contiguous and array.flags.aligned else array.copy(order="C")


class Executor:
    """Runs a graph: one plan (kernels, memory) per input signature, kept for reuse."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        # a Plan per (ISA cap, *signature), a DevicePlan per ("cuda", device id, signature)
        self.plans: BoundedCache[tuple[object, ...], Any] = BoundedCache(MAX_PLANS)

    def plan_for(self, arrays: Sequence[npt.NDArray[Any]]) -> Plan:
        key = (cpu.isa_cap(), *[(a.shape, a.dtype) for a in arrays])  # a new cap re-chooses kernels
        plan: Plan | None = self.plans.get(key)
        return plan if plan is not None else self.plans.get_or_create(key, lambda: Plan(self.graph, arrays))

    def run(self, arrays: Sequence[Any], where: Placement | None = None) -> Any:
        """The graph's outputs for ``arrays``; ``where``: their Placement, if the caller knows it."""
        graph = self.graph
        if where is None and len(arrays) == len(graph.inputs):  # the common case first: aligned NumPy arrays
            key = (cpu.isa_cap(), *[(a.shape, a.dtype) if type(a) is np.ndarray and a.flags.c_contiguous
                                    and a.flags.aligned and a.dtype.isnative else None for a in arrays])
            plan: Plan | None = self.plans.get(key)
            if plan is not None:
                outputs = plan.execute(arrays)
                return tuple(outputs) if graph.tuple_output else outputs[0]
        if len(arrays) != len(graph.inputs):
            raise ArityError(f"graph '{graph.name}' takes {len(graph.inputs)} input(s), got {len(arrays)}")
        if where is None and not all(type(a) is np.ndarray for a in arrays):
            if not all(isinstance(a, np.ndarray) for a in arrays):
                where = placement(graph, arrays)
        if where is not None:  # torch, JAX, CuPy, ... arrays, or arrays on a GPU
            return self._run_placed(where, arrays)
        arrays = [_as_array(a) for a in arrays]
        outputs = self.plan_for(arrays).execute(arrays)
        return tuple(outputs) if graph.tuple_output else outputs[0]

    def _run_placed(self, where: Placement, arrays: Sequence[Any]) -> Any:
        graph = self.graph
        if where.on_host:  # the NumPy path on views of the same memory
            views = where.views or [host_view(graph, k, a) for k, a in enumerate(arrays)]
            views = [_as_array(v) for v in views]
            outputs = self.plan_for(views).execute(views)
        else:
            outputs = self._run_on_device(where, arrays)
        if where.from_dlpack is None:  # arrays of a library without from_dlpack: the DLPack exports themselves
            return tuple(outputs) if graph.tuple_output else outputs[0]
        return where.wrap_result(graph, tuple(outputs) if graph.tuple_output else outputs[0])

    def _run_on_device(self, where: Placement, arrays: Sequence[Any]) -> list[Any]:
        from ..runtime import cuda
        from ..runtime.device_call import device_views

        device_type, device_id = where.device
        if device_type != CUDA:
            raise DeviceError(f"graph '{self.graph.name}': its inputs are on {device_name(where.device)}; opforge "
                              "runs graphs on the CPU and on CUDA devices")
        with cuda.on_device(device_id):
            stream, consumer = cuda.call_stream(where.kind, device_id)
            views = device_views(self.graph, arrays, stream, consumer, where.device)
            key = ("cuda", device_id, tuple((v.shape, v.dtype) for v in views))
            plan: DevicePlan = self.plans.get_or_create(key, lambda: DevicePlan(self.graph, views, device_id, stream))
            return plan.execute(views, stream)


def plan_nodes(graph: Graph, input_specs: Sequence[TensorSpec],
               kernel_for: Callable[[Node, list[TensorSpec | None]], _K]
               ) -> tuple[dict[int, TensorSpec], list[Step[_K]]]:
    """({value id: concrete spec}, [(node, kernel, input specs, output specs)] per op node):
    shapes from whole-graph inference, layouts from the graph (the layout pass's choice),
    kernels from ``kernel_for(node, input specs)``."""
    inferred = infer_shapes(graph, input_specs)
    specs = {value.id: inferred[value.id] for value in graph.inputs}
    steps = []
    for node in graph.nodes:
        for value in node.outputs:
            spec = inferred[value.id]
            specs[value.id] = TensorSpec(spec.shape, spec.dtype, value.spec.layout)
        if node.is_constant:
            continue
        in_specs = [None if v is None else specs[v.id] for v in node.inputs]
        out_specs = [specs[v.id] for v in node.outputs]
        for spec in out_specs:
            node.op.check_output_shape(spec)
        steps.append((node, kernel_for(node, in_specs), in_specs, out_specs))
    return specs, steps


def _home(value_id: int, views: dict[int, int], placed: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(id of the value that owns a value's memory, byte offset in it): itself, a view's source, or the output of
    the concat it is made in place in (in turn in place in another, ...)."""
    offset = 0
    while True:
        if value_id in views:
            value_id = views[value_id]
        elif value_id in placed:
            value_id, at = placed[value_id]
            offset += at
        else:
            return value_id, offset


class Plan:
    steps: list[Step[Any]]  # AotKernels where every step is native (the program), else any kernels

    def __init__(self, graph: Graph, arrays: Sequence[npt.NDArray[Any]]) -> None:
        self.graph = graph
        self.specs, steps = plan_nodes(graph, [TensorSpec.of(a) for a in arrays], self._kernel_for)
        self.steps, self.fused = fuse_steps(graph, steps)
        self.program = self._compile() if all(self._native(step) for step in self.steps) else None

    @staticmethod
    def _kernel_for(node: Node, in_specs: list[TensorSpec | None]) -> Kernel:
        """The node's pinned kernel (layout pass, a loaded graph) if it can run
        here under the ISA cap; else the best kernel of the same layout."""
        pinned = node.kernel
        if pinned is None:
            return select_kernel(node.op, in_specs)
        if pinned.reject_reason(node.op, in_specs) is None and (
                pinned.isa is None or cpu.isa_reject_reason(pinned.isa) is None):
            return pinned
        same_layout = [k for k in node.op.kernels if k.layout == pinned.layout]
        return select_kernel(node.op, in_specs, kernels=same_layout)

    def _native(self, step: Step[Any]) -> bool:
        node, kernel, in_specs, out_specs = step
        if not (isinstance(kernel, AotKernel) and kernel.device == "cpu"):
            return False
        return not skips_kernel(node.op, out_specs)

    # -- the native program ---------------------------------------------------
    def _views(self) -> dict[int, int]:
        """{value id: id of the value whose memory it is}: the outputs of ``view`` ops (reshape, squeeze,
        ...) that need no memory of their own -- same bytes and dtype as their input, plain layout, and
        not a graph output (those are new arrays) -- resolved to the value that owns the memory."""
        graph_outputs = {v.id for v in self.graph.outputs}
        views: dict[int, int] = {}
        for node, _, in_specs, out_specs in self.steps:
            if "view" not in node.op.traits or len(node.outputs) != 1 or node.outputs[0].id in graph_outputs:
                continue
            source, given, made = node.inputs[0], in_specs[0], out_specs[0]
            if source is None or given is None or (given.nbytes, given.dtype, given.layout) != \
                    (made.nbytes, made.dtype, made.layout) or made.layout != "ndarray":
                continue
            views[node.outputs[0].id] = views.get(source.id, source.id)
        return views

    def _in_place(self, views: dict[int, int]) -> dict[int, tuple[int, int]]:
        """{value id: (id of a concat's output, byte offset)}: the inputs of concats along an axis with nothing
        but size-1 dims before it, whose parts are then slices of the output, one after another -- each part
        (a view's source, for a view) made there by its producer (a step with that one output; not a graph
        input, output or constant, nor a part of another concat), and the concat left with nothing to do."""
        graph_ends = {v.id for v in self.graph.inputs} | {v.id for v in self.graph.outputs}
        producer = {node.outputs[0].id: node for node, *_ in self.steps if len(node.outputs) == 1}  # one output
        placed: dict[int, tuple[int, int]] = {}
        for node, _, in_specs, out_specs in self.steps:
            made = out_specs[0]
            if node.op.name != "concat" or len(node.outputs) != 1 or made.layout != "ndarray":
                continue
            axis = cast(int, node.attrs["axis"]) % max(len(made.shape), 1)
            parts = [views.get(v.id, v.id) for v in node.inputs if v is not None]  # a view: its source moves
            if (math.prod(made.shape[:axis]) != 1 or len(parts) != len(node.inputs) or len(set(parts)) != len(parts)
                    or any(p not in producer or p in graph_ends or p in placed for p in parts)
                    or any(spec is None or spec.layout != "ndarray" for spec in in_specs)):
                continue
            offset = 0
            for part, spec in zip(parts, in_specs):
                placed[part] = (node.outputs[0].id, offset)
                offset += spec.nbytes  # type: ignore[union-attr]  # (checked above: no spec is None)
        # The canary after a part lies on what follows it; its producer must not read there (the canary is
        # written before the kernel runs).  Concats that would have that are copied after all.
        while True:
            broken = set()
            for part, (concat, _) in placed.items():
                owner, at = _home(part, views, placed)
                canary = (at + self.specs[part].nbytes, at + self.specs[part].nbytes + _native.CANARY_BYTES)
                for value in producer[part].inputs:
                    if value is None:
                        continue
                    read_owner, read_at = _home(value.id, views, placed)
                    if read_owner == owner and read_at < canary[1] and read_at + self.specs[value.id].nbytes > canary[0]:
                        broken.add(concat)
            if not broken:
                return placed
            placed = {part: where for part, where in placed.items() if where[0] not in broken}

    def _compile(self) -> Any:  # a _native.Program
        graph = self.graph
        views = self._views()  # run no kernel: their values share their source's memory
        placed = self._in_place(views)  # made where a concat would copy them to

        def home(value_id: int) -> tuple[int, int]:
            return _home(value_id, views, placed)

        concats_done = {concat for concat, _ in placed.values()}  # (a concat is placed whole, or not at all)
        run = [step for step in self.steps  # (checked mode runs them all)
               if step[0].outputs[0].id not in views and step[0].outputs[0].id not in concats_done]
        position: dict[int, int] = {}  # memory owner's value id -> first step that writes into it
        last_use: dict[int, int] = {}  # memory owner's value id -> last step that reads it
        for index, (node, _, _, _) in enumerate(run):
            for value in node.outputs:
                position.setdefault(home(value.id)[0], index)
            for value in node.inputs:  # type: ignore[assignment]
                if value is not None:  # (an absent input: one its kernel is made without)
                    last_use[home(value.id)[0]] = index  # a view's or a part's reader keeps its memory alive
        buffers: dict[int, Ref] = {}  # value id -> (buffer index, offset)
        for k, value in enumerate(graph.inputs):
            buffers[value.id] = (1 + k, 0)
        self.output_slots: list[int] = []
        next_buffer = 1 + len(graph.inputs)
        made = {v.id for node, *_ in self.steps for v in node.outputs}
        for value in graph.outputs:
            if value.id not in buffers and value.id in made and value.id not in self.output_slots:
                buffers[value.id] = (next_buffer, 0)
                self.output_slots.append(value.id)
                next_buffer += 1
        self.constants: list[npt.NDArray[Any]] = []
        for node in graph.nodes:
            if node.is_constant:
                buffers[node.outputs[0].id] = (next_buffer, 0)
                self.constants.append(np.ascontiguousarray(node.value))
                next_buffer += 1
        intermediates = [v for node, _, _, _ in self.steps for v in node.outputs
                         if v.id not in buffers and home(v.id)[0] == v.id]
        sizes = [self.specs[v.id].nbytes for v in intermediates]
        lifetimes = [(position[v.id], last_use.get(v.id, position[v.id])) for v in intermediates]
        offsets, arena = plan_memory([size + _native.CANARY_BYTES for size in sizes], lifetimes)
        for value, offset in zip(intermediates, offsets):
            buffers[value.id] = (0, offset)
        for value_id in [*views, *placed]:
            owner, at = home(value_id)
            buffers[value_id] = (buffers[owner][0], buffers[owner][1] + at)

        largest: tuple[str, str, Sequence[int]] | None  # the largest workspace: (op, Init function, requested)
        steps, workspace_bytes, largest = [], 0, None
        prepared = []
        for node, kernel, given, out_specs in run:
            in_specs = present(given)  # (the ABI passes present inputs only: see Kernel.absent_inputs)
            kernel.load()
            extra, requested = kernel.signature_state(node.op, in_specs + out_specs, node.attrs)
            sizes_ws = workspace_sizes(requested, max((s.nbytes for s in in_specs), default=0), op=node.op.name,
                                       function=kernel.function_name + "Init")
            node_bytes = sum(sizes_ws) + _native.CANARY_BYTES * len(sizes_ws)
            if node_bytes > workspace_bytes:
                workspace_bytes, largest = node_bytes, (node.op.name, kernel.function_name + "Init", requested)
            prepared.append((node, kernel, in_specs, out_specs, extra, sizes_ws))
        workspace_at = -(-arena // 64) * 64
        for node, kernel, in_specs, out_specs, extra, sizes_ws in prepared:
            refs = ([buffers[v.id] for v in node.inputs if v is not None]
                    + [buffers[v.id] for v in node.outputs])
            cursor = workspace_at
            for size in sizes_ws:
                refs.append((0, cursor))
                cursor += size + _native.CANARY_BYTES
            written = tuple(s.nbytes for s in out_specs) + tuple(sizes_ws)  # each with a canary after it
            steps.append((kernel._function, tuple(refs), tuple(s.shape for s in in_specs + out_specs),
                          tuple(s.dtype for s in in_specs + out_specs), extra, written))
        self.arena_bytes = workspace_at + workspace_bytes
        self.report = {"planned_bytes": self.arena_bytes, "intermediate_bytes": arena,
                       "unplanned_bytes": sum(sizes) + workspace_bytes * len(prepared) if prepared else 0,
                       "workspace_bytes": workspace_bytes, "nodes": len(prepared), "fused": list(self.fused),
                       "views": len(views), "in_place": len(placed)}
        self.largest_workspace = largest
        self.arena: npt.NDArray[np.uint8] | None = None  # allocated by the first run (checked mode never needs it)
        # where each graph output comes from, found by the first run
        self.results: list[tuple[str, Any]] | None = None
        self.n_buffers = next_buffer
        self.buffers = buffers
        self.kernels = [(node, kernel) for node, kernel, *_ in prepared]
        return _native.Program(steps, next_buffer)

    def _new_arena(self) -> npt.NDArray[np.uint8]:
        try:
            # Every offset in the arena (intermediates, workspaces) is a multiple of 64: so must its start be.
            size = max(self.arena_bytes, 1)
            raw = np.empty(size + WORKSPACE_ALIGN, np.uint8)
            start = -raw.ctypes.data % WORKSPACE_ALIGN
            return raw[start:start + size]
        except (MemoryError, ValueError):
            message = (f"graph '{self.graph.name}': cannot allocate its arena of {self.arena_bytes} bytes "
                       f"({self.report['intermediate_bytes']} for intermediates, "
                       f"{self.report['workspace_bytes']} for workspaces)")
            if self.largest_workspace is None:
                raise AllocationError(message) from None
            op, function, requested = self.largest_workspace
            raise AllocationError(f"{message}; the largest workspace: op '{op}': {function} requested "
                                  f"{list(requested)} bytes", op=op, function=function) from None

    def _output(self, value_id: int) -> Any:  # a _native.empty array
        """A graph output buffer, with room for the canary the program checks."""
        spec = self.specs[value_id]
        shape = spec.shape if spec.layout == "ndarray" else (spec.nbytes // np.dtype(spec.dtype).itemsize,)
        try:
            return _native.empty(tuple(shape), np.dtype(spec.dtype))
        except MemoryError:
            raise AllocationError(f"graph '{self.graph.name}': cannot allocate output {spec} "
                                  f"({spec.nbytes} bytes)") from None

    def _results(self) -> list[tuple[str, Any]]:
        """Where each graph output comes from: ("made", output slot), ("input", k) or ("constant", array)."""
        graph = self.graph
        inputs = {v.id: k for k, v in enumerate(graph.inputs)}
        constants = {n.outputs[0].id: n.value for n in graph.nodes if n.is_constant}
        return [("made", self.output_slots.index(v.id)) if v.id in self.output_slots else
                ("input", inputs[v.id]) if v.id in inputs else ("constant", constants[v.id]) for v in graph.outputs]

    def execute(self, arrays: Sequence[Any]) -> list[Any]:
        if self.program is None or checks_enabled():
            return self._interpret(arrays)
        outputs = [self._output(vid) for vid in self.output_slots]
        # The plan's arena, or a new one on the first run and while another thread runs this plan.
        arena, self.arena = self.arena, None
        if arena is None:
            arena = self._new_arena()
        try:
            failure = self.program.run((arena, *arrays, *outputs, *self.constants))
        finally:
            self.arena = arena
        if failure is not None:
            index, rc, error = failure
            node, kernel = self.kernels[index]
            raise kernel_error(node.op, kernel, rc, error)
        if self.results is None:
            self.results = self._results()
        return [outputs[at] if how == "made" else np.array(arrays[at] if how == "input" else at)
                for how, at in self.results]

    # -- one node at a time -----------------------------------------------------
    def _interpret(self, arrays: Sequence[Any]) -> list[Any]:
        env = {v.id: a for v, a in zip(self.graph.inputs, arrays)}
        for node in self.graph.nodes:
            if node.is_constant:
                env[node.outputs[0].id] = node.value
        for node, kernel, in_specs, out_specs in self.steps:
            inputs = [None if v is None else env[v.id] for v in node.inputs]
            if skips_kernel(node.op, out_specs):
                results = [np.empty(s.shape, s.dtype) for s in out_specs]
            else:
                results = kernel.run(node.op, inputs, node.attrs, out_specs, in_specs)
            for value, array in zip(node.outputs, results):
                env[value.id] = array
        return [np.array(env[v.id]) if v.producer is None or v.producer.is_constant else env[v.id]
                for v in self.graph.outputs]

    def memory_report(self) -> dict[str, Any]:
        """Arena bytes with planning, and what one buffer per value would take."""
        if self.program is None:
            raise OpforgeError(f"graph '{self.graph.name}': memory is planned only when every node has a native "
                               "CPU kernel")
        return dict(self.report)


_IO_ALIGN = 256  # cudaMalloc's alignment, which vectorized kernels rely on


class DevicePlan:
    """A graph on CUDA arrays of one signature, planned once: a GPU kernel and Init per
    node, intermediates and workspaces at fixed offsets of one device arena.

    The first call launches node by node (a warm-up: kernels may do one-time work
    a capture cannot record); the second captures the same launches into a CUDA
    graph, which every later call replays with one ``cudaGraphLaunch``.  A captured
    graph keeps the addresses it was captured with, so it reads its inputs from,
    and writes its outputs to, buffers of the plan's own (``io``): each call copies
    its inputs in and its outputs out to fresh pooled buffers (one device-to-device
    copy each, outside the graph, since a copy inside it would keep the first
    call's addresses too).  Re-capturing when input addresses change was the other
    choice, but a framework's allocator gives no promise of the same address from
    one call to the next, and capture + instantiate costs far more than copying the
    small tensors graphs are for.  A returned output is its own buffer: the next
    call never writes it.
    """

    def __init__(self, graph: Graph, views: Sequence[Any], device_id: int, stream: int) -> None:
        from ..runtime import cuda

        self.graph, self.device_id = graph, device_id
        self.specs, steps = plan_nodes(graph, [TensorSpec(v.shape, v.dtype) for v in views],
                                       lambda node, in_specs: self._kernel_for(graph, node, in_specs))

        refs, intermediate_bytes = self._place_values(steps)
        self.steps, self.arena_bytes = self._prepare_steps(steps, refs, intermediate_bytes)

        # The io buffer a captured graph reads its inputs from and writes its outputs to.
        io_sizes = [v.nbytes for v in views] + [self.specs[i].nbytes for i in self.output_ids]
        self.io_offsets = [sum(-(-n // _IO_ALIGN) * _IO_ALIGN for n in io_sizes[:k]) for k in range(len(io_sizes))]
        self.io_bytes = sum(-(-n // _IO_ALIGN) * _IO_ALIGN for n in io_sizes)

        # Graph outputs no node makes (an input, a constant) are copied into fresh buffers.
        # per graph output: ("made", index in output_ids) or ("copy", buffer index)
        self.results: list[tuple[str, int]] = []
        for value in graph.outputs:
            if value.id in self.output_ids:
                self.results.append(("made", self.output_ids.index(value.id)))
            else:
                self.results.append(("copy", refs[value.id][0]))

        self.arena = cuda.allocate(self.arena_bytes, stream, device_id)
        self.constants: list[tuple[DeviceBuffer, npt.NDArray[Any]]] = []
        for node in (n for n in graph.nodes if n.is_constant):
            host = np.ascontiguousarray(node.value)
            buffer = cuda.allocate(host.nbytes, stream, device_id)
            copy_async(buffer.pointer, host.ctypes.data, host.nbytes, stream, f"graph '{graph.name}': a constant",
                       from_host=True)
            self.constants.append((buffer, host))  # host stays alive while its copy may be pending
        self.io: DeviceBuffer | None = None
        self.captured: CapturedGraph | None = None
        self.capture_error: str | None = None  # why this plan runs eagerly for good (its kernels cannot be captured)
        self.calls = self.captures = 0
        self.stream = stream  # the stream the plan's buffers were last used on
        self.lock = threading.Lock()

    def _place_values(self, steps: list[Step[AotKernel]]) -> tuple[dict[int, Ref], int]:
        """Where each value lives, as (buffer, offset): buffer 0 is the arena (the
        intermediates, placed by the memory plan), then the graph's inputs, the
        outputs nodes make, the constants.  Returns (refs, intermediate bytes)."""
        graph = self.graph
        position: dict[int, int]
        last_use: dict[int, int]
        value: Value | None
        position, last_use = {}, {}
        for index, (node, *_) in enumerate(steps):
            for value in node.outputs:
                position[value.id] = index
            for value in node.inputs:
                if value is not None:
                    last_use[value.id] = index
        refs = {v.id: (1 + k, 0) for k, v in enumerate(graph.inputs)}
        self.output_ids: list[int] = []  # graph outputs a node makes, each once
        for value in graph.outputs:
            if value.id not in refs and value.id in position and value.id not in self.output_ids:
                refs[value.id] = (1 + len(graph.inputs) + len(self.output_ids), 0)
                self.output_ids.append(value.id)
        first_constant = 1 + len(graph.inputs) + len(self.output_ids)
        for k, node in enumerate(n for n in graph.nodes if n.is_constant):
            refs[node.outputs[0].id] = (first_constant + k, 0)
        intermediates = [v for node, *_ in steps for v in node.outputs if v.id not in refs]
        sizes = [self.specs[v.id].nbytes for v in intermediates]
        lifetimes = [(position[v.id], last_use.get(v.id, position[v.id])) for v in intermediates]
        offsets, intermediate_bytes = plan_memory(sizes, lifetimes)
        for value, offset in zip(intermediates, offsets):
            refs[value.id] = (0, offset)
        return refs, intermediate_bytes

    @staticmethod
    def _prepare_steps(steps: list[Step[AotKernel]], refs: dict[int, Ref],
                       intermediate_bytes: int) -> tuple[list[DeviceStep], int]:
        """Per node: Init's state and the (buffer, offset) of each pointer, workspaces in one
        region after the intermediates that all nodes share.  Returns (steps, arena bytes)."""
        workspace_at = -(-intermediate_bytes // _IO_ALIGN) * _IO_ALIGN
        prepared: list[DeviceStep]
        prepared, workspace_bytes = [], 0
        for node, kernel, given, out_specs in steps:
            in_specs = present(given)  # (the ABI passes present inputs only: see Kernel.absent_inputs)
            kernel.load()
            extra, requested = kernel.signature_state(node.op, in_specs + out_specs, node.attrs)
            sizes = workspace_sizes(requested, max((s.nbytes for s in in_specs), default=0), op=node.op.name,
                                    function=kernel.function_name + "Init")
            workspace_bytes = max(workspace_bytes, sum(sizes))
            pointers = ([refs[v.id] for v in node.inputs if v is not None]
                        + [refs[v.id] for v in node.outputs])
            cursor = workspace_at
            for size in sizes:  # multiples of 64
                pointers.append((0, cursor))
                cursor += size
            prepared.append((node, kernel, tuple(pointers), tuple(s.shape for s in in_specs + out_specs),
                             tuple(s.dtype for s in in_specs + out_specs), extra, skips_kernel(node.op, out_specs)))
        return prepared, workspace_at + workspace_bytes

    @staticmethod
    def _kernel_for(graph: Graph, node: Node, in_specs: list[TensorSpec | None]) -> AotKernel:
        pinned = node.kernel
        if pinned is not None and pinned.device == "gpu" and pinned.reject_reason(node.op, in_specs) is None:
            kernel = pinned
        else:
            kernel = select_kernel(node.op, in_specs, device="gpu")
        if not isinstance(kernel, AotKernel):
            raise DeviceError(f"graph '{graph.name}': node '{node.name}' (op '{node.op.name}'): its GPU kernel "
                              f"'{kernel.name}' is a Python function; a graph runs on the GPU with native kernels "
                              "only (add a .cu kernel)")
        return kernel

    @property
    def mode(self) -> str:
        """"graph" once captured, else "eager"."""
        return "graph" if self.captured is not None else "eager"

    def execute(self, views: Sequence[Any], stream: int) -> list[Any]:
        from ..runtime import cuda, cuda_graph

        with self.lock:
            if stream != self.stream:  # the arena's earlier users must be done before this stream writes it
                cuda_graph.order_after(self.stream, stream)
                self.stream = stream
                for buffer in [self.arena, self.io] + [c for c, _ in self.constants]:
                    if buffer is not None:
                        buffer.stream = stream  # freed after the last work that uses it
            use_graph = self.calls > 0 and self.capture_error is None and cuda_graph.enabled()
            self.calls += 1
            made = self._replay(views, stream) if use_graph else None
            if made is None:
                made = [cuda.allocate(self.specs[i].nbytes, stream, self.device_id) for i in self.output_ids]
                bases = [self.arena.pointer] + [v.data for v in views] + [b.pointer for b in made] + \
                        [c.pointer for c, _ in self.constants]
                for step in self.steps:
                    self._launch(step, bases, stream)
            sources = [self.arena.pointer] + [v.data for v in views] + [None] * len(self.output_ids) + \
                      [c.pointer for c, _ in self.constants]
            return [self._export(made[index] if how == "made" else self._copy(sources[index], value, stream), value)
                    for (how, index), value in zip(self.results, self.graph.outputs)]

    def _replay(self, views: Sequence[Any], stream: int) -> list[DeviceBuffer] | None:
        """One call through the captured graph (captured now if not yet); None when
        the kernels cannot be captured: the call then launches them eagerly."""
        from ..runtime import cuda, cuda_graph

        if self.io is None:
            self.io = cuda.allocate(self.io_bytes, stream, self.device_id)
        io = self.io.pointer
        for value, view, offset in zip(self.graph.inputs, views, self.io_offsets):
            copy_async(io + offset, view.data, view.nbytes, stream, f"graph '{self.graph.name}': input %{value.name}")
        if self.captured is None:
            bases = [self.arena.pointer] + [io + o for o in self.io_offsets] + [c.pointer for c, _ in self.constants]
            try:
                self.captured = cuda_graph.capture(
                    lambda s: [self._launch(step, bases, s) for step in self.steps],  # type: ignore[func-returns-value]
                    self.device_id)
            except cuda_graph.CaptureUnsupported as error:
                self.capture_error = str(error)
                return None
            self.captures += 1
        self.captured.launch(stream)
        made = []
        for index, value_id in enumerate(self.output_ids):
            nbytes = self.specs[value_id].nbytes
            buffer = cuda.allocate(nbytes, stream, self.device_id)
            copy_async(buffer.pointer, io + self.io_offsets[len(views) + index], nbytes, stream,
                       f"graph '{self.graph.name}': an output")
            made.append(buffer)
        return made

    def _launch(self, step: DeviceStep, bases: Sequence[int], stream: int) -> None:
        """One node's kernel on ``stream`` (during a capture: recorded, not run)."""
        from ..runtime import cuda

        node, kernel, refs, shapes, names, extra, skip = step
        if skip:
            return
        pointers = [bases[b] + offset for b, offset in refs]
        rc, error = _native.call_kernel(kernel._function, pointers, shapes, names, stream, extra)
        if rc != 0 or error is not None:
            raise kernel_error(node.op, kernel, rc, error)
        try:
            cuda.check_launch(node.op.name, kernel.function_name)
        except CudaError as failure:
            named = type(failure)(f"graph '{self.graph.name}': node '{node.name}': {failure}")
            named.code, named.sticky = (
                getattr(failure, "code", None), getattr(failure, "sticky", False))
            raise named from None

    def _copy(self, source: int, value: Value, stream: int) -> DeviceBuffer:
        from ..runtime import cuda

        nbytes = self.specs[value.id].nbytes
        buffer = cuda.allocate(nbytes, stream, self.device_id)
        copy_async(buffer.pointer, source, nbytes, stream, f"graph '{self.graph.name}': output %{value.name}")
        return buffer

    def _export(self, buffer: DeviceBuffer, value: Value) -> Any:
        spec = self.specs[value.id]
        shape = spec.shape if spec.layout == "ndarray" else (spec.nbytes // np.dtype(spec.dtype).itemsize,)
        return buffer.export(tuple(shape), spec.dtype)  # orders each DLPack consumer's stream after the call's
