"""Every error opforge raises is an ``OpforgeError``.

Each class also derives from the closest built-in exception, so code that
catches ``TypeError`` or ``ValueError`` keeps working.  Messages name the op,
the argument and what was expected.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["OpforgeError", "SchemaError", "ArityError", "DTypeError", "ShapeError", "AttrError", "CheckError",
           "InferenceError", "KernelError", "AllocationError", "GradientError", "NoKernelError", "CompileError",
           "KernelSourceError", "CompilerNotFoundError", "SymbolNotFoundError", "CudaError", "DeviceError",
           "GraphError", "TracingError", "CacheError", "BuildError", "ModelError", "UnsupportedOpError"]


class OpforgeError(Exception):
    """Base class of all opforge errors."""


class SchemaError(OpforgeError, ValueError):
    """An op declaration (schema, registration info) is malformed."""


class ArityError(OpforgeError, TypeError):
    """An op was called with the wrong number of tensor inputs."""


class DTypeError(OpforgeError, TypeError):
    """An input has a dtype the op (or the chosen kernel) does not accept."""


class ShapeError(OpforgeError, ValueError):
    """An input shape contradicts the op's declaration or inference."""


class AttrError(OpforgeError, TypeError):
    """An attribute is unknown, missing, or of the wrong type."""


class CheckError(OpforgeError, ValueError):
    """An op's check function rejected its inputs or attributes."""


class InferenceError(OpforgeError, ValueError):
    """Shape or dtype inference failed or returned something invalid."""


class KernelError(OpforgeError, RuntimeError):
    """A kernel returned a non-zero status or raised."""

    def __init__(self, message: str, *, op: str | None = None, function: str | None = None,
                 code: int | None = None) -> None:
        super().__init__(message)
        self.op = op
        self.function = function
        self.code = code


class AllocationError(KernelError, MemoryError):
    """A kernel's outputs or workspace cannot be allocated: an impossible size, or more memory than there is."""


class GradientError(OpforgeError, TypeError):
    """An op cannot be differentiated: it has trait no_grad or no gradient rule."""


class NoKernelError(OpforgeError, RuntimeError):
    """No registered kernel matches the call (device, dtypes, ISA, layout)."""


class CompileError(OpforgeError, RuntimeError):
    """The compiler rejected a kernel source. ``output`` holds its full message."""

    def __init__(self, message: str, *, command: Sequence[str] | None = None, output: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.output = output


class KernelSourceError(OpforgeError, FileNotFoundError):
    """A kernel's source or library file does not exist."""


class CompilerNotFoundError(OpforgeError, RuntimeError):
    """No compiler for a source's language could be found."""


class SymbolNotFoundError(OpforgeError, AttributeError):
    """A kernel library does not export the requested function."""

    def __init__(self, message: str, *, symbol: str | None = None, library: str | None = None,
                 close_matches: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.symbol = symbol
        self.library = library
        self.close_matches = list(close_matches)


class CudaError(OpforgeError, RuntimeError):
    """The CUDA runtime is missing or reported an error."""

    code: int | None = None  # the cudaError_t, where the runtime gave one
    sticky: bool = False  # the error leaves the CUDA context unusable (the process must restart to use the GPU)


class DeviceError(OpforgeError, TypeError):
    """One call mixes array kinds (NumPy and torch, say) or devices, hands an op arrays on a device none of
    its kernels runs on, or an array cannot be shared where it lives; names the inputs and where each lives."""


class GraphError(OpforgeError, ValueError):
    """A graph (or its JSON) is malformed: names the node, the field and what was expected."""


class TracingError(OpforgeError, TypeError):
    """Tracing met something it cannot record (a data-dependent bool, an unknown dim used as an int)."""


class CacheError(OpforgeError, OSError):
    """The build cache folder cannot be used (names the folder and OPFORGE_CACHE_DIR)."""


class BuildError(OpforgeError, ValueError):
    """A build opforge cannot start: not a kernel source, an unknown language or CUDA architecture."""


class ModelError(GraphError):
    """An ONNX model opforge cannot convert: malformed, or a node whose attribute values or inputs opforge does not
    support (names the node, its op_type, the attribute or input and what is supported)."""


class UnsupportedOpError(ModelError):
    """A model holds nodes no converter covers; ``unsupported`` lists every (domain, op_type, opset) at once."""

    def __init__(self, message: str, unsupported: Iterable[tuple[str, str, int]] = ()) -> None:
        super().__init__(message)
        self.unsupported = list(unsupported)
