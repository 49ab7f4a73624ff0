"""float16 and bfloat16 calls computed in float32 kernels, on memory the caller owns.

Most built-ins have CPU kernels for float32 (and float64) only, and the NumPy
reference cannot take bfloat16, so a framework's bfloat16 or float16 tensor
would have no kernel.  The rule that graphs follow (``graph.float16``) decides
here for single calls too: a pure op whose narrow float inputs have no native
CPU kernel, but whose inputs in float32 do, with the same outputs in float32
in place of each narrow dtype, is computed in float32.  ``plan_buffers`` then
gives a ``WidenedPlan``: the float32 call's ``BufferPlan`` between casts (the
``cast`` built-in's prebuilt kernel), narrow inputs widened exactly into
staging buffers of the workspace, float32 results rounded into the caller's
narrow outputs.  Every piece is a prebuilt kernel: no compiler runs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import OpforgeError
from ..spec import TensorSpec
from .aot import WORKSPACE_ALIGN, AotKernel
from .buffer_plan import BufferPlan
from .dispatch import select_kernel

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..operator import Op

#: Float dtypes without arithmetic of their own on the CPU: computed in float32.
NARROW_FLOATS = ("float16", "bfloat16")


def native_cpu_kernel(op: Op, specs: Sequence[TensorSpec | None]) -> bool:
    """Whether dispatch gives these specs a native CPU kernel (not a Python one, not none)."""
    try:
        kernel = select_kernel(op, specs)
    except OpforgeError:
        return False
    return isinstance(kernel, AotKernel) and kernel.device == "cpu"


def in_float32(specs: Sequence[TensorSpec | None]) -> list[TensorSpec | None]:
    """The specs with float32 in place of each narrow float dtype."""
    return [s if s is None or s.dtype not in NARROW_FLOATS else TensorSpec(s.shape, "float32", s.layout)
            for s in specs]


def float32_outputs(op: Op, attrs: Mapping[str, AttrValue], in_specs: Sequence[TensorSpec | None],
                    out_specs: Sequence[TensorSpec]) -> list[TensorSpec] | None:
    """The output specs of a call of a pure op on narrow float inputs (``in_specs``, giving ``out_specs``)
    computed in float32 instead: when a native float32 CPU kernel takes the inputs in float32 and the op's
    inference gives ``out_specs`` with float32 in place of each narrow dtype.  None otherwise (the op is
    impure, has no such kernel, or computes something else in float32).  Whether the op also has a
    native narrow kernel is the caller's question."""
    if "no_side_effect" not in op.traits or not any(s is not None and s.dtype in NARROW_FLOATS for s in in_specs):
        return None
    wide = in_float32(in_specs)
    try:
        specs = op.infer_specs(wide, attrs)
    except OpforgeError:
        return None
    if len(specs) != len(out_specs):
        return None
    for spec, narrow in zip(specs, out_specs):
        expected = "float32" if narrow.dtype in NARROW_FLOATS else narrow.dtype
        if spec.dtype != expected or spec.shape != narrow.shape:
            return None
    return specs if native_cpu_kernel(op, wide) else None


def plan_buffers(op: Op, attrs: Mapping[str, AttrValue], specs: Sequence[TensorSpec | None],
                 device: str) -> BufferPlan:
    """The plan of one call on caller-owned memory: a ``WidenedPlan`` for a CPU call that computes in
    float32 (see the module's docstring), else a ``BufferPlan`` (whose errors say why no kernel takes
    the inputs).  A call whose float inputs are not all of one narrow dtype is never widened: in
    float32, ``add(float32, bfloat16)`` would look like a valid call and hide the mismatch that
    dispatch reports."""
    floats = {s.dtype for s in specs if s is not None and s.dtype in (*NARROW_FLOATS, "float32", "float64")}
    if (device == "cpu" and len(floats) == 1 and floats <= set(NARROW_FLOATS)
            and not native_cpu_kernel(op, specs)):
        try:
            out_specs = op.infer_specs(specs, attrs)
        except OpforgeError:  # (the BufferPlan below raises it)
            out_specs = None
        if out_specs is not None and float32_outputs(op, attrs, specs, out_specs) is not None:
            return WidenedPlan(op, attrs, specs, out_specs)
    return BufferPlan(op, attrs, specs, device)


class WidenedPlan(BufferPlan):
    """A CPU call on float16 / bfloat16 memory run as its float32 call between casts.

    The interface of a ``BufferPlan`` (``out_specs`` are the narrow outputs), but the call is several
    kernels: ``function`` and ``extra`` are None, so callers that launch one function themselves (the
    torch C++ path, JAX's handlers) must call ``run``.  The workspace holds a 64-byte-aligned float32
    staging buffer for each narrow input and output, then the float32 kernel's own workspace.
    """

    __slots__ = ("inner", "widen", "narrow", "staging_bytes")

    inner: BufferPlan  # the float32 call
    widen: tuple[tuple[int, BufferPlan, int], ...]  # (input index among the present, cast, staging offset)
    narrow: tuple[tuple[int, BufferPlan, int], ...]  # (output index, cast, staging offset)
    staging_bytes: int  # the staging buffers' part of the workspace: the float32 kernel's follows

    def __init__(self, op: Op, attrs: Mapping[str, AttrValue], specs: Sequence[TensorSpec | None],
                 out_specs: Sequence[TensorSpec]) -> None:
        from ..registry import lookup

        cast_op = lookup("cast")
        if cast_op is None:
            raise OpforgeError(f"op '{op.name}': a float16 or bfloat16 call computed in float32 needs the "
                               "built-in cast op")
        present = self._describe(op, "cpu", specs, out_specs)
        self.inner = BufferPlan(op, attrs, in_float32(specs), "cpu")
        self.kernel = self.inner.kernel
        self.native, self.extra, self.function = True, None, None
        staging: list[int] = []

        def stage(spec: TensorSpec, dtype: str) -> tuple[BufferPlan, int]:
            """A cast of ``spec`` to ``dtype``, and the offset of its float32 side's staging buffer."""
            cast_plan = BufferPlan(cast_op, cast_op.resolve_attrs({"dtype": dtype}), [spec], "cpu")
            offset = sum(staging)
            staging.append(-(-TensorSpec(spec.shape, "float32").nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN)
            return cast_plan, offset

        widen = []
        for index, spec in enumerate(present):
            if spec.dtype in NARROW_FLOATS:
                widen.append((index, *stage(spec, "float32")))
        narrow = []
        for index, (spec, wide) in enumerate(zip(self.out_specs, self.inner.out_specs)):
            if spec.dtype in NARROW_FLOATS:
                narrow.append((index, *stage(wide, spec.dtype)))
        self.widen, self.narrow = tuple(widen), tuple(narrow)
        self.staging_bytes = sum(staging)
        self.workspace = tuple(staging) + self.inner.workspace
        self.workspace_bytes = sum(self.workspace)

    def run(self, inputs: Sequence[int], outputs: Sequence[int], workspace: int = 0, stream: int = 0) -> None:
        """Widen the narrow inputs into the workspace, run the float32 kernel, round its narrow outputs
        into ``outputs``; raises the op's (or a cast's) typed errors."""
        wide_inputs, wide_outputs = list(inputs), list(outputs)
        for index, cast_plan, offset in self.widen:
            wide_inputs[index] = workspace + offset
            if not cast_plan.skip:
                cast_plan.run([inputs[index]], [wide_inputs[index]])
        for index, _, offset in self.narrow:
            wide_outputs[index] = workspace + offset
        if not self.inner.skip:
            self.inner.run(wide_inputs, wide_outputs, workspace + self.staging_bytes)
        for index, cast_plan, _ in self.narrow:
            if not cast_plan.skip:
                cast_plan.run([wide_outputs[index]], [outputs[index]])
