"""Running a Graph on arrays.

For each distinct input signature (shapes, dtypes) the executor makes a plan
once: whole-graph inference with the concrete shapes, a kernel per node (the
layout pass's choice, else dispatch), Init per node, and a memory plan that
places every intermediate in one arena, reusing the space of values whose
lifetimes are over, with one workspace region shared by all nodes.  When
every node has a native CPU kernel the plan is a ``_native.Program`` that
runs all kernels in C; otherwise, and in checked mode (guard pages for every
buffer, see ``runtime.checks``), nodes run one by one through their kernels.
Every buffer a kernel writes is followed by room for a canary that the
program checks after each step.  A new input shape makes a new plan; a known
one reuses its plan.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from ..bounded_cache import BoundedCache
from ..errors import AllocationError, ArityError, OpforgeError
from ..runtime.aot import AotKernel, workspace_sizes
from ..runtime import cpu
from ..runtime.checks import checks_enabled
from ..runtime.dispatch import kernel_error, select_kernel, skips_kernel
from ..spec import TensorSpec
from .passes import infer_shapes, plan_memory

MAX_PLANS = 16


def _as_array(value):
    array = np.asarray(value)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array if array.flags.c_contiguous and array.flags.aligned else array.copy(order="C")


class Executor:
    def __init__(self, graph):
        self.graph = graph
        self.plans = BoundedCache(MAX_PLANS)

    def plan_for(self, arrays):
        key = (cpu.isa_cap(), tuple((a.shape, a.dtype.str) for a in arrays))  # a new cap re-chooses kernels
        return self.plans.get_or_create(key, lambda: Plan(self.graph, arrays))

    def run(self, arrays):
        graph = self.graph
        if len(arrays) != len(graph.inputs):
            raise ArityError(f"graph '{graph.name}' takes {len(graph.inputs)} input(s), got {len(arrays)}")
        arrays = [_as_array(a) for a in arrays]
        outputs = self.plan_for(arrays).execute(arrays)
        return tuple(outputs) if graph.tuple_output else outputs[0]


class Plan:
    def __init__(self, graph, arrays):
        self.graph = graph
        specs = infer_shapes(graph, [TensorSpec.of(a) for a in arrays])
        # Concrete shapes from inference, layouts from the graph (the layout pass's choice).
        self.specs = {}
        for value in graph.inputs:
            self.specs[value.id] = specs[value.id]
        self.steps = []  # (node, kernel, input specs, output specs)
        for node in graph.nodes:
            for value in node.outputs:
                spec = specs[value.id]
                self.specs[value.id] = TensorSpec(spec.shape, spec.dtype, value.spec.layout)
            if node.is_constant:
                continue
            in_specs = [None if v is None else self.specs[v.id] for v in node.inputs]
            out_specs = [self.specs[v.id] for v in node.outputs]
            for spec in out_specs:
                node.op.check_output_shape(spec)
            kernel = self._kernel_for(node, in_specs)
            self.steps.append((node, kernel, in_specs, out_specs))
        self.program = self._compile() if all(self._native(step) for step in self.steps) else None

    @staticmethod
    def _kernel_for(node, in_specs):
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

    def _native(self, step):
        node, kernel, in_specs, out_specs = step
        if not (isinstance(kernel, AotKernel) and kernel.device == "cpu"):
            return False
        skips = "always_compute" not in node.op.traits and any(s is not None and 0 in s.shape for s in in_specs)
        return not skips and all(s is not None for s in in_specs)

    # -- the native program ---------------------------------------------------
    def _compile(self):
        graph = self.graph
        position = {}  # value id -> step index that produces it
        last_use = {}
        for index, (node, _, _, _) in enumerate(self.steps):
            for value in node.outputs:
                position[value.id] = index
            for value in node.inputs:
                last_use[value.id] = index
        buffers = {}  # value id -> (buffer index, offset)
        for k, value in enumerate(graph.inputs):
            buffers[value.id] = (1 + k, 0)
        self.output_slots = []
        next_buffer = 1 + len(graph.inputs)
        for value in graph.outputs:
            if value.id not in buffers and value.id in position and value.id not in self.output_slots:
                buffers[value.id] = (next_buffer, 0)
                self.output_slots.append(value.id)
                next_buffer += 1
        self.constants = []
        for node in graph.nodes:
            if node.is_constant:
                buffers[node.outputs[0].id] = (next_buffer, 0)
                self.constants.append(np.ascontiguousarray(node.value))
                next_buffer += 1
        intermediates = [v for node, _, _, _ in self.steps for v in node.outputs if v.id not in buffers]
        sizes = [self.specs[v.id].nbytes for v in intermediates]
        lifetimes = [(position[v.id], last_use.get(v.id, position[v.id])) for v in intermediates]
        offsets, arena = plan_memory([size + _native.CANARY_BYTES for size in sizes], lifetimes)
        for value, offset in zip(intermediates, offsets):
            buffers[value.id] = (0, offset)

        steps, workspace_bytes, largest = [], 0, None
        prepared = []
        for node, kernel, in_specs, out_specs in self.steps:
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
            refs = [buffers[v.id] for v in node.inputs] + [buffers[v.id] for v in node.outputs]
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
                       "workspace_bytes": workspace_bytes, "nodes": len(prepared)}
        self.largest_workspace = largest
        self.arena = None  # allocated by the first run (checked mode never needs it)
        self.n_buffers = next_buffer
        self.buffers = buffers
        self.kernels = [(node, kernel) for node, kernel, *_ in prepared]
        return _native.Program(steps, next_buffer)

    def _new_arena(self):
        try:
            return np.empty(max(self.arena_bytes, 1), np.uint8)
        except (MemoryError, ValueError):
            message = (f"graph '{self.graph.name}': cannot allocate its arena of {self.arena_bytes} bytes "
                       f"({self.report['intermediate_bytes']} for intermediates, "
                       f"{self.report['workspace_bytes']} for workspaces)")
            if self.largest_workspace is None:
                raise AllocationError(message) from None
            op, function, requested = self.largest_workspace
            raise AllocationError(f"{message}; the largest workspace: op '{op}': {function} requested "
                                  f"{list(requested)} bytes", op=op, function=function) from None

    def _output(self, value_id):
        """A graph output buffer, with room for the canary the program checks."""
        spec = self.specs[value_id]
        shape = spec.shape if spec.layout == "ndarray" else (spec.nbytes // np.dtype(spec.dtype).itemsize,)
        try:
            return _native.empty(tuple(shape), np.dtype(spec.dtype))
        except MemoryError:
            raise AllocationError(f"graph '{self.graph.name}': cannot allocate output {spec} "
                                  f"({spec.nbytes} bytes)") from None

    def execute(self, arrays):
        if self.program is None or checks_enabled():
            return self._interpret(arrays)
        graph = self.graph
        outputs = {vid: self._output(vid) for vid in self.output_slots}
        # The plan's arena, or a new one on the first run and while another thread runs this plan.
        arena, self.arena = self.arena, None
        if arena is None:
            arena = self._new_arena()
        addresses = [arena.ctypes.data] + [a.ctypes.data for a in arrays] + \
                    [outputs[vid].ctypes.data for vid in self.output_slots] + [c.ctypes.data for c in self.constants]
        try:
            failure = self.program.run(tuple(addresses))
        finally:
            self.arena = arena
        if failure is not None:
            index, rc, error = failure
            node, kernel = self.kernels[index]
            raise kernel_error(node.op, kernel, rc, error)
        results = []
        inputs = {v.id: a for v, a in zip(graph.inputs, arrays)}
        constants = {n.outputs[0].id: n.value for n in graph.nodes if n.is_constant}
        for value in graph.outputs:
            if value.id in outputs:
                results.append(outputs[value.id])
            else:
                results.append(np.array(inputs.get(value.id, constants.get(value.id))))
        return results

    # -- one node at a time -----------------------------------------------------
    def _interpret(self, arrays):
        env = {v.id: a for v, a in zip(self.graph.inputs, arrays)}
        for node in self.graph.nodes:
            if node.is_constant:
                env[node.outputs[0].id] = node.value
        for node, kernel, in_specs, out_specs in self.steps:
            inputs = [None if v is None else env[v.id] for v in node.inputs]
            if skips_kernel(node.op, inputs):
                results = [np.zeros(s.shape, s.dtype) for s in out_specs]
            else:
                results = kernel.run(node.op, inputs, node.attrs, out_specs, in_specs)
            for value, array in zip(node.outputs, results):
                env[value.id] = array
        return [np.array(env[v.id]) if v.producer is None or v.producer.is_constant else env[v.id]
                for v in self.graph.outputs]

    def memory_report(self):
        """Arena bytes with planning, and what one buffer per value would take."""
        if self.program is None:
            raise OpforgeError(f"graph '{self.graph.name}': memory is planned only when every node has a native "
                               "CPU kernel")
        return dict(self.report)
