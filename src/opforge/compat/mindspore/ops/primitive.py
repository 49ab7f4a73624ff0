"""``Primitive``: what every MindSpore primitive shares -- a name and attributes."""
from __future__ import annotations

from typing import Any


class Primitive:
    """A MindSpore primitive's name and attributes: ``add_prim_attr`` keeps one
    and returns the primitive, so calls chain as MindSpore programs write them
    (``ConvertToDynamic().add_prim_attr("primitive_target", "CPU")``).  opforge
    chooses devices from the data, so ``primitive_target`` is kept, not obeyed."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or type(self).__name__
        self.attrs: dict[str, Any] = {}

    def add_prim_attr(self, name: str, value: Any) -> Primitive:
        self.attrs[name] = value
        return self

    def del_prim_attr(self, name: str) -> Primitive:
        self.attrs.pop(name, None)
        return self

    def __repr__(self) -> str:
        return f"Prim[{self.name}]"
