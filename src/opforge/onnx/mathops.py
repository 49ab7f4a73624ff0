"""Converters of ONNX's math ops that exported transformer and CNN models
use beyond the arithmetic of elementwise.py: the trigonometric and
hyperbolic functions (Sin ... Atanh; rotary position embeddings take Sin and
Cos of a frequency table).

float16 and bfloat16 inputs are computed in float32 and cast back, as
elementwise.py's unary ops are.
"""
from __future__ import annotations


import opforge
from .elementwise import FLOATS, unary

ops = opforge.ops

# ONNX op type -> (opforge op, the opset that introduced it)
TRIGONOMETRIC = {
    "Sin": (ops.sin, 7), "Cos": (ops.cos, 7), "Tan": (ops.tan, 7), "Asin": (ops.asin, 7), "Acos": (ops.acos, 7),
    "Atan": (ops.atan, 7), "Sinh": (ops.sinh, 9), "Cosh": (ops.cosh, 9), "Asinh": (ops.asinh, 9),
    "Acosh": (ops.acosh, 9), "Atanh": (ops.atanh, 9),
}
for _op_type, (_fn, _since) in TRIGONOMETRIC.items():
    unary(_op_type, _fn, FLOATS, since=_since)
del _op_type, _fn, _since
