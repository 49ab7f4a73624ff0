"""Run ONNX models with opforge (needs the optional ``onnx`` package)."""
from ..errors import ModelError, UnsupportedOpError  # noqa: F401
