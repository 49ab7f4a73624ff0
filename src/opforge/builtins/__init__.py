"""Built-in ops.  Each module is one op -- schema, C++ kernel, NumPy reference
(and gradient) side by side -- written only with the public API, so any of
them can be copied as the template of a new op."""
from . import relu  # noqa: F401
