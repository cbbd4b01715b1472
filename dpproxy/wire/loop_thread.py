"""A server on an asyncio event loop of its own thread, for callers that are not async: the wire
server's BackgroundServer and the console's BackgroundConsole (tests, `serve --console-port`,
embedding).

This module owns that thread: its loop, its end, and the context manager that starts and stops
it. What runs on the loop, and how it starts and stops, is each server's.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Self


class LoopThread(ABC):
    """An event loop on a daemon thread; `with` starts the server on it and stops it."""

    def __init__(self, name: str, target: Callable[[], None] | None = None) -> None:
        """The thread, named `name`, runs `target` (by default the loop, until it is stopped)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=target or self._loop.run_forever, name=name, daemon=True)

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    def _end_loop(self, timeout: float) -> None:
        """Stop the loop (from any thread) and wait up to `timeout` seconds for its thread to end."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
