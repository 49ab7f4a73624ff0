"""opforge: custom tensor operators, defined once.

    import opforge
    op = opforge.Custom("./kernel.cc:CustomKernel", out_shape=None, out_dtype="float32",
                        reg_info=opforge.CustomRegOp("add_reduce").attr("axis", "required", "all", value=1)...)
    y = op(x1, x2)
"""
import pathlib

from . import cuda, errors, infer, ops
from .attrs import AttrDef
from .dtypes import ABI_DTYPES
from .errors import *  # noqa: F401,F403 - the typed errors are part of the public API
from .frontends.declarations import load_ops
from .frontends.mindspore import Custom, CustomRegOp, DataType
from .operator import InputDef, Kernel, Op, PyKernel
from .registry import lookup, op, registered_ops
from .runtime.aot import AotKernel
from .runtime.build import build, cache_dir
from .runtime.checks import checks_enabled, set_checks
from .runtime.cpu import cpu_features, isa_cap, set_isa_cap
from .runtime.parallel import get_num_threads, set_num_threads
from .spec import TensorSpec

from . import testing  # noqa: E402
from .graph import Graph, trace  # noqa: E402
from .graph.autodiff import backward, grad, value_and_grad, vjp  # noqa: E402
from . import builtins  # noqa: E402,F401 - registers the built-in ops (kernels compile on first use)

__version__ = "0.1.0"

# The public names (what ``from opforge import *`` and type checkers see as exported).
__all__ = [
    "ABI_DTYPES", "AotKernel", "AttrDef", "Custom", "CustomRegOp", "DataType", "Graph", "InputDef", "Kernel", "Op",
    "PyKernel", "TensorSpec", "__version__", "backward", "build", "builtins", "cache_dir", "checks_enabled",
    "cpu_features", "cuda", "errors", "get_num_threads", "grad", "include_dir", "infer", "isa_cap", "load_ops",
    "lookup", "op", "ops", "registered_ops", "set_checks", "set_isa_cap", "set_num_threads", "testing", "trace",
    "value_and_grad", "vjp",
]
__all__ += errors.__all__


def include_dir() -> str:
    """Folder holding ``custom_aot_extra.h``; pass it to your compiler with -I."""
    return str(pathlib.Path(__file__).resolve().parent / "include")
