"""Python's cyclic garbage collector, paused while answers are released.

A release builds millions of short-lived tuples and numbers, none of them in cycles; the collector's
passes over them took about a third of a 10,000-group release (bench/noise.py --release-only). Memory
is still freed by reference counting. Nothing here knows SQL, noise or data.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_gc_lock = threading.Lock()
_gc_pauses = 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The collector paused for the block; nested and concurrent pauses (worker threads) enable it
    again when the last one ends."""
    global _gc_pauses
    with _gc_lock:
        _gc_pauses += 1
        if _gc_pauses == 1:
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0:
                gc.enable()
