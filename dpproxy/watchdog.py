"""One process-wide timer thread for statement time limits.

This module owns deadlines: `after(seconds, action)` runs `action` once on the watchdog thread when
the time is up, unless the returned Deadline is cancelled first. It replaces a `threading.Timer` per
statement, which starts (and tears down) a thread for every query — measurable on the catalog's
`SELECT 1` path. Actions must be short and must not raise (an exception is logged and dropped): they
interrupt a cursor or set a flag. It knows nothing of SQL, sessions or data.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from dpproxy.errors import failure

log = logging.getLogger("dpproxy.watchdog")


class Deadline:
    """A scheduled action; cancel() before it fires and it never runs."""

    __slots__ = ("_owner", "action", "cancelled", "due")

    def __init__(self, owner: _Watchdog, due: float, action: Callable[[], None]) -> None:
        self._owner = owner
        self.due = due
        self.action = action
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._owner.cancelled()


class _Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cancelled = 0  # cancelled entries still in the heap

    def cancelled(self) -> None:
        """Most deadlines are cancelled long before they are due (the statement ended): drop them
        in bulk once they are most of the heap, so it holds about as many entries as live queries."""
        with self._wake:
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def after(self, seconds: float, action: Callable[[], None]) -> Deadline:
        deadline = Deadline(self, time.monotonic() + seconds, action)
        with self._wake:
            heapq.heappush(self._heap, (deadline.due, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="dpproxy-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is deadline:
                self._wake.notify()
        return deadline

    def _loop(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)  # cancelled ones leave as soon as they reach the top
                    self._cancelled -= 1
                if not self._heap:
                    self._wake.wait(60.0)
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                deadline = heapq.heappop(self._heap)[2]
            try:
                deadline.action()
            except Exception as error:  # an action that fails must not stop every other time limit
                log.error("a statement time-limit action failed: %s", failure(error))


_WATCHDOG = _Watchdog()


def after(seconds: float, action: Callable[[], None]) -> Deadline:
    """Run `action` on the watchdog thread in `seconds`, unless the Deadline is cancelled first."""
    return _WATCHDOG.after(seconds, action)
