"""Progress of long loops (an ONNX model's conversion, node by node; ``opforge
build`` of many kernel variants), on the ``opforge.progress`` logger: the same
stderr handler as build lines (``runtime.build``), silenced by
``OPFORGE_QUIET=1`` or the ``opforge`` logger's level.  A loop that ends
within ``after`` seconds says nothing.  A longer one shows a bar on a terminal
(``what [#####.....] done/total elapsed``, redrawn in place, lines logged
meanwhile printing above it), and elsewhere (a pipe, a CI log) a line
``what: done/total (elapsed)`` at most every ``every`` seconds; either way one
final line when it ends."""
from __future__ import annotations

import logging
import time

from . import build as _build

log = logging.getLogger("opforge.progress")

BAR_WIDTH = 30
REDRAW_SECONDS = 0.1  # a terminal's bar is drawn again at most this often


class Progress:
    def __init__(self, what: str, total: int, *, after: float = 1.0, every: float = 2.0) -> None:
        self.what, self.total, self.after, self.every = what, total, after, every
        self.started = time.monotonic()
        self.last: float | None = None  # when progress was last shown
        self.bar = False  # shown as a terminal's bar

    def step(self, done: int) -> None:
        now = time.monotonic()
        if now - self.started < self.after:
            return
        if self.bar or self.last is None:  # a terminal's bar, once one was drawn or if one can be
            if self.last is not None and now - self.last < REDRAW_SECONDS:
                return
            filled = BAR_WIDTH * done // max(self.total, 1)
            text = f"{self.what} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{self.total} " \
                   f"{now - self.started:.1f} s"
            if _build.show_status(text):
                self.bar, self.last = True, now
                return
        if self.last is not None and now - self.last < self.every:
            return
        self.last = now
        log.info("%s: %d/%d (%.1f s)", self.what, done, self.total, now - self.started)

    def close(self) -> None:
        """The final line, for a loop that showed any progress."""
        if self.bar:
            _build.show_status("")
        if self.last is not None:
            log.info("%s: %d/%d done in %.1f s", self.what, self.total, self.total, time.monotonic() - self.started)
