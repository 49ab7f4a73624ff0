"""Fusing chains of elementwise ops in a planned graph into one generated kernel.

An op that declares itself as a C++ expression (``Op.fuse_as``) can run
inside a loop opforge writes: ``y = tanh(a * x + b)`` then reads ``x`` once
and writes ``y`` once, where three kernels would pass over memory three times.
``fuse_steps`` takes a graph plan's steps (node, kernel, input specs, output
specs), finds runs of consecutive steps that may fuse, and replaces each run
of two or more by one step of a private op whose kernel it generates and
compiles (content-addressed in the build cache: a graph shape compiles once
per machine, not once per process).

A step may fuse when its op has an expression, its kernel is a native CPU one
on plain (ndarray) tensors, its attributes are numbers, and its output has the
run's shape and float dtype, each input having that dtype and either that
shape or one element.  A run continues while the next step reads a value the
run made.  Values made inside a run that anything after it reads (a later
node, a graph output) become outputs of the fused kernel, so nothing else in
the plan changes.  ``OPFORGE_FUSE=0`` turns fusion off.

A fused kernel that cannot be built -- no compiler, a compiler that fails,
an unusable cache folder -- leaves its run unfused, on the built-ins' own
(prebuilt) kernels: a plan never needs a compiler for built-in ops.  The first
such run in a process says so on the ``opforge.build`` logger, once.  The
chains models use most (``COMMON_CHAINS``) are prebuilt with the package, like
the built-ins' kernels (``runtime.prebuilt``), so they run fused even there: a
fused kernel's source depends on its ops, their attributes, the dtype and which
inputs are one element, never on the shapes.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..bounded_cache import BoundedCache
from ..errors import CacheError, CompileError, CompilerNotFoundError
from ..runtime import cpu, prebuilt
from ..runtime.aot import AotKernel
from .symbolic import call_builtin
from .ir import Node

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..operator import Kernel, Op
    from ..spec import TensorSpec
    from .executor import Step
    from .ir import Graph, Value

_C_TYPES = {"float32": "float", "float64": "double"}
_BUILTINS = str(Path(__file__).resolve().parent.parent / "builtins")  # vecmath.h
_MIN_STEPS = 2
_fused_ops: BoundedCache[tuple[str, str], tuple[Op, Kernel]] = BoundedCache(256)  # (source, isa) -> (op, kernel)
# Fused kernels the compiler rejected, by (source path, isa): not tried again in this process (each try would
# run the compiler).  A missing compiler or cache folder is not remembered: looking again costs little.
_rejected: BoundedCache[tuple[str, str | None], bool] = BoundedCache(256)
_told_unfused = threading.Lock()  # held for good once a run fell back: the line is printed once per process
log = logging.getLogger("opforge.build")
class _Builtins:
    """``ops.relu(...)``: the built-in op of that name, called through the registry (the graph layer imports no
    frontend, ``opforge.ops`` included)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return functools.partial(call_builtin, name)


ops: Any = _Builtins()


def fusion_enabled() -> bool:
    return os.environ.get("OPFORGE_FUSE", "1").strip() != "0"


def _number_literal(value: object, ctype: str) -> str | None:
    if isinstance(value, bool):
        return f"{ctype}({int(value)})"
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    if math.isinf(value):
        return f"{ctype}({'-' if value < 0 else ''}INFINITY)"
    return f"{ctype}({float(value)!r})"


def _fusable(step: Step[Kernel], shape: tuple[int, ...] | None, dtype: str | None) -> bool:
    node, kernel, in_specs, out_specs = step
    op = node.op
    if op.expression is None or not isinstance(kernel, AotKernel) or kernel.device != "cpu":
        return False
    if len(out_specs) != 1 or out_specs[0].layout != "ndarray" or any(s is None for s in in_specs):
        return False
    out = out_specs[0]
    if out.dtype not in _C_TYPES or (shape is not None and (out.shape != shape or out.dtype != dtype)):
        return False
    if any(s.dtype != out.dtype or s.layout != "ndarray" or (s.shape != out.shape and math.prod(s.shape) != 1)
           for s in cast("list[TensorSpec]", in_specs)):  # (none is None: checked above)
        return False
    values = {name: attr.default for name, attr in op.attrs.items()} | node.attrs
    return all(_number_literal(v, "T") is not None for v in values.values())


def fuse_steps(graph: Graph, steps: list[Step[Kernel]]) -> tuple[list[Step[Kernel]], list[str]]:
    """``steps`` with every fusable run replaced by one step; and the names of the fused ops.
    A run whose kernel cannot be built keeps its steps."""
    if not fusion_enabled():
        return steps, []
    result: list[Step[Kernel]]
    fused_names: list[str]
    result, fused_names, done = [], [], 0
    for start, run, escapes in _runs(graph, steps):
        result += steps[done:start]
        done = start + len(run)
        step = _fused_step(run, escapes, cpu.best_isa())  # under the cap
        if _builds(cast(AotKernel, step[1])):
            result.append(step)
            fused_names.append(step[0].op.name)
        else:
            result += run
    result += steps[done:]
    return result, fused_names


def _runs(graph: Graph, steps: list[Step[Kernel]]) -> Iterator[tuple[int, list[Step[Kernel]], list[bool]]]:
    """(index of its first step, its steps, whether each step's output is read after it) per fusable run."""
    readers: dict[int, int] = {}  # value id -> index of the last step that reads it (len(steps) for graph outputs)
    for index, (node, *_) in enumerate(steps):
        for value in node.inputs:
            if value is not None:
                readers[value.id] = index
    for value in graph.outputs:
        readers[value.id] = len(steps)

    index = 0
    while index < len(steps):
        run = [steps[index]]
        if _fusable(steps[index], None, None):
            shape, dtype = steps[index][3][0].shape, steps[index][3][0].dtype
            made = {steps[index][0].outputs[0].id}
            following = index + 1
            while following < len(steps) and _fusable(steps[following], shape, dtype) and any(
                    v.id in made for v in cast("list[Value]", steps[following][0].inputs)):  # (fusable: all given)
                run.append(steps[following])
                made.add(steps[following][0].outputs[0].id)
                following += 1
        if len(run) < _MIN_STEPS:
            index += 1
            continue
        end = index + len(run)
        yield index, run, [readers.get(node.outputs[0].id, -1) >= end for node, *_ in run]
        index = end


def _builds(kernel: AotKernel) -> bool:
    """Whether a fused kernel loads: from the prebuilt set, the build cache, or compiled now.  When it
    cannot be built, its run stays unfused; the first time in a process, a line says so.  Any other
    error is a bug, and raises."""
    key = (str(kernel.path), kernel.isa)
    if _rejected.get(key):
        return False
    try:
        kernel.load()
    except (CompilerNotFoundError, CompileError, CacheError) as error:
        if isinstance(error, CompileError):
            _rejected.put(key, True)
        _say_unfused(error)
        return False
    return True


def _say_unfused(error: Exception) -> None:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    log.debug("a fused kernel is not built, its run stays unfused: %s", error)  # a compiler's whole output
    if not _told_unfused.acquire(blocking=False):  # said already
        return
    # No compiler is a supported setup (built-in ops never need one); a compiler that fails is not.
    level = logging.WARNING if isinstance(error, CompileError) else logging.INFO
    log.log(level, "cannot build fused elementwise kernels (%s); graphs run those chains unfused, one built-in "
                   "kernel per op (said once per process; OPFORGE_FUSE=0 turns fusion off)", reason)


def _fused_step(run: list[Step[Kernel]], escapes: list[bool], isa: str) -> Step[Kernel]:
    """One step for a run of fusable steps, its kernel (not loaded) compiled for ``isa``;
    ``escapes[k]``: step k's output is read after the run."""
    escapes[-1] = True  # the run's last value is what it was made for
    inputs: list[Value]
    input_specs: list[TensorSpec]
    names: dict[int, str]
    inputs, input_specs, names = [], [], {}  # outside values the run reads, in first-use order
    for node, _, in_specs, _ in run:  # (fusable steps: every input is given)
        for value, spec in zip(cast("list[Value]", node.inputs), cast("list[TensorSpec]", in_specs)):
            if value.id not in names and not any(value is n.outputs[0] for n, *_ in run):
                names[value.id] = f"in{len(inputs)}"
                inputs.append(value)
                input_specs.append(spec)
    out_spec = run[0][3][0]
    ctype = _C_TYPES[out_spec.dtype]
    loads: list[str]
    body: list[str]
    stores: list[str]
    loads, body, stores = [], [], []
    scalars = []
    for k, (value, spec) in enumerate(zip(inputs, input_specs)):
        pointer = f"static_cast<const T *>(params[{k}])"
        if spec.shape != out_spec.shape:  # one element, read once
            scalars.append(f"  const T {names[value.id]}_value = {pointer}[0];")
            names[value.id] = f"{names[value.id]}_value"
        else:
            scalars.append(f"  const T *{names[value.id]} = {pointer};")
            loads.append(f"      const T {names[value.id]}_i = {names[value.id]}[i];")
            names[value.id] = f"{names[value.id]}_i"
    outputs: list[Value] = []
    for k, ((node, _, _, _), escape) in enumerate(zip(run, escapes)):
        values = {name: attr.default for name, attr in node.op.attrs.items()} | node.attrs
        fields = {name: _number_literal(value, "T") for name, value in values.items()}
        fields.update({i.name: names[v.id] for i, v in zip(node.op.inputs, cast("list[Value]", node.inputs))})
        local = f"v{k}"
        body.append(f"      const T {local} = static_cast<T>({cast(str, node.op.expression).format(**fields)});")
        names[node.outputs[0].id] = local
        if escape:
            param = len(inputs) + len(outputs)
            scalars.append(f"  T *out{len(outputs)} = static_cast<T *>(params[{param}]);")
            stores.append(f"      out{len(outputs)}[i] = {local};")
            outputs.append(node.outputs[0])
    label = "_".join(node.op.name.split("::")[-1] for node, *_ in run)
    source = _SOURCE.format(ctype=ctype, setup="\n".join(scalars), body="\n".join(loads + body + stores),
                            n_out=len(inputs))
    builtin = all(getattr(kernel, "builtin", False) for _, kernel, *_ in run)  # then it may be prebuilt
    op, kernel = _fused_ops.get_or_create((source, isa),
                                          lambda: _fused_op(label, len(inputs), len(outputs), source, isa, builtin))
    node = Node(op, inputs, {}, [out_spec] * len(outputs), name="fused_" + label)
    node.outputs = outputs  # the run's own values: the plan's buffers stay where they were
    return node, kernel, list(input_specs), [out_spec] * len(outputs)


def _fused_op(label: str, n_inputs: int, n_outputs: int, source: str, isa: str,
              builtin: bool) -> tuple[Op, Kernel]:
    from ..operator import Op

    ins = [f"in{k}" for k in range(n_inputs)]
    outs = [f"out{k}" for k in range(n_outputs)]
    op = Op(f"fused::{label}", ins, outs, traits=["no_side_effect"])
    # vecmath.h and its flags: the built-ins' expressions call its functions, and
    # compiled alike they round as the built-ins' own kernels do.
    op.kernel(code=source, function="Fused", isa=None if isa == "generic" else isa, name=f"Fused<{label}>",
              include_dirs=[_BUILTINS], cflags=["-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno"])
    kernel = cast(AotKernel, op.kernels[0])
    kernel.builtin = builtin  # made of built-ins only: its key may be in the prebuilt set
    return op, kernel


#: Chains common in models, prebuilt (float32, every ISA) with the built-ins' kernels: (the function, the
#: shapes of its inputs: () is one element, read once).  Each must fuse into one run whose intermediates
#: nothing else reads, as in the models.
COMMON_CHAINS: list[tuple[Callable[..., object], list[tuple[int, ...]]]] = [
    (lambda a, b: ops.relu(ops.add(a, b)), [(8,), (8,)]),  # a residual block's end (ResNet, ShuffleNet)
    (lambda x: ops.mul(x, ops.sigmoid(x)), [(8,)]),  # SiLU / swish (EfficientNet, YOLO)
    (lambda x: ops.mul(x, ops.hard_sigmoid(x, alpha=1 / 6, beta=0.5)), [(8,)]),  # HardSwish (MobileNetV3)
    (lambda x, a, b: ops.add(ops.mul(x, a), b), [(8,), (), ()]),  # a scale and shift by constants
]


def common_fused_kernels() -> list[tuple[Op, AotKernel]]:
    """(op, kernel) of each ``COMMON_CHAINS`` run at every ISA, not loaded: for ``runtime.prebuilt``."""
    from ..spec import TensorSpec
    from .executor import Plan, plan_nodes
    from .trace import trace

    pairs = []
    for chain, shapes in COMMON_CHAINS:
        arrays = [np.zeros(shape, np.float32) for shape in shapes]
        graph = trace(chain, *arrays)
        _, steps = plan_nodes(graph, [TensorSpec.of(a) for a in arrays], Plan._kernel_for)
        for _, run, escapes in _runs(graph, steps):
            for isa in cpu.ISA_LEVELS:
                node, kernel, *_ = _fused_step(run, list(escapes), isa)
                pairs.append((node.op, cast(AotKernel, kernel)))
    return pairs


prebuilt.GENERATED.append(common_fused_kernels)  # (the runtime cannot import the graph layer: a hook)


_SOURCE = r"""// Generated by opforge.graph.fusion: one pass over the elements for a chain of ops.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "vecmath.h"

typedef {ctype} T;

extern "C" int Fused(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {{
  int64_t n = 1;
  for (int d = 0; d < ndims[{n_out}]; d++) n *= shapes[{n_out}][d];
{setup}
  opforge::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {{
    for (int64_t i = begin; i < end; i++) {{
{body}
    }}
  }});
  return 0;
}}
"""

