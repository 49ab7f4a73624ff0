"""Tensor arguments as users hold them: NumPy, PyTorch, JAX, CuPy, ... through DLPack.

A call's tensor arguments have a *kind* (the array library the caller uses,
named by its top-level module: ``numpy``, ``torch``, ``jax``, ``cupy``) and
a *device*, DLPack's ``(device_type, device_id)`` pair.  One call takes one
kind on one device; Python scalars and nested lists join any kind.  Host
arrays of any kind become NumPy views of the same memory
(``np.from_dlpack``), so the CPU path below is the NumPy one; outputs go back
to the caller's kind through that library's own ``from_dlpack``.  Arrays on
a CUDA device take the device path (``runtime.device_call``).

Only the DLPack protocol is used to move arrays; the array library is
looked up solely to hand outputs back (``x.__array_namespace__()`` where
the library has it, else its top-level module), and, for CUDA arrays, to
ask it for its current stream (``runtime.cuda``).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from ..dtypes import to_numpy
from ..errors import DeviceError, DTypeError

if TYPE_CHECKING:
    import numpy.typing as npt

    class OpLike(Protocol):
        """An Op or a Graph: what messages and handing outputs back need of the callee."""

        @property
        def name(self) -> str: ...
        @property
        def outputs(self) -> Sequence[Any]: ...  # an Op's output names, a Graph's output Values
        @property
        def tuple_output(self) -> bool: ...
        def input_name(self, index: int) -> str: ...

#: DLPack device types opforge knows by name.
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda_host", CUDA_MANAGED: "cuda_managed", 10: "rocm"}
HOST = (CPU, 0)

_kinds: dict[type, tuple[str, Any]] = {}  # array type -> (kind name, its library's from_dlpack)


def device_name(device: tuple[int, int]) -> str:
    kind, index = device
    name = DEVICE_NAMES.get(kind, f"device type {kind}")
    return name if kind == CPU else f"{name}:{index}"


def _library_of(value: object) -> tuple[str, Any]:
    """(kind name, from_dlpack) of a foreign array's library, cached per type."""
    found = _kinds.get(type(value))
    if found is not None:
        return found
    library = None
    get_namespace = getattr(value, "__array_namespace__", None)
    if get_namespace is not None:
        try:
            library = get_namespace()
        except Exception:  # an array API the object does not really implement
            library = None
    if library is None or not hasattr(library, "from_dlpack"):
        library = sys.modules.get(type(value).__module__.partition(".")[0])
    from_dlpack = getattr(library, "from_dlpack", None)
    name = (getattr(library, "__name__", None) or type(value).__module__).partition(".")[0]
    found = (name, from_dlpack)
    _kinds[type(value)] = found
    return found


def _dlpack_device(value: Any) -> tuple[int, int]:
    kind, index = value.__dlpack_device__()
    return (int(kind), int(index))


def cuda_interface_device(value: Any) -> tuple[int, int]:
    from . import cuda

    pointer = value.__cuda_array_interface__["data"][0]
    pointer_device = getattr(cuda, "pointer_device", None)  # the interface names no device
    return (CUDA, pointer_device(pointer) if pointer and pointer_device else 0)


_plain = (int, float, bool, complex, list, tuple, type(None))  # values that join any kind
_kind_by_type: dict[type, str | None] = {np.ndarray: "numpy"}  # answers of kind_of, per exact type


def kind_of(value: object) -> str | None:
    """The array library of one tensor argument, without asking where it lives (that
    costs microseconds in some libraries); None for values that join any kind
    (Python scalars, nested lists, None, objects NumPy converts).  Answered once
    per type: whether a type has ``__dlpack__`` is a property of the type."""
    found = _kind_by_type.get(type(value), False)
    if found is not False:
        return found  # type: ignore[return-value]  # False is the miss marker
    if isinstance(value, np.ndarray):
        found = "numpy"
    elif isinstance(value, _plain) or isinstance(value, np.generic):
        found = None
    elif hasattr(type(value), "__dlpack__") or hasattr(type(value), "__cuda_array_interface__"):
        found = _library_of(value)[0]
    elif hasattr(value, "__dlpack__") or hasattr(value, "__cuda_array_interface__"):
        return _library_of(value)[0]  # an instance attribute: not the type's answer
    else:
        found = None  # __array_interface__ / __array__ objects: NumPy converts them
    _kind_by_type[type(value)] = found
    return found


def device_of(value: object) -> tuple[int, int]:
    """DLPack's (device_type, device_id) of one tensor argument."""
    if isinstance(value, np.ndarray) or not (hasattr(value, "__dlpack__") or hasattr(value, "__cuda_array_interface__")):
        return HOST
    if hasattr(value, "__dlpack_device__"):
        return _dlpack_device(value)
    return cuda_interface_device(value)


class Placement:
    """Where one call's tensors live: their one kind and device, and how to hand outputs back.
    On the host, ``views`` holds the arguments with every array a NumPy view of its memory."""

    __slots__ = ("kind", "device", "from_dlpack", "example", "views")

    kind: str
    device: tuple[int, int]
    from_dlpack: Any  # the library's from_dlpack, or None
    example: Any
    views: tuple[Any, ...] | None

    def __init__(self, kind: str, device: tuple[int, int], example: Any,
                 views: tuple[Any, ...] | None = None) -> None:
        self.kind = kind
        self.device = device
        self.example = example  # one argument of the kind (its library's current stream is asked on it)
        self.from_dlpack = _library_of(example)[1]
        self.views = views

    @property
    def on_host(self) -> bool:
        return self.device[0] == CPU

    def detached(self) -> Placement:
        """This placement holding no argument (what a remembered call keeps: it must not keep
        a caller's array alive); wraps outputs as this one does on a device."""
        copy = Placement.__new__(Placement)
        copy.kind, copy.device, copy.from_dlpack, copy.example, copy.views = \
            self.kind, self.device, self.from_dlpack, None, None
        return copy

    def wrap(self, op: OpLike, index: int, output: Any) -> Any:
        """Output ``index`` of ``op`` (a NumPy array or a DLPack export) as an array of the caller's kind."""
        if self.from_dlpack is None:
            raise DeviceError(f"op '{op.name}': the array library '{self.kind}' has no from_dlpack, so opforge "
                              "cannot hand its outputs back; pass NumPy arrays or DLPack-capable arrays")
        name = getattr(op.outputs[index], "name", op.outputs[index])
        try:
            wrapped = self.from_dlpack(output)
        except BufferError as error:  # the library refused opforge's export
            raise DeviceError(f"op '{op.name}': output '{name}' cannot be handed to {self.kind} through DLPack: "
                              f"{error}") from None
        except SystemError:
            # Seen with JAX 0.11 and its GPU backend: importing any host DLPack array fails with a bare
            # SystemError (in the CPU device's stream query).  JAX gets a copy on the input's device instead.
            if self.kind != "jax" or not self.on_host:
                raise
            import jax

            wrapped = jax.device_put(np.asarray(output), next(iter(self.example.devices())))
        # NumPy arrays and opforge's DLPack exports both carry their dtype.
        given = _numpy_dtype(getattr(output, "dtype", None))
        if given is not None and given.itemsize == 8 and _dtype_name(wrapped) not in (None, given.name):
            # JAX without 64-bit types turns int64/float64 into 32-bit values, silently.
            raise DTypeError(f"op '{op.name}': output '{name}' is {given.name}, but {self.kind} made it "
                             f"{_dtype_name(wrapped)}"
                             + (" (64-bit types are off in JAX: jax.config.update('jax_enable_x64', True))"
                                if self.kind == "jax" else ""))
        return wrapped

    def wrap_result(self, op: OpLike, result: Any) -> Any:
        if op.tuple_output:
            return tuple(self.wrap(op, k, r) for k, r in enumerate(result))
        return self.wrap(op, 0, result)


def _numpy_dtype(dtype: npt.DTypeLike | None) -> np.dtype[Any] | None:
    """A NumPy dtype, an opforge dtype name ("bfloat16" too) or None, as a NumPy dtype or None."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)
    except TypeError:
        try:
            return to_numpy(dtype)
        except DTypeError:
            return None


def _dtype_name(array: Any) -> str | None:
    """The NumPy name of an array's dtype, or None where it is not a NumPy dtype (torch's)."""
    try:
        return np.dtype(array.dtype).name  # type: ignore[no-any-return, unused-ignore]  # np.dtype(Any): Any
    except TypeError:
        return None


def placement(op: OpLike, args: Sequence[Any]) -> Placement | None:
    """The call's Placement, or None when every tensor is NumPy on the host
    (the plain path).  DeviceError when kinds are mixed, or devices on the host
    side; the device path checks each GPU input's device as it takes it
    (``mixed_devices``), so a call asks one argument for its device here."""
    kind = example = None
    tensors = []
    for index, value in enumerate(args):
        found = kind_of(value)
        if found is None:
            continue
        tensors.append((index, found))
        if kind is None:
            kind, example = found, value
        elif found != kind:
            _mixed(op, args, _tensors(args))
    if kind is None or kind == "numpy":
        return None
    device = device_of(example)
    if device != HOST:
        return Placement(kind, device, example)
    views = list(args)
    try:  # the rest are on the host too when NumPy can view them: no need to ask each for its device
        for index, _ in tensors:
            views[index] = np.from_dlpack(args[index])
        return Placement(kind, HOST, example, tuple(views))
    except Exception:
        pass
    if len({device_of(args[index]) for index, _ in tensors}) > 1:
        _mixed(op, args, tensors)
    for index, _ in tensors:  # on the host, yet NumPy cannot view one of them: say which and why
        _host_view(op, index, args[index])
    return Placement(kind, HOST, example)


def _tensors(args: Sequence[Any]) -> list[tuple[int, str | None]]:
    """(index, kind) of the arguments that are arrays."""
    return [(k, kind) for k, kind in ((k, kind_of(v)) for k, v in enumerate(args)) if kind is not None]


def mixed_devices(op: OpLike, args: Sequence[Any]) -> NoReturn:
    """The DeviceError for a call whose array inputs are on more than one device."""
    _mixed(op, args, _tensors(args))


def _mixed(op: OpLike, args: Sequence[Any], tensors: Sequence[tuple[int, str | None]]) -> NoReturn:
    listed = ", ".join(f"'{op.input_name(k)}' is {kind} on {device_name(device_of(args[k]))}" for k, kind in tensors)
    first = tensors[0][1]
    raise DeviceError(f"op '{op.name}': one call takes arrays of one kind on one device, but {listed}; "
                      f"convert them first (e.g. with {first}.from_dlpack or .to(device))")


def _host_view(op: OpLike, index: int, value: Any) -> np.ndarray[Any, Any]:
    """A host array of another library as a NumPy array sharing its memory, or the typed error saying why not."""
    try:
        return np.from_dlpack(value)
    except (BufferError, TypeError, ValueError, RuntimeError) as error:
        # NumPy refuses a dtype it lacks (bfloat16) with a BufferError from 2.5 on, another error before;
        # other BufferErrors are the producer's refusal (a torch tensor that requires grad, say).
        if isinstance(error, BufferError) and "dtype" not in str(error).lower():
            raise DeviceError(f"op '{op.name}': input '{op.input_name(index)}' ({type(value).__name__}) cannot be "
                              f"shared through DLPack: {error}") from None
        dtype = getattr(value, "dtype", "?")
        raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}' ({type(value).__name__} of dtype {dtype}) "
                         f"cannot be viewed as a NumPy array: {error}") from None


def host_view(op: OpLike, index: int, value: Any) -> Any:
    """One argument as the host path takes it: arrays of other libraries as NumPy views of their memory."""
    if kind_of(value) in (None, "numpy"):
        return value
    return _host_view(op, index, value)
