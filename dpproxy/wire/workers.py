"""Multi-process serving: a supervisor and N worker processes accepting on the same listening sockets.

This module owns the processes: the supervisor (the process `dpproxy serve` started) binds the
listening sockets, spawns the workers, waits until each reports that it serves, restarts a worker
that dies, forwards SIGTERM/SIGINT to them as a graceful shutdown, and exits non-zero when they
cannot start. Each worker is a whole server (wire/server.py) with its own event loop, engine,
backend connections and shadow catalog, built in the worker by a picklable `engine_factory` (no
connection or thread crosses a process boundary). Workers share only:

- the listening sockets (inherited; the kernel hands each new connection to one accepting worker);
- the budget ledger, through the store's own cross-process atomicity (a SQLite file under
  BEGIN IMMEDIATE, or PostgreSQL under an advisory lock): an in-memory ledger cannot be shared, and
  the CLI refuses it with more than one worker;
- cancel channels: one Unix datagram socket pair per worker. A session's process id names its
  worker (≡ index mod N, see Server), so a CancelRequest that lands on another worker is forwarded
  as 8 bytes (process id, secret key) to the owner, which checks the key as for its own requests.

It never reads SQL, a protocol message beyond a forwarded cancel, or the data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from dpproxy.engine import Engine
from dpproxy.wire import codec
from dpproxy.wire.server import Server, ServerConfig

log = logging.getLogger("dpproxy.wire")

EngineFactory = Callable[[], Engine]

_CANCEL = struct.Struct("!ii")  # process id, secret key: what a forwarded CancelRequest carries
_START_TIMEOUT = 300.0  # seconds a worker may take to open its engine and start serving
_STOP_MARGIN = 30.0  # seconds past the shutdown grace before a worker that has not exited is killed
_MAX_START_FAILURES = 5  # consecutive failed restarts of one worker before the supervisor gives up
_ORPHAN_CHECK = 1.0  # seconds between a worker's checks that its supervisor still runs


def default_workers() -> int:
    """The number of cores this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def bind_listeners(host: str, port: int, backlog: int = 512) -> list[socket.socket]:
    """Listening sockets for every address `host` resolves to, all on one port (port 0: the first
    socket's free port), bound as asyncio would: SO_REUSEADDR, IPv6 sockets IPv6-only."""
    infos = socket.getaddrinfo(
        host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    seen: set[tuple[Any, ...]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"{host} resolves to no address")
    return sockets


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------


@dataclass
class _WorkerArgs:
    index: int
    count: int
    engine_factory: EngineFactory
    config: ServerConfig
    listen: list[socket.socket]
    cancel_in: socket.socket  # this worker's end: forwarded cancel requests arrive here
    cancel_out: list[socket.socket]  # one per worker: where its forwarded requests are sent
    report: multiprocessing.connection.Connection  # "ready", or the reason it could not start


def _worker_main(args: _WorkerArgs) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the supervisor turns it into SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"dpproxy[worker {args.index}]: %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        engine = args.engine_factory()
    except Exception as error:  # reported to the supervisor, which exits non-zero
        _report(args, f"could not open the engine: {error}")
        sys.exit(1)
    try:
        asyncio.run(_worker_serve(args, engine))
    except OSError as error:
        _report(args, f"could not serve: {error.strerror or error}")
        sys.exit(1)
    finally:
        engine.close()


def _report(args: _WorkerArgs, message: str) -> None:
    with contextlib.suppress(OSError):
        args.report.send(message)


async def _worker_serve(args: _WorkerArgs, engine: Engine) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def forward(owner: int, request: codec.CancelRequest) -> None:
        # Best effort, like PostgreSQL's cancel: a full channel drops the request.
        with contextlib.suppress(OSError):
            args.cancel_out[owner].send(_CANCEL.pack(request.process_id, request.secret_key))

    server = Server(
        engine, args.config, listen=args.listen, slot=(args.index, args.count), forward_cancel=forward
    )

    def forwarded() -> None:
        while True:
            try:
                data = args.cancel_in.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                loop.remove_reader(args.cancel_in.fileno())
                return
            if len(data) == _CANCEL.size:
                server.cancel_request(codec.CancelRequest(*_CANCEL.unpack(data)))

    supervisor = os.getppid()

    def orphaned() -> None:
        # The supervisor was killed (SIGKILL: it could not stop us): stop as on SIGTERM.
        if os.getppid() != supervisor:
            log.warning("the supervising process is gone: shutting down")
            stop.set()
        else:
            loop.call_later(_ORPHAN_CHECK, orphaned)

    await server.start()
    args.cancel_in.setblocking(False)
    loop.add_reader(args.cancel_in.fileno(), forwarded)
    loop.call_later(_ORPHAN_CHECK, orphaned)
    _report(args, "ready")
    await stop.wait()
    loop.remove_reader(args.cancel_in.fileno())
    await server.shutdown()


# ---------------------------------------------------------------------------------------------
# The supervisor
# ---------------------------------------------------------------------------------------------


@dataclass
class _Slot:
    index: int
    process: BaseProcess | None = None
    report: multiprocessing.connection.Connection | None = None  # open until the worker reported
    started: float = 0.0
    failures: int = 0  # consecutive starts that never reached "ready"
    ready: bool = False
    history: list[float] = field(default_factory=list)


class WorkersFailed(Exception):
    """Workers could not start (or kept dying before they served); the message says why."""


def run_workers(
    engine_factory: EngineFactory,
    config: ServerConfig,
    processes: int,
    *,
    ready: Callable[[int], None] | None = None,
) -> int:
    """Serve with `processes` worker processes until SIGTERM or SIGINT; returns the exit status.

    Binds the listening sockets here (an OSError if it cannot), calls `ready(port)` once every
    worker serves, and raises WorkersFailed if they cannot start. A worker that dies afterwards is
    restarted; on SIGTERM/SIGINT every worker shuts down gracefully (config.shutdown_grace)."""
    if processes < 1:
        raise ValueError("at least one worker process")
    listen = bind_listeners(config.host, config.port)
    port = int(listen[0].getsockname()[1])
    channels = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(processes)]
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    stopping = [False]

    def on_signal(signum: int, frame: object) -> None:
        stopping[0] = True
        with contextlib.suppress(OSError):
            os.write(wake_write, b"x")

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    context = multiprocessing.get_context("spawn")
    slots = [_Slot(index) for index in range(processes)]

    def start(slot: _Slot) -> None:
        receive, send = context.Pipe(duplex=False)
        args = _WorkerArgs(
            slot.index,
            processes,
            engine_factory,
            config,
            listen,
            channels[slot.index][1],
            [pair[0] for pair in channels],
            send,
        )
        process = context.Process(target=_worker_main, args=(args,), name=f"dpproxy-worker-{slot.index}")
        process.start()
        send.close()
        slot.process, slot.report, slot.started, slot.ready = process, receive, time.monotonic(), False

    try:
        for slot in slots:
            start(slot)
        _await_ready(slots, stopping, wake_read)
        if stopping[0]:
            return _stop(slots, config)
        if ready is not None:
            ready(port)
        while not stopping[0]:
            waitables: list[Any] = [wake_read]
            for slot in slots:
                assert slot.process is not None
                waitables.append(slot.process.sentinel)
                if slot.report is not None:
                    waitables.append(slot.report)
            multiprocessing.connection.wait(waitables)
            if stopping[0]:
                break
            for slot in slots:
                _read_report(slot)
                assert slot.process is not None
                if slot.process.is_alive() or slot.process.exitcode is None:
                    continue
                if not slot.ready:
                    slot.failures += 1
                    if slot.failures >= _MAX_START_FAILURES:
                        _stop(slots, config)
                        raise WorkersFailed(
                            f"worker {slot.index} failed to start {slot.failures} times in a row"
                        )
                log.warning(
                    "worker %d (pid %s) exited with status %s; starting a new one",
                    slot.index,
                    slot.process.pid,
                    slot.process.exitcode,
                )
                if time.monotonic() - slot.started < 5.0:
                    time.sleep(1.0)  # a worker that dies at once: do not spin
                start(slot)
        return _stop(slots, config)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for sock in listen:
            sock.close()
        for pair in channels:
            for sock in pair:
                sock.close()
        os.close(wake_read)
        os.close(wake_write)


def _read_report(slot: _Slot) -> str | None:
    """The worker's report if one arrived ("ready" marks the slot ready); None otherwise."""
    if slot.report is None:
        return None
    try:
        if not slot.report.poll():
            return None
        message = str(slot.report.recv())
    except (EOFError, OSError):
        slot.report.close()
        slot.report = None
        return None
    if message == "ready":
        slot.ready, slot.failures = True, 0
        slot.report.close()
        slot.report = None
    return message


def _await_ready(slots: Sequence[_Slot], stopping: list[bool], wake: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while not stopping[0] and not all(slot.ready for slot in slots):
        left = deadline - time.monotonic()
        if left <= 0:
            _stop(slots, None)
            raise WorkersFailed(f"workers did not start within {_START_TIMEOUT:g} s")
        waitables: list[Any] = [wake]
        for slot in slots:
            assert slot.process is not None
            if not slot.ready:
                waitables.append(slot.process.sentinel)
                if slot.report is not None:
                    waitables.append(slot.report)
        multiprocessing.connection.wait(waitables, timeout=left)
        for slot in slots:
            if slot.ready:
                continue
            message = _read_report(slot)
            assert slot.process is not None
            if message is not None and message != "ready":
                _stop(slots, None)
                raise WorkersFailed(f"worker {slot.index}: {message}")
            if message is None and slot.report is None and not slot.ready:
                slot.process.join(timeout=5.0)
                _stop(slots, None)
                raise WorkersFailed(
                    f"worker {slot.index} exited with status {slot.process.exitcode} before serving"
                )


def _stop(slots: Sequence[_Slot], config: ServerConfig | None) -> int:
    """SIGTERM every live worker, wait for them (the shutdown grace, then a margin), kill the rest.
    0 when every worker exited cleanly."""
    grace = config.shutdown_grace if config is not None else 0.0
    for slot in slots:
        if slot.process is not None and slot.process.is_alive():
            with contextlib.suppress(OSError):
                slot.process.terminate()
    deadline = time.monotonic() + grace + _STOP_MARGIN
    status = 0
    for slot in slots:
        if slot.process is None:
            continue
        slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if slot.process.is_alive():
            log.warning("worker %d did not stop in time: killed", slot.index)
            slot.process.kill()
            slot.process.join(timeout=5.0)
            status = 1
        elif slot.process.exitcode not in (0, -signal.SIGTERM):
            status = 1
    return status
