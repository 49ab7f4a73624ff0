"""``mindspore.context``: ``set_context`` / ``get_context`` and the execution modes.

opforge runs every op eagerly and infers shapes per call, so GRAPH_MODE and
PYNATIVE_MODE compute the same results; the mode is kept for programs that
read it back.  ``device_target`` is where a Custom op made afterwards runs
when its registration names no target (a ``.cu`` source is GPU code
whatever the context says); a registration's ``target`` always decides.
"""
from __future__ import annotations

from typing import Any

from ...errors import SchemaError
from ...frontends import mindspore as _frontend

GRAPH_MODE = 0
PYNATIVE_MODE = 1

_TARGETS = ("CPU", "GPU")
# The frontend's CONTEXT itself: a Custom op made later reads device_target there.
_settings = _frontend.CONTEXT
_settings.update(device_target="CPU", device_id=0, mode=PYNATIVE_MODE)


def _check(key: str, value: object) -> None:
    if key == "device_target" and value not in _TARGETS:
        raise SchemaError(f"set_context: device_target must be one of {', '.join(_TARGETS)} on opforge, got {value!r}")
    if key == "mode" and value not in (GRAPH_MODE, PYNATIVE_MODE):
        raise SchemaError(f"set_context: mode must be GRAPH_MODE ({GRAPH_MODE}) or PYNATIVE_MODE ({PYNATIVE_MODE}), "
                          f"got {value!r}")
    if key == "device_id" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise SchemaError(f"set_context: device_id must be a non-negative int, got {value!r}")


def set_context(**kwargs: Any) -> None:
    """Keep MindSpore's context options; other options (save_graphs, jit_config, ...) are accepted and stored."""
    for key, value in kwargs.items():
        _check(key, value)
    _settings.update(kwargs)


def get_context(attr_key: str) -> Any:
    if attr_key not in _settings:
        raise SchemaError(f"get_context: no context option {attr_key!r} (set ones: {', '.join(sorted(_settings))})")
    return _settings[attr_key]


def set_device(device_target: str, device_id: int | None = None) -> None:
    """MindSpore 2.5's ``set_device``: ``set_context(device_target=..., device_id=...)``."""
    set_context(device_target=device_target, **({} if device_id is None else {"device_id": device_id}))


__all__ = ["GRAPH_MODE", "PYNATIVE_MODE", "set_context", "get_context", "set_device"]
