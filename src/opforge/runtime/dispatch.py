"""The eager call path: from bound arguments to a kernel launch.

``launcher_for(op, attrs)`` returns the native ``Launcher`` for one op and one
set of attribute values.  The launcher handles the common case in C (known
input signature, contiguous NumPy arrays); everything else calls back into the
``CallPlanner`` below, which chooses the kernel, runs inference and Init, and
hands the launcher a plan for that signature.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _native
from ..attrs import attr_key
from ..errors import AttrError, DTypeError, KernelError, NoKernelError, ShapeError
from ..spec import TensorSpec
from .cpu import isa_rank, isa_reject_reason

_MAX_LAUNCHERS_PER_OP = 64

#: Functions ``(op, attrs, args) -> result or NotImplemented`` consulted when a
#: call's arguments are not all plain arrays; layers above the runtime (the
#: graph tracer) register here, so every op call has one entry point.
INTERCEPTORS = []


class Completed:
    """What ``CallPlanner.prepare`` returns when it finished the call itself."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def launcher_for(op, attrs, n_inputs):
    key = (attr_key(attrs), n_inputs)
    launcher = op._launchers.get(key)
    if launcher is None:
        if len(op._launchers) >= _MAX_LAUNCHERS_PER_OP:
            op._launchers.pop(next(iter(op._launchers)))
        launcher = _native.Launcher(n_inputs, len(op.outputs), op.tuple_output, CallPlanner(op, attrs))
        op._launchers[key] = launcher
        if not any(a.required for a in op.attrs.values()) and attrs == op.resolve_attrs({}):
            op._default_launcher = launcher  # what op(*arrays) with no attributes uses
    return launcher


def as_array(op, index, value):
    """One tensor argument as a C-contiguous, native-byte-order NumPy array."""
    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "__array__") or isinstance(value, (list, tuple, numbers.Number, np.generic)):
        array = np.asarray(value)
    elif hasattr(value, "__dlpack__"):
        array = np.from_dlpack(value)
    else:
        raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}' must be an array, got {type(value).__name__}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    # (not np.ascontiguousarray: it turns 0-d arrays into 1-d ones)
    return array if array.flags.c_contiguous and array.flags.aligned else array.copy(order="C")


def input_specs(op, arrays):
    specs = []
    for index, array in enumerate(arrays):
        if array is None:  # an absent optional input
            specs.append(None)
            continue
        try:
            specs.append(TensorSpec.of(array))
        except DTypeError as error:
            raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}': {error}") from None
    return specs


def _preference(kernel, device):
    """Sort key: the inputs' device first, then native before Python, the best ISA,
    and the reference kernel last."""
    return (kernel.device != device, getattr(kernel, "reference", False), -getattr(kernel, "priority", 1),
            -isa_rank(kernel.isa))


def select_kernel(op, specs, device="cpu"):
    """The preferred kernel that accepts the specs; errors list every candidate."""
    if not op.kernels:
        raise NoKernelError(f"op '{op.name}' has no kernels")
    reasons = []
    for kernel in sorted(op.kernels, key=lambda k: _preference(k, device)):
        reason = kernel.reject_reason(op, specs)
        if reason is None and kernel.device == "cpu" and kernel.isa is not None:
            reason = isa_reject_reason(kernel.isa)
        if reason is None:
            return kernel
        reasons.append((kernel, reason))
    if len(reasons) == 1 and "dtype" in reasons[0][1]:
        raise DTypeError(f"op '{op.name}': {reasons[0][1]}")
    lines = "\n".join(f"  {k.name} ({k.device}{', ' + k.isa if k.isa else ''}): {r}" for k, r in reasons)
    error = DTypeError if all("dtype" in r for _, r in reasons) else NoKernelError
    raise error(f"op '{op.name}': no kernel accepts inputs {specs}; candidates:\n{lines}")


def kernel_error(op, kernel, rc, error, function=None):
    function = function or getattr(kernel, "function_name", kernel.name)
    if error is not None and error[0] == "attr":
        return AttrError(error[1])
    where = f" ({kernel.location})" if getattr(kernel, "location", None) else ""
    if error is not None:
        message = f"op '{op.name}': kernel function '{function}'{where} raised a C++ exception: {error[1]}"
    else:
        message = f"op '{op.name}': kernel function '{function}'{where} returned error code {rc}"
    return KernelError(message, op=op.name, function=function, code=rc)


class CallPlanner:
    """Python half of a Launcher: everything that is not the hot path."""

    def __init__(self, op, attrs):
        self.op = op
        self.attrs = attrs
        self._kernels_by_function = {}

    def reject(self, *args, **kwargs):
        # Wrong arity or keywords for the fast path: bind properly (raises on bad input).
        return self.op.call(args, kwargs)

    def prepare(self, args):
        for intercept in INTERCEPTORS:  # e.g. tracing: symbolic values instead of arrays
            result = intercept(self.op, self.attrs, args)
            if result is not NotImplemented:
                return Completed(result)
        if "support_non_contiguous" in self.op.traits and all(k.priority < 2 for k in self.op.kernels):
            return tuple(a if a is None else np.asarray(a) for a in args)  # Python kernels take views
        return tuple(None if a is None else as_array(self.op, k, a) for k, a in enumerate(args))

    def _resolve(self, arrays):
        specs = input_specs(self.op, arrays)
        kernel = select_kernel(self.op, specs)
        out_specs = self.op.infer_specs(specs, self.attrs, kernel)
        for spec in out_specs:
            self.op.check_output_shape(spec)
            if spec.layout != "ndarray":
                raise ShapeError(f"op '{self.op.name}': an eager call would produce layout {spec.layout}, which "
                                 "exists only inside graphs (the layout pass inserts reorders there)")
        return specs, kernel, out_specs

    def _skips_kernel(self, arrays):
        # PPLNN's CanDoExecute: an empty input means empty work, unless the op says otherwise.
        return "always_compute" not in self.op.traits and any(a is not None and a.size == 0 for a in arrays)

    def plan(self, arrays):
        specs, kernel, out_specs = self._resolve(arrays)
        if self._skips_kernel(arrays):
            return None
        plan = kernel.plan(self.op, arrays, specs, out_specs, self.attrs) if hasattr(kernel, "plan") else None
        if plan is not None:
            self._kernels_by_function[plan[0]] = kernel
        return plan

    def run(self, arrays):
        specs, kernel, out_specs = self._resolve(arrays)
        if self._skips_kernel(arrays):
            outputs = [np.zeros(s.shape, s.dtype) for s in out_specs]
        else:
            outputs = kernel.run(self.op, arrays, self.attrs, out_specs)
        return tuple(outputs) if self.op.tuple_output else outputs[0]

    def failed(self, rc, error, function_address):
        kernel = self._kernels_by_function.get(function_address)
        raise kernel_error(self.op, kernel, rc, error)
