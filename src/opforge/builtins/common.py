"""Helpers shared by several built-in ops."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge.runtime.aot import C_TYPES  # what OPFORGE_T stands for, per dtype

if TYPE_CHECKING:
    from opforge.dtypes import DTypeLike
    from opforge.spec import TensorSpec


def floating_point(op_name: str, input_name: str) -> Callable[..., None]:
    """A check rejecting a non-float input (integer true division, sqrt, log
    of integers would otherwise need a dtype the op does not give)."""

    def check(*specs: TensorSpec, **attrs: Any) -> None:
        spec = specs[0]
        if not spec.dtype.startswith(("float", "bfloat")):
            raise opforge.DTypeError(f"op '{op_name}': input '{input_name}' has dtype {spec.dtype}; "
                                     f"{op_name} takes floating-point tensors (cast it first)")

    return check


def known_dims(value: Any) -> tuple[int, ...]:
    """The shape of an array, or of a traced value with -1 for its unknown dims
    (for gradient rules, which build attributes from shapes)."""
    spec = getattr(value, "spec", None)
    return tuple(spec.shape) if spec is not None else tuple(value.shape)


def shapes_agree(expected: Sequence[int], given: Sequence[int]) -> bool:
    """Whether a gradient op's ``dy`` of shape ``given`` can be the output of shape ``expected``:
    one rank, and equal dims wherever both are known (-1 is unknown: a trace with symbolic dims)."""
    return len(expected) == len(given) and all(e == g or -1 in (e, g) for e, g in zip(expected, given))


def zeros_like(x: Any, dtype: DTypeLike) -> Any:
    """Zeros of x's shape, known at trace time or only at run time (for
    gradient rules on graphs traced with unknown dims)."""
    spec = getattr(x, "spec", None)
    if spec is None or spec.is_static:
        return np.zeros(known_dims(x), dtype)
    # x < x is false for every x, NaN and infinities included (x * 0 is not).
    return opforge.ops.cast(opforge.ops.less(x, x), dtype=dtype)


FLOATS = ["float32", "float64"]
NUMERIC = FLOATS + ["int32", "int64"]
# The ISA variants of vectorized CPU kernels: SSE2 (every x86-64), then 8 and 16 floats a vector.
SIMD_ISAS = (None, "avx2", "avx512")

# GPU kernels: .cu sources beside the op files, each one library for every
# dtype it lists (the element type is picked from the dtype name at run time,
# so one nvcc build serves them all).  They are not prebuilt: nvcc compiles
# them at first GPU use (see opforge.runtime.prebuilt).
GPU_FLOATS = ["float16", "float32", "float64"]
GPU_NUMERIC = GPU_FLOATS + ["int32", "int64"]


# include_dirs of a built-in source that includes the headers beside the built-ins (elements.h, lanes.h, ...).
HEADER_DIRS = [str(Path(__file__).parent)]


def gpu_source(file: str, function: str) -> str:
    """``"<builtins folder>/file:function"``, the ``source=`` of a built-in GPU kernel."""
    return f"{Path(__file__).with_name(file)}:{function}"


def same_dtypes(dtypes: Iterable[str], inputs: int = 1) -> list[tuple[str, ...]]:
    """Full dtype signatures with every input of one dtype, for ``op.kernel(dtypes=...)``."""
    return [(d,) * inputs for d in dtypes]


def every_dtype(source: str, function: str, dtypes: Sequence[str], by: int = 0) -> str:
    """``source`` -- written for one element type ``OPFORGE_T``, as sources
    given ``dtypes={...}`` are -- made into one library for all ``dtypes``:
    a copy per dtype in a namespace of its own, and ``function`` choosing the
    copy by input ``by``'s dtype name at run time.  One compile (about twice
    as long) instead of one per dtype."""
    # The source's includes come first, so inside the namespaces they add nothing (headers are guarded).
    includes = dict.fromkeys(line for line in source.splitlines() if line.startswith("#include"))
    parts = ["#include <cstring>\n", *(f"{line}\n" for line in includes)]
    for dtype in dtypes:
        parts.append(f"#define OPFORGE_T {C_TYPES[dtype]}\n#define {function} {function}_{dtype}\n"
                     f"namespace {dtype}_variant {{\n{source}\n}}\n#undef {function}\n#undef OPFORGE_T\n")
    args = "nparam, params, ndims, shapes, dtypes, stream, extra"
    choices = "".join(f'  if (!std::strcmp(dtypes[{by}], "{d}")) return {d}_variant::{function}_{d}({args});\n'
                      for d in dtypes)
    parts.append(f"""extern "C" int {function}(int nparam, void **params, int *ndims, int64_t **shapes,
                     const char **dtypes, void *stream, void *extra) {{
{choices}  return 1;
}}
""")
    return "".join(parts)
