"""The slice of MindSpore's Python API that aot custom-op programs use.

A MindSpore program runs on opforge by changing its imports only:

    from opforge.compat.mindspore import Tensor
    from opforge.compat.mindspore import dtype as mstype
    from opforge.compat.mindspore.nn import Cell
    import opforge.compat.mindspore as ms
    import opforge.compat.mindspore.ops as ops
    from opforge.compat.mindspore.ops import DataType, CustomRegOp

Tensors are NumPy arrays underneath; ``Cell`` runs ``construct`` eagerly.
"""
from . import common, nn, ops
from .common import dtype
from .tensor import Tensor

_context = {"device_target": "CPU", "mode": 1}

GRAPH_MODE = 0
PYNATIVE_MODE = 1


def set_context(**kwargs):
    """Accepts MindSpore's context options; only ``device_target`` and ``mode`` are kept."""
    target = kwargs.get("device_target")
    if target is not None and target not in ("CPU", "GPU"):
        raise ValueError(f"device_target must be 'CPU' or 'GPU' on opforge, got {target!r}")
    _context.update(kwargs)


def get_context(key):
    return _context.get(key)


__all__ = ["Tensor", "dtype", "nn", "ops", "common", "set_context", "get_context", "GRAPH_MODE", "PYNATIVE_MODE"]
