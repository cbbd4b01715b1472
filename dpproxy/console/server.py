"""Serving the console: on its own thread and event loop beside the wire server, or in the foreground.

This module owns starting and stopping the console's HTTP listener: `BackgroundConsole` for `serve
--console-port` and `demo` (in the serving process, or the supervisor when there are several
workers) and for tests, `run_console` for `dpproxy console`. Bound to 127.0.0.1 unless told otherwise.

It must never open the backing database: the console reads the policy and the ledger it is given.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Self

from aiohttp import web

from dpproxy.console.app import Console
from dpproxy.wire.loop_thread import LoopThread

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6433


class BackgroundConsole(LoopThread):
    """The console served on a thread of its own until `stop`.

    >>> with BackgroundConsole(Console(policy, ledger), port=0) as console:   # doctest: +SKIP
    ...     urllib.request.urlopen(f"{console.url}login")
    """

    def __init__(self, console: Console, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        super().__init__("dpproxy-console")
        self.console = console
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://[{host}]:{self.port}/" if ":" in host else f"http://{host}:{self.port}/"

    def start(self) -> Self:
        """Bind and serve; raises OSError when the address cannot be bound."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            self.port = future.result(timeout=30)
        except BaseException:
            self._end_loop(timeout=5)
            raise
        return self

    async def _start(self) -> int:
        self._runner = web.AppRunner(self.console.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        return _bound_port(self._runner, self.port)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._end_loop(timeout=10)
        self._loop.close()


def run_console(
    console: Console, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, ready: Callable[[int], None]
) -> None:
    """Serve in the foreground until SIGTERM or SIGINT; raises OSError when it cannot bind."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        runner = web.AppRunner(console.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            ready(_bound_port(runner, port))
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return asked
