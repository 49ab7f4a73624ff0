"""Memory checks around native kernel calls.

Every output and workspace a native CPU kernel writes is followed by a
canary, checked after each call: a kernel that wrote past the end of a buffer
raises ``KernelError`` naming the buffer.  Checked mode
(``OPFORGE_CHECK=1`` or ``opforge.set_checks(True)``) goes further and is
slower: each output and workspace gets its own mapping that ends against
guard pages and starts filled with a poison byte, so an out-of-bounds access
is stopped where it happens and reported instead of crashing the process.
Graphs run node by node in checked mode.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .. import _native
from ..errors import AllocationError, KernelError, OpforgeError

if TYPE_CHECKING:
    from ..operator import Op

#: The error kinds the native side reports for memory problems (see csrc/native.cc).
MEMORY_KINDS = frozenset({"overrun", "guard", "alloc"})


def set_checks(enabled: bool = True) -> None:
    """Turn checked mode (guard pages and poison for every native kernel call) on or off."""
    if enabled not in (True, False):  # (1 and 0 too) a string or None here is a mistake, not a switch
        raise OpforgeError(f"set_checks takes True or False, got {enabled!r}")
    _native.set_checked(bool(enabled))


def checks_enabled() -> bool:
    """Whether checked mode is on (``set_checks``, ``OPFORGE_CHECK=1``)."""
    return _native.checked()


def _buffer_name(op: Op, index: int) -> str:
    """Buffers are counted outputs first, then workspaces."""
    if 0 <= index < len(op.outputs):
        return f"output '{op.outputs[index]}'"
    return f"workspace {index - len(op.outputs)}"


def memory_error(op: Op, function: str, where: str, error: tuple[str, str]) -> KernelError:
    """The typed error for a memory problem the native side reported for one call."""
    kind, detail = error
    fields = detail.split()
    index = int(fields[0])
    about: dict[str, Any] = dict(op=op.name, function=function, code=0)
    if kind == "alloc":
        sizes = ["more than fit in size_t" if int(s) == 2**64 - 1 else int(s) for s in fields[1:]]
        if index < 0:
            what = f"workspace of {sizes} bytes (as set by {function}Init)"
        elif index >= len(op.outputs):
            what = f"{_buffer_name(op, index)} of {sizes[0]} bytes (as set by {function}Init)"
        else:
            what = f"{_buffer_name(op, index)} of {sizes[0]} bytes"
        return AllocationError(f"op '{op.name}': kernel function '{function}'{where}: cannot allocate its {what}",
                               **about)
    buffer = _buffer_name(op, index)
    if kind == "overrun":
        return KernelError(f"op '{op.name}': kernel function '{function}'{where} wrote past the end of {buffer}; "
                           "the process may be corrupt (compare what the kernel writes with the shape the op's "
                           "inference gives; OPFORGE_CHECK=1 stops the kernel at its first byte past the end)",
                           **about)
    verb = "wrote past" if fields[1:] == ["write"] else "read past"
    return KernelError(f"op '{op.name}': kernel function '{function}'{where} {verb} the end of {buffer} (stopped "
                       "at its guard page by checked mode)", **about)


set_checks(os.environ.get("OPFORGE_CHECK", "").strip().lower() not in ("", "0", "false", "no", "off"))
