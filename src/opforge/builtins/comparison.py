"""equal, not_equal, less, less_equal, greater, greater_equal: y = a <op> b,
elementwise with NumPy broadcasting; y is bool.

Six ops, one per comparison, compiling add.py's broadcasting source with
their own operation and a bool output.  Comparisons have no gradient.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, BINARY_DTYPES

# op name -> (NumPy function, C++ operator)
COMPARISONS = {
    "equal": (np.equal, "=="),
    "not_equal": (np.not_equal, "!="),
    "less": (np.less, "<"),
    "less_equal": (np.less_equal, "<="),
    "greater": (np.greater, ">"),
    "greater_equal": (np.greater_equal, ">="),
}
_BOOL_OUTPUT = {**BINARY_DTYPES, "y": ["bool"] * len(BINARY_DTYPES["a"])}


def comparison(name, numpy_fn, operator):
    op = opforge.op(f"{name}(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "no_grad"],
                    doc=f"Elementwise a {operator} b with NumPy broadcasting; y is bool.")
    op.def_infer(infer.broadcast(dtype="bool"))

    def reference(a, b):
        return numpy_fn(a, b)

    reference.__name__ = f"{name}_reference"
    op.reference(reference)
    op.kernel(function="Binary", dtypes=_BOOL_OUTPUT, code=BINARY_BROADCAST, name=name.title().replace("_", ""),
              cflags=[f"-DOPFORGE_BINARY(x,y)=((x) {operator} (y))"])
    return op


equal, not_equal, less, less_equal, greater, greater_equal = (
    comparison(name, numpy_fn, operator) for name, (numpy_fn, operator) in COMPARISONS.items())
