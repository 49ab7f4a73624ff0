"""equal, not_equal, less, less_equal, greater, greater_equal: y = a <op> b,
elementwise with NumPy broadcasting; y is bool.

Six ops, one per comparison, compiling add.py's broadcasting source (for
every dtype in one library) with their own operation and a bool output.  Comparisons have no gradient.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST
from opforge.builtins.common import NUMERIC, SIMD_ISAS, every_dtype

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import Op

# op name -> (NumPy function, C++ operator)
COMPARISONS = {
    "equal": (np.equal, "=="),
    "not_equal": (np.not_equal, "!="),
    "less": (np.less, "<"),
    "less_equal": (np.less_equal, "<="),
    "greater": (np.greater, ">"),
    "greater_equal": (np.greater_equal, ">="),
}
_EVERY_DTYPE = every_dtype(BINARY_BROADCAST, "Binary", NUMERIC)


def comparison(name: str, numpy_fn: np.ufunc, operator: str) -> Op:
    op = opforge.op(f"{name}(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise", "no_grad"],
                    doc=f"Elementwise a {operator} b with NumPy broadcasting; y is bool.")
    op.def_infer(infer.broadcast(dtype="bool"))

    def reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
        y: npt.NDArray[np.bool_] = numpy_fn(a, b)
        return y

    reference.__name__ = f"{name}_reference"
    op.reference(reference)
    for isa in SIMD_ISAS:  # wider compares, and masks packed to bytes in fewer steps
        op.kernel(function="Binary", code=_EVERY_DTYPE, dtypes=[(d, d) for d in NUMERIC], isa=isa,
                  name=name.title().replace("_", ""),
                  cflags=["-fno-trapping-math", "-DOPFORGE_T_y=bool", f"-DOPFORGE_BINARY(x,y)=((x) {operator} (y))"])
    return op


equal, not_equal, less, less_equal, greater, greater_equal = (
    comparison(name, numpy_fn, operator) for name, (numpy_fn, operator) in COMPARISONS.items())
