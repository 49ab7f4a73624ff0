"""Parse op schemas such as

    "mylib::leaky_relu(Tensor x, *, float alpha=0.01) -> Tensor y"
    "com.example::MyOp(Tensor x) -> Tensor y"          (a dotted namespace, as ONNX domains are)

Inputs are ``Tensor``, ``Tensor?`` (optional) or ``Tensor[]`` (variadic);
attributes are ``bool int float str int[] float[] int[][] float[][] Shape
DType``, with an optional ``=default`` (a Python literal).  Parameters after
``*`` are keyword-only.  Outputs are ``Tensor name`` or a parenthesised list.
A malformed schema raises ``SchemaError`` pointing at the column.
"""
from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass
from typing import NoReturn, cast

from .attrs import ATTR_TYPES, REQUIRED, AttrDef, check_attr
from .errors import OpforgeError, SchemaError
from .operator import InputDef

_TOKEN = re.compile(r"\s*(?:(?P<arrow>->)|(?P<colons>::)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
                    r"|(?P<punct>[(),*=?.\[\]])|(?P<literal>-?[0-9][0-9.eE+-]*|'[^']*'|\"[^\"]*\"))")


@dataclass
class ParsedSchema:
    namespace: str | None
    name: str
    inputs: list[InputDef]
    attrs: list[AttrDef]
    outputs: list[str]

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        """The schema in canonical form: parsing it gives this schema back."""
        params = [("Tensor[]" if i.variadic else "Tensor?" if i.optional else "Tensor") + f" {i.name}"
                  for i in self.inputs]
        star = False
        for a in self.attrs:
            if not a.positional and not star:
                params.append("*")
                star = True
            default = "" if a.default is REQUIRED else f"={_literal(a.default)}"
            params.append(f"{a.type} {a.name}{default}")
        outputs = ", ".join(f"Tensor {name}" for name in self.outputs)
        return f"{self.qualified_name}({', '.join(params)}) -> " + (
            f"({outputs})" if len(self.outputs) > 1 else outputs)


def _literal(value: object) -> str:
    """A default as the schema writes it: lists in brackets, infinities as overflowing literals."""
    if isinstance(value, tuple):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "1e999" if value > 0 else "-1e999"
    return repr(value)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str, pos: int | None = None) -> NoReturn:
        pos = self.pos if pos is None else pos
        pointer = " " * pos + "^"
        raise SchemaError(f"{message} at column {pos + 1}\n  {self.text}\n  {pointer}")

    def peek(self) -> tuple[str | None, str | None, int]:
        match = _TOKEN.match(self.text, self.pos)
        if match is None:
            return None, None, len(self.text.rstrip()) if self.pos >= len(self.text.rstrip()) else self.pos
        kind = cast(str, match.lastgroup)  # every alternative of _TOKEN is a named group
        start = match.start(kind)
        return kind, match.group(kind), start

    def next(self) -> tuple[str, str, int]:
        match = _TOKEN.match(self.text, self.pos)
        if match is None:
            if self.text[self.pos:].strip():
                start = len(self.text) - len(self.text[self.pos:].lstrip())
                self.fail(f"unexpected character {self.text[start]!r}", start)
            self.fail("unexpected end of schema", len(self.text))
        self.pos = match.end()
        kind = cast(str, match.lastgroup)
        return kind, match.group(kind), match.start(kind)

    def expect(self, value: str) -> int:
        kind, token, start = self.next()
        if token != value:
            self.fail(f"expected {value!r}, found {token!r}", start)
        return start

    def at(self, value: str) -> bool:
        return self.peek()[1] == value

    def at_end(self) -> bool:
        return not self.text[self.pos:].strip()

    # type := name ('?' | '[' ']' ('[' ']')?)?
    def parse_type(self) -> tuple[str, int]:
        kind, base, start = self.next()
        if kind != "name":
            self.fail(f"expected a type, found {base!r}", start)
        suffix = ""
        while self.at("[") or self.at("?"):
            if self.at("?"):
                self.next()
                suffix += "?"
            else:
                self.next()
                self.expect("]")
                suffix += "[]"
        return base + suffix, start

    def parse_default(self) -> tuple[object, int]:
        depth, start = 0, None
        while True:
            kind, token, pos = self.peek()
            if token is None:
                break
            if token in (",", ")") and depth == 0:
                break
            start = pos if start is None else start
            depth += token == "["
            depth -= token == "]"
            self.next()
        if start is None:
            self.fail("expected a default value after '='")
        source = self.text[start:self.pos].strip()
        words = {"true": "True", "false": "False", "None": "None"}
        try:
            return ast.literal_eval(words.get(source, source)), start
        except Exception:  # ValueError, SyntaxError, TypeError ({[1]: 2}), RecursionError ([[[[...)
            self.fail(f"default {source!r} is not a literal", start)

    def parse(self) -> ParsedSchema:
        kind, first, start = self.next()
        if kind != "name":
            self.fail("expected the op name", start)
        namespace: str | None = None
        name = first
        dotted = [first]  # a namespace may be dotted, as ONNX domains are: "com.example::MyOp"
        while self.at("."):
            self.next()
            kind, part, part_start = self.next()
            if kind != "name":
                self.fail("expected a name after '.' in the namespace", part_start)
            dotted.append(part)
        if len(dotted) > 1 and not self.at("::"):
            self.fail("a dotted name is a namespace: expected '::' and the op name")
        first = ".".join(dotted)
        if self.at("::"):
            self.next()
            kind, name, start = self.next()
            if kind != "name":
                self.fail("expected the op name after '::'", start)
            namespace = first
        self.expect("(")
        inputs: list[InputDef] = []
        attrs: list[AttrDef] = []
        keyword_only = False
        seen: set[str] = set()
        while not self.at(")"):
            if self.at("*"):
                self.next()
                keyword_only = True
            else:
                type_name, type_start = self.parse_type()
                kind, param, param_start = self.next()
                if kind != "name":
                    self.fail(f"expected a parameter name after {type_name}", param_start)
                if param in seen:
                    self.fail(f"parameter '{param}' is declared twice", param_start)
                if keyword.iskeyword(param) or param.startswith("_"):
                    self.fail(f"parameter name '{param}' is a Python keyword or starts with '_'", param_start)
                seen.add(param)
                default = REQUIRED
                if self.at("="):
                    self.next()
                    default, default_start = self.parse_default()
                if type_name.startswith("Tensor"):
                    if type_name not in ("Tensor", "Tensor?", "Tensor[]"):
                        self.fail(f"unknown tensor type {type_name!r} (Tensor, Tensor? or Tensor[])", type_start)
                    if keyword_only:
                        self.fail("tensor inputs must come before '*'", type_start)
                    if attrs:
                        self.fail("tensor inputs must come before attributes", type_start)
                    if default is not REQUIRED and not (type_name == "Tensor?" and default is None):
                        self.fail("only Tensor? inputs may have a default, and it must be None", type_start)
                    inputs.append(InputDef(param, optional=type_name == "Tensor?", variadic=type_name == "Tensor[]"))
                else:
                    if type_name not in ATTR_TYPES or type_name == "any":
                        self.fail(f"unknown type {type_name!r}; expected Tensor, Tensor?, Tensor[] or one of "
                                  f"{', '.join(t for t in ATTR_TYPES if t != 'any')}", type_start)
                    attr = AttrDef(param, type_name, REQUIRED, positional=not keyword_only)
                    if default is not REQUIRED:
                        try:
                            default = check_attr(f"{namespace}::{name}" if namespace else name, attr, default)
                        except OpforgeError as error:
                            self.fail(f"bad default: {error}", default_start)
                        attr = AttrDef(param, type_name, default, positional=not keyword_only)
                    attrs.append(attr)
            if not self.at(")"):
                self.expect(",")
        self.expect(")")
        if self.at_end():
            self.fail("expected '->' and the outputs", len(self.text))
        self.expect("->")
        outputs = self.parse_outputs()
        if not self.at_end():
            kind, token, start = self.next()
            self.fail(f"unexpected {token!r} after the outputs", start)
        return ParsedSchema(namespace, name, inputs, attrs, outputs)

    def parse_outputs(self) -> list[str]:
        grouped = self.at("(")
        if grouped:
            self.next()
        outputs: list[str] = []
        while True:
            type_name, start = self.parse_type()
            if type_name != "Tensor":
                self.fail(f"outputs are Tensor, found {type_name!r}", start)
            name = f"out{len(outputs)}"
            if self.peek()[0] == "name":
                name = self.next()[1]
            if name in outputs:
                self.fail(f"output '{name}' is declared twice")
            outputs.append(name)
            if not (grouped and self.at(",")):
                break
            self.next()
        if grouped:
            self.expect(")")
        if len(outputs) == 1 and outputs[0] == "out0":
            outputs = ["out"]
        return outputs


def parse_schema(text: str) -> ParsedSchema:
    if not isinstance(text, str) or not text.strip():
        raise SchemaError("a schema is a non-empty string such as 'ns::name(Tensor x, *, float a=1.0) -> Tensor y'")
    return _Parser(text).parse()
