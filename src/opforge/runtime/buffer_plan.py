"""Kernel calls on memory the caller owns.

A framework that runs opforge ops as its own (PyTorch through ``torch.library``,
JAX through XLA's FFI, opforge's own GPU path) allocates the outputs and the
workspace itself, from its allocator, and hands opforge raw pointers.  A
``BufferPlan`` is what such a call needs, worked out once per op, attribute
values, input signature and device: the kernel dispatch picks, the output specs
inference gives, the kernel's Init state and the workspace it asked for.
``BufferPlan.run`` then makes the call on pointers: kernel errors become
``KernelError``, and on a GPU the launch is checked with ``cudaGetLastError``
(no synchronization).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _native
from ..operator import PyKernel
from . import cuda
from .aot import present, workspace_sizes
from .dispatch import kernel_error, select_kernel, skips_kernel

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..operator import Op
    from ..spec import TensorSpec


class BufferPlan:
    """One signature of one op on one device (``"cpu"`` or ``"gpu"``).

    ``native`` is False for a Python kernel, which the caller runs on its own
    arrays (``kernel.fn``); ``skip`` is True when no kernel runs because every
    output is empty (``dispatch.skips_kernel``).  ``workspace`` holds the byte
    size of each workspace buffer (multiples of 64, so one allocation of
    ``workspace_bytes`` serves them all).
    """

    __slots__ = ("op", "kernel", "device", "in_specs", "out_specs", "out_nbytes", "native", "skip", "extra",
                 "shapes", "dtypes", "workspace", "workspace_bytes", "function")

    op: Op
    kernel: Any  # an AotKernel where native, else a PyKernel: callers tell them apart by ``native``
    device: str
    in_specs: tuple[TensorSpec | None, ...]
    out_specs: tuple[TensorSpec, ...]
    out_nbytes: tuple[int, ...]
    native: bool
    skip: bool
    extra: Any  # the kernel's Init state (a _native.Extra), None for a Python kernel
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    workspace: tuple[int, ...]
    workspace_bytes: int
    function: int | None

    def __init__(self, op: Op, attrs: Mapping[str, AttrValue], specs: Sequence[TensorSpec | None],
                 device: str) -> None:
        kernel: Any  # as self.kernel
        self.kernel = kernel = select_kernel(op, specs, device=device)
        out_specs = op.infer_specs(specs, attrs, kernel)
        for spec in out_specs:
            op.check_output_shape(spec)
        given = self._describe(op, device, specs, out_specs)
        self.native = not isinstance(kernel, PyKernel)
        if self.native:
            self.extra, requested = kernel.signature_state(op, given + list(self.out_specs), attrs)
            self.workspace = workspace_sizes(requested, max((s.nbytes for s in given), default=0), op=op.name,
                                             function=kernel.function_name + "Init")
            self.function = kernel._function
        else:
            self.extra, self.workspace, self.function = None, (), None
        self.workspace_bytes = sum(self.workspace)

    def _describe(self, op: Op, device: str, specs: Sequence[TensorSpec | None],
                  out_specs: Sequence[TensorSpec]) -> list[TensorSpec]:
        """Set what a plan says of its call's tensors; returns the present inputs' specs."""
        self.op, self.device = op, device
        self.in_specs, self.out_specs = tuple(specs), tuple(out_specs)
        self.out_nbytes = tuple(s.nbytes for s in self.out_specs)
        self.skip = skips_kernel(op, self.out_specs)
        given = present(specs)
        self.shapes = tuple(s.shape for s in given + list(self.out_specs))
        self.dtypes = tuple(s.dtype for s in given + list(self.out_specs))
        return given

    def pointers(self, inputs: Sequence[int], outputs: Sequence[int], workspace: int = 0) -> list[int]:
        """The kernel's ``params``: input and output data pointers, then one per workspace buffer."""
        pointers = list(inputs) + list(outputs)
        offset = 0
        for size in self.workspace:
            pointers.append(workspace + offset)
            offset += size
        return pointers

    def run(self, inputs: Sequence[int], outputs: Sequence[int], workspace: int = 0, stream: int = 0) -> None:
        """Call the kernel on data pointers (inputs, then outputs; ``workspace``: the
        start of ``workspace_bytes``) on ``stream``; raises the op's typed errors."""
        rc, error = _native.call_kernel(self.function, self.pointers(inputs, outputs, workspace), self.shapes,
                                        self.dtypes, stream, self.extra)
        if rc != 0 or error is not None:
            raise kernel_error(self.op, self.kernel, rc, error)
        if self.device == "gpu":
            cuda.check_launch(self.op.name, self.kernel.function_name)
