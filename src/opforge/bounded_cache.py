"""``BoundedCache``: the one cache type behind every per-op, per-kernel and
per-graph cache (launchers, resolved signatures, Init states, graph plans).

Lookups take no lock (a dict read is atomic, with or without the GIL);
inserts, evictions and clears take one, so concurrent callers never see a
half-evicted cache.  Under free threading the same holds: CPython's dicts
lock themselves per operation, and this class serialises the compound ones.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_MISSING: Any = object()


class BoundedCache(Generic[K, V]):
    """At most ``capacity`` entries; the oldest goes first (or the least
    recently used one, with ``lru=True``).  ``on_evict(key, value)`` runs for
    entries pushed out by the bound (not for ``clear``)."""

    __slots__ = ("capacity", "lru", "on_evict", "_entries", "_lock")

    def __init__(self, capacity: int, *, lru: bool = False, on_evict: Callable[[K, V], object] | None = None) -> None:
        self.capacity = capacity
        self.lru = lru
        self.on_evict = on_evict
        self._entries: OrderedDict[K, V] = OrderedDict()
        # Reentrant: making an entry may consult the same cache (nested calls).
        self._lock = threading.RLock()

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: T) -> V | T: ...

    def get(self, key: K, default: object = None) -> object:
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            return default
        if self.lru:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
        return value

    def get_or_create(self, key: K, create: Callable[[], V]) -> V:
        """The entry for ``key``, made by ``create()`` once if missing (other
        threads asking for the same key meanwhile wait and get the same value)."""
        found = self.get(key, _MISSING)
        if found is not _MISSING:
            return cast(V, found)
        with self._lock:
            value = self._entries.get(key, _MISSING)
            if value is _MISSING:
                value = create()
                self._put_locked(key, value)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._put_locked(key, value)

    def _put_locked(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        evicted = []
        while len(self._entries) > self.capacity:
            evicted.append(self._entries.popitem(last=False))
        if self.on_evict is not None:
            for old_key, old_value in evicted:
                self.on_evict(old_key, old_value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def values(self) -> list[V]:
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
