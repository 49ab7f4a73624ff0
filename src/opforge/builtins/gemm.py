"""gemm: y = alpha * a' @ b' + beta * c, a' = a or a^T, b' = b or b^T (ONNX Gemm).

a and b are matrices; c, optional, broadcasts to y's (m, n) one way (rank
0, 1 or 2, each dim 1 or y's).  alpha and beta are float32, as in ONNX.  The
kernel writes beta * c into y and lets OpenBLAS's gemm add the product; it
needs OpenBLAS (``opforge.runtime.blas``) and every input, so a call without
c runs a small Python kernel that passes zeros instead (see
``zeros_for_absent``).  The gradient is gemm again, with the transposes
swapped.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, known_dims
from opforge.runtime import blas

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import Op
    from opforge.operator import KernelDTypes

gemm = opforge.op("gemm(Tensor a, Tensor b, Tensor? c, *, float alpha=1.0, float beta=1.0, bool trans_a=False, "
                  "bool trans_b=False) -> Tensor y",
                  traits=["no_side_effect"],
                  doc="alpha * op(a) @ op(b) + beta * c for matrices a, b (op: transposed when trans_a / trans_b) "
                      "and c broadcast to the product's shape (ONNX Gemm).")


def same_float_dtype(op_name: str, specs: Sequence[TensorSpec | None], names: Sequence[str]) -> None:
    """DTypeError unless every present spec has the first one's float dtype (float16 runs the reference)."""
    first = specs[0].dtype  # type: ignore[union-attr]  # the first is a required input
    if first not in FLOATS + ["float16"]:
        raise opforge.DTypeError(f"op '{op_name}': input '{names[0]}' has dtype {first}; {op_name} takes float16, "
                                 "float32 or float64")
    for spec, name in zip(specs[1:], names[1:]):
        if spec is not None and spec.dtype != first:
            raise opforge.DTypeError(f"op '{op_name}': input '{name}' has dtype {spec.dtype}, input '{names[0]}' "
                                     f"has {first}; {op_name} takes one dtype")


def gemm_dims(a: TensorSpec, b: TensorSpec, trans_a: bool, trans_b: bool) -> tuple[int, int]:
    """(m, k) of op(a) and (k, n) of op(b); ShapeError for a rank other than 2 or unequal k."""
    for name, spec in (("a", a), ("b", b)):
        if spec.rank is not None and spec.rank != 2:
            raise opforge.ShapeError(f"op 'gemm': input '{name}' has shape {list(spec.shape)}; gemm takes matrices "
                                     "(rank 2)")
    a_shape = a.shape if a.rank is not None else (-1, -1)
    b_shape = b.shape if b.rank is not None else (-1, -1)
    m, k = a_shape[::-1] if trans_a else a_shape
    k2, n = b_shape[::-1] if trans_b else b_shape
    if -1 not in (k, k2) and k != k2:
        raise opforge.ShapeError(f"op 'gemm': the inner dims differ: op(a) has {k} columns, op(b) has {k2} rows "
                                 f"(shapes {list(a.shape)}, {list(b.shape)}, trans_a={trans_a}, trans_b={trans_b})")
    return m, n


@gemm.infer
def gemm_infer(a: TensorSpec, b: TensorSpec, c: TensorSpec | None, *, alpha: float, beta: float, trans_a: bool,
               trans_b: bool) -> TensorSpec:
    same_float_dtype("gemm", [a, b, c], ["a", "b", "c"])
    m, n = gemm_dims(a, b, trans_a, trans_b)
    if c is not None and c.rank is not None:
        if c.rank > 2:
            raise opforge.ShapeError(f"op 'gemm': input 'c' has shape {list(c.shape)}; it must broadcast to "
                                     f"[{m}, {n}] (rank <= 2)")
        for dim, want in zip(c.shape[::-1], (n, m)):
            if dim not in (-1, 1) and want != -1 and dim != want:
                raise opforge.ShapeError(f"op 'gemm': input 'c' has shape {list(c.shape)}, which does not broadcast "
                                         f"to the product's shape [{m}, {n}]")
    return TensorSpec((m, n), a.dtype)


@gemm.reference(fallback=True)
def gemm_reference(a: npt.NDArray[Any], b: npt.NDArray[Any], c: npt.NDArray[Any] | None, *, alpha: float,
                   beta: float, trans_a: bool, trans_b: bool) -> npt.NDArray[Any]:
    dtype = a.dtype
    y: npt.NDArray[Any] = (a.T if trans_a else a) @ (b.T if trans_b else b) * dtype.type(np.float32(alpha))
    if c is not None:
        y = y + dtype.type(np.float32(beta)) * c
    return y.astype(dtype, copy=False)


@gemm.grad(save=["a", "b", "c"])
def gemm_grad(saved: Any, dy: Any, *, alpha: float, beta: float, trans_a: bool, trans_b: bool) -> tuple[Any, Any, Any]:
    a, b, g = saved.a, saved.b, opforge.ops.gemm
    # y = alpha a' b': da' = alpha dy b'^T, db' = alpha a'^T dy; a transposed operand takes the transpose.
    if trans_a:
        da = g(b, dy, None, alpha=alpha, trans_a=trans_b, trans_b=True)
    else:
        da = g(dy, b, None, alpha=alpha, trans_b=not trans_b)
    if trans_b:
        db = g(dy, a, None, alpha=alpha, trans_a=True, trans_b=trans_a)
    else:
        db = g(a, dy, None, alpha=alpha, trans_a=not trans_a)
    if saved.c is None:
        return da, db, None
    c_dims = known_dims(saved.c)
    dc = opforge.ops.mul(dy, np.asarray(np.float32(beta), dy.dtype))
    if len(c_dims) < 2:  # c broadcast along rows: sum them (and the columns when c has one value)
        dc = opforge.ops.reduce_sum(dc, axes=[0] if len(c_dims) == 1 and c_dims != (1,) else [])
        return da, db, opforge.ops.reshape(dc, shape=list(c_dims))
    axes = [d for d in range(2) if c_dims[d] == 1]
    return da, db, opforge.ops.reduce_sum(dc, axes=axes, keep_dims=True) if axes else dc


def zeros_for_absent(op: Op, index: int, zeros: Callable[..., Any], dtypes: KernelDTypes) -> None:
    """Add a Python kernel for calls that leave optional input ``index`` out: it
    calls ``op`` again with ``zeros(*arrays, **attrs)`` there, so the BLAS kernel (a native
    kernel, which needs every input) runs.  Needs OpenBLAS as that kernel does."""
    def fill(*arrays: Any, **attrs: Any) -> Any:
        if arrays[index] is not None:  # the native kernel refused these inputs: the reference's turn
            return op.reference_kernel.fn(*arrays, **attrs)  # type: ignore[union-attr]  # a PyKernel: op.reference's
        given = list(arrays)  # a list of its own (arrays is a tuple)
        given[index] = zeros(*given, **attrs)
        return op(*given, **attrs)

    fill.__name__ = f"{op.name}_without_{op.inputs[index].name}"
    op.kernel(fill, dtypes=dtypes)
    blas.requiring(op.kernels[-1])


GEMM = r"""
#include "custom_aot_extra.h"
#include "opforge_blas.h"

typedef OPFORGE_T T;

extern "C" int Gemm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  const T *a = static_cast<const T *>(params[0]);
  const T *b = static_cast<const T *>(params[1]);
  const T *c = static_cast<const T *>(params[2]);
  T *y = static_cast<T *>(params[3]);
  auto *attrs = static_cast<AotExtra *>(extra);
  const bool trans_a = attrs->Attr<bool>("trans_a"), trans_b = attrs->Attr<bool>("trans_b");
  const T alpha = T(attrs->Attr<float>("alpha")), beta = T(attrs->Attr<float>("beta"));
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] > 2 || ndims[3] != 2) return 1;  // inference rejects these first
  const int64_t m = shapes[3][0], n = shapes[3][1];
  const int64_t k = trans_a ? shapes[0][0] : shapes[0][1];
  if ((trans_b ? shapes[1][1] : shapes[1][0]) != k) return 2;
  // c's dims as (rows, columns), 1 where it broadcasts.
  const int64_t c_rows = ndims[2] == 2 ? shapes[2][0] : 1;
  const int64_t c_cols = ndims[2] >= 1 ? shapes[2][ndims[2] - 1] : 1;
  if ((c_rows != 1 && c_rows != m) || (c_cols != 1 && c_cols != n)) return 3;
  if (!OpforgeBlasFits({m, n, k})) return 4;
  for (int64_t i = 0; i < m; i++) {
    const T *c_row = c + (c_rows == 1 ? 0 : i * c_cols);
    T *y_row = y + i * n;
    if (c_cols == 1)
      for (int64_t j = 0; j < n; j++) y_row[j] = beta * c_row[0];
    else
      for (int64_t j = 0; j < n; j++) y_row[j] = beta * c_row[j];
  }
  try {  // (the pool): nothing crosses the ABI
    OpforgeGemmParallel(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, T(1), y, n);
  } catch (...) {
    return 5;
  }
  return 0;
}
"""
blas.requiring(gemm.kernel(function="Gemm", dtypes={"a": FLOATS, "b": FLOATS, "c": FLOATS}, code=GEMM))
zeros_for_absent(gemm, 2, lambda a, b, c, **_: np.zeros((), a.dtype), {"a": FLOATS, "b": FLOATS})
