"""Run ONNX models with opforge (needs the optional ``onnx`` package).

    graph = opforge.onnx.load("model.onnx")      # an opforge Graph (a DynamicModel when it computes
    y = graph(x)                                 # its shapes at run time: one graph per input signature)

Each ONNX op type is converted by a small function (``converter``) chosen by
the model's opset; nodes of a custom domain ``D`` bind to the opforge op
``D::op_type`` or to the op given to ``register``.
"""
from ..errors import ModelError, UnsupportedOpError  # noqa: F401
from .load import DynamicModel, load  # noqa: F401
from .export import export  # noqa: F401
from .registry import converter, find_converter, register  # noqa: F401
from .backend import OpforgeBackend  # noqa: F401

__all__ = ["load", "DynamicModel", "export", "register", "converter", "find_converter", "ModelError", "UnsupportedOpError"]
