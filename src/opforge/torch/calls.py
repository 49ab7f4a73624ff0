"""What runs when PyTorch calls an opforge op: the kernel on the tensors' own
memory, and the fake (meta) kernel made from opforge's inference.

The real kernel takes each input's data pointer as it is (made contiguous
first, as torch's own ops do), allocates the outputs and the workspace with
``torch.empty`` on the inputs' device (torch's caching allocator on a GPU) and
calls the op's kernel through a ``BufferPlan`` -- dispatch, inference and Init
worked out once per input signature -- on the current CUDA stream.  Nothing
goes through NumPy except Python kernels, which take NumPy views of the
tensors' memory.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..errors import DeviceError, DTypeError, ShapeError
from ..runtime.buffer_plan import BufferPlan
from ..runtime.widen import plan_buffers
from ..spec import TensorSpec
from . import fast as fast_path
from . import symbolic
from .schema import attr_value, dtype_name, torch_dtype

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..operator import Op

PLANS_PER_OP = 256


class Binding:
    """One opforge op as a torch op: splits torch's arguments into tensors and
    attributes, and runs the op on them."""

    def __init__(self, op: Op, packet: Any) -> None:
        self.op = op
        self.packet = packet  # torch.ops.<ns>.<name>
        self.variadic = op.variadic
        self.n_tensors = 1 if op.variadic else len(op.inputs)
        self.attrs = list(op.attrs.values())
        self.positional = [a for a in self.attrs if a.positional]
        self.dtype_attrs = {a.name for a in self.attrs if a.type == "DType"}
        self.plans: BoundedCache[tuple[Any, ...], BufferPlan] = BoundedCache(PLANS_PER_OP)
        op.plan_caches.append(self.plans)  # dropped when the op's kernels or the ISA cap change
        self.library: Any = None  # the torch.library.Library defining it
        self.fast: fast_path.FastPath | None = None  # its C++ path (fast.FastPath), when loaded

    def remove(self) -> None:
        """Undefine the torch op (before the op is defined again)."""
        if self.fast is not None:
            self.fast.remove()
            self.op.plan_caches.remove(self.fast)
        self.op.plan_caches.remove(self.plans)
        self.library._destroy()

    # -- arguments --------------------------------------------------------------
    def split(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, AttrValue]]:
        """torch's (args, kwargs) -> (tensor inputs, opforge attribute values)."""
        n = self.n_tensors
        tensors = list(args[0]) if self.variadic else list(args[:n]) + [None] * (n - len(args[:n]))
        for index, input_def in enumerate(() if self.variadic else self.op.inputs):
            if input_def.name in kwargs:  # torch passes Tensor? inputs by name when they are keywords
                tensors[index] = kwargs[input_def.name]
        values = dict(zip((a.name for a in self.positional), args[n:]))
        values.update((k, v) for k, v in kwargs.items() if k in self.op.attrs)
        given = {a.name: attr_value(self.op, a, values[a.name]) for a in self.attrs if a.name in values}
        return tensors, self.op.resolve_attrs(given)

    def call_args(self, tensors: Iterable[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], Mapping[str, Any]]:
        """opforge's tensors and torch's keyword arguments as a call of ``torch.ops``: (args, kwargs)."""
        return ([list(tensors)] if self.variadic else list(tensors)), kwargs

    def torch_attrs(self, attrs: Mapping[str, AttrValue]) -> Mapping[str, Any]:
        """opforge's attribute values as torch takes them (a dtype name as a torch.dtype)."""
        if not self.dtype_attrs:
            return attrs
        # a DType attribute's value is a dtype name
        return {name: torch_dtype(value) if name in self.dtype_attrs else value  # type: ignore[arg-type]
                for name, value in attrs.items()}

    # -- the real kernel ----------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        op = self.op
        tensors, attrs = self.split(args, kwargs)
        device = self.device_of(tensors)
        kind = "gpu" if device.type == "cuda" else "cpu" if device.type == "cpu" else None
        if kind is None:
            raise DeviceError(f"op '{op.name}': its inputs are on {device}; opforge kernels run on the CPU and on "
                              "CUDA devices")
        tensors = [None if t is None else t.detach().contiguous() for t in tensors]
        key = (kind, attr_key(attrs), tuple(None if t is None else (t.shape, t.dtype) for t in tensors))
        plan = self.plans.get_or_create(key, lambda: plan_buffers(op, attrs, self.specs(tensors), kind))
        if not plan.native and not plan.skip:
            return self.run_python(plan, tensors, attrs, device)
        outputs = [torch.empty(s.shape, dtype=torch_dtype(s.dtype), device=device) for s in plan.out_specs]
        if not plan.skip:  # (skipped: every output is empty, for Python kernels too)
            workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=device) \
                if plan.workspace_bytes else None
            inputs = [t.data_ptr() for t in tensors if t is not None]
            if kind == "gpu":
                with torch.cuda.device(device):
                    plan.run(inputs, [o.data_ptr() for o in outputs],
                             workspace.data_ptr() if workspace is not None else 0,
                             torch.cuda.current_stream(device).cuda_stream)
            else:
                plan.run(inputs, [o.data_ptr() for o in outputs],
                         workspace.data_ptr() if workspace is not None else 0)
        return tuple(outputs) if op.tuple_output else outputs[0]

    def device_of(self, tensors: Sequence[Any]) -> Any:
        """The one device of a call's tensors (the CPU when none is given); DeviceError for a mix,
        meta tensors included: torch would run the fake kernel for a meta tensor beside a real one
        and give an uninitialised result."""
        present = [t for t in tensors if t is not None]
        device = present[0].device if present else torch.device("cpu")
        for index, t in enumerate(tensors):
            if t is not None and t.device != device:
                raise DeviceError(f"op '{self.op.name}': input '{self.op.input_name(index)}' is on {t.device}, "
                                  f"input '{self.op.input_name(tensors.index(present[0]))}' on {device}; one "
                                  "call takes tensors on one device")
        return device

    def native_plan(self, kind: str, device_index: int, specs: Sequence[tuple[Sequence[int], str] | None],
                    attrs: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The C++ path's plan for one signature: (kernel address, Init state address,
        output shapes, output dtypes, workspace sizes, skip, cudaGetLastError address,
        torch's current-stream getter, opforge_take_attr_error address, the BufferPlan
        keeping it all alive), or None for a Python kernel.  Errors propagate (the C++
        path then runs the call in Python, which raises them with their types)."""
        op = self.op
        given = {a.name: attr_value(op, a, attrs[a.name]) for a in self.attrs if a.name in attrs}
        attrs = op.resolve_attrs(given)
        in_specs = [None if s is None else TensorSpec(s[0], s[1]) for s in specs]
        key = (kind, attr_key(attrs), tuple(None if s is None else (s.shape, s.dtype) for s in in_specs))
        plan = self.plans.get_or_create(key, lambda: plan_buffers(op, attrs, in_specs, kind))
        if not plan.native or plan.function is None:  # (None: several kernels, a WidenedPlan's casts)
            return None
        last_error = current_stream = 0
        if kind == "gpu":
            from ..runtime import cuda

            last_error, current_stream = cuda.last_error_address(), fast_path.current_stream_address()
        extra = plan.extra.address if plan.extra is not None else 0
        return (plan.function, extra, [list(s.shape) for s in plan.out_specs], [s.dtype for s in plan.out_specs],
                plan.workspace, plan.skip, last_error, current_stream, fast_path.take_attr_error_address(), plan)

    def specs(self, tensors: Sequence[Any], names: Sequence[str] | None = None,
              concrete: bool = False) -> list[TensorSpec | None]:
        """TensorSpecs of tensors (the op's inputs, or those ``names`` names); ``concrete``:
        symbolic dims as their sizes (which makes torch guard on them)."""
        op = self.op
        return [None if t is None else
                TensorSpec([int(d) for d in t.shape] if concrete else tuple(t.shape),
                           dtype_name(t.dtype, op=op, what=f"input '{op.input_name(k)}'" if names is None
                                      else f"'{names[k]}'"))
                for k, t in enumerate(tensors)]

    def run_python(self, plan: BufferPlan, tensors: Sequence[Any], attrs: dict[str, AttrValue], device: Any) -> Any:
        """A Python kernel: NumPy views of host tensors in, its (checked, copied) arrays out as tensors;
        a Python GPU kernel gets the CUDA tensors themselves."""
        op = self.op
        if device.type == "cuda":
            return plan.kernel.fn(*tensors, **attrs)
        arrays = []
        for index, t in enumerate(tensors):
            try:  # a DLPack view: Tensor.numpy() would make the caller's storage non-resizable (FSDP2 resizes)
                arrays.append(None if t is None else np.from_dlpack(t))
            except (RuntimeError, TypeError, BufferError):
                raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}' has dtype {t.dtype}; the op's "
                                 f"Python kernel '{plan.kernel.name}' takes NumPy arrays, which have no such "
                                 "dtype") from None
        results = plan.kernel.run(op, arrays, attrs, plan.out_specs, plan.in_specs)
        outputs = []
        for spec, result in zip(plan.out_specs, results):  # into torch's own memory, as its ops' outputs are
            output = torch.empty(spec.shape, dtype=torch_dtype(spec.dtype))
            np.from_dlpack(output)[...] = result
            outputs.append(output)
        return tuple(outputs) if op.tuple_output else outputs[0]

    # -- the fake kernel ------------------------------------------------------------
    def unknown_specs(self, tensors: Sequence[Any], names: Sequence[str] | None = None) -> list[TensorSpec | None]:
        """TensorSpecs of tensors (the op's inputs, or those ``names`` names) whose dims
        may be SymInts: a symbolic dim is unknown (-1)."""
        return symbolic.Signature(self.op, tensors, names).unknown

    def fake(self, *args: Any, **kwargs: Any) -> Any:
        """Outputs of the right shape, dtype and device, from opforge's inference alone
        (see ``symbolic``: dims of symbolic inputs become SymInt expressions, sizes only
        the data decides become unbacked sizes)."""
        op = self.op
        tensors, attrs = self.split(args, kwargs)
        device = self.device_of(tensors)
        signature = symbolic.Signature(op, tensors)
        out_specs = op.infer_specs(signature.unknown, attrs)
        if any(spec.rank is None for spec in out_specs):  # a rank the sizes decide (gather_nd's tuple length):
            out_specs = op.infer_specs(self.specs(tensors, concrete=True), attrs)  # from them (torch guards on them)
        shapes = signature.output_dims(attrs, out_specs, lambda: self.specs(tensors, concrete=True))
        outputs = []
        for spec, shape in zip(out_specs, shapes):
            if spec.rank is None:
                raise ShapeError(f"op '{op.name}': inference gives output of unknown rank; PyTorch needs the rank "
                                 "of every output when it traces")
            shape = [torch.library.get_ctx().new_dynamic_size() if isinstance(d, int) and d < 0 else d
                     for d in shape]  # a size only the data decides
            outputs.append(torch.empty(shape, dtype=torch_dtype(spec.dtype), device=device))
        return tuple(outputs) if op.tuple_output else outputs[0]
