"""Progress of long loops (an ONNX model's conversion, node by node), on the
``opforge.progress`` logger: the same stderr handler as build lines
(``runtime.build``), silenced by ``OPFORGE_QUIET=1`` or the ``opforge``
logger's level.  A loop that ends within ``after`` seconds says nothing; a
longer one reports ``what: done/total (elapsed)`` at most every ``every``
seconds, and once more when it ends."""
from __future__ import annotations

import logging
import time

from . import build as _build  # noqa: F401 - installs opforge's stderr handler

log = logging.getLogger("opforge.progress")


class Progress:
    def __init__(self, what: str, total: int, *, after: float = 1.0, every: float = 2.0) -> None:
        self.what, self.total, self.after, self.every = what, total, after, every
        self.started = time.monotonic()
        self.last: float | None = None  # when the last line was printed

    def step(self, done: int) -> None:
        now = time.monotonic()
        if now - self.started < self.after or (self.last is not None and now - self.last < self.every):
            return
        self.last = now
        log.info("%s: %d/%d (%.1f s)", self.what, done, self.total, now - self.started)

    def close(self) -> None:
        """The final line, for a loop that printed any."""
        if self.last is not None:
            log.info("%s: %d/%d done in %.1f s", self.what, self.total, self.total, time.monotonic() - self.started)
