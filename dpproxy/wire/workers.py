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

For the operators (wire/server.Operations): with metrics on, the supervisor makes a private directory
for prometheus_client's multiprocess files (PROMETHEUS_MULTIPROC_DIR, set before any worker starts),
serves /metrics summing every worker's files (counters of a worker that died are kept; its gauges are
dropped, `mark_process_dead`) plus the budgets it reads from the ledger itself. On SIGHUP the
supervisor re-reads the policy file and checks it as `serve` does at start (an engine of its own on
the backend, closed after); only a policy that passes is sent, as its text, to every worker over a
control pipe, and each swaps it in (Server.reload) and answers — so either every worker reloads or,
when the check fails, none does. A worker started later (a restart) opens the accepted policy.

It never reads SQL, a protocol message beyond a forwarded cancel, or the data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from dpproxy.engine import Engine
from dpproxy.errors import failure
from dpproxy.policy import Policy
from dpproxy.policy.loading import parse_policy
from dpproxy.wire import codec
from dpproxy.wire.reload import Reloads, policy_text, problems_of
from dpproxy.wire.server import Operations, Server, ServerConfig

log = logging.getLogger("dpproxy.wire")

# Opens a worker's engine: with no argument on the policy file it was made for, with `policy=` on a
# policy already read (a reload; a restart after one).
EngineFactory = Callable[..., Engine]

_CANCEL = struct.Struct("!ii")  # process id, secret key: what a forwarded CancelRequest carries
_START_TIMEOUT = 300.0  # seconds a worker may take to open its engine and start serving
_STOP_MARGIN = 30.0  # seconds past the shutdown grace before a worker that has not exited is killed
_MAX_START_FAILURES = 5  # consecutive failed restarts of one worker before the supervisor gives up
_ORPHAN_CHECK = 1.0  # seconds between a worker's checks that its supervisor still runs
_RELOAD_TIMEOUT = 120.0  # seconds each worker may take to swap in a checked policy
_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"


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
    control: multiprocessing.connection.Connection  # reloads from the supervisor, and the answers
    operations: Operations = field(default_factory=Operations)
    policy: tuple[str, str] | None = None  # (text, source) of a reloaded policy to open instead


def _worker_main(args: _WorkerArgs) -> None:
    from dpproxy.logs import configure

    # Ctrl-C in a terminal reaches the whole process group: the supervisor turns it into SIGTERM;
    # a hangup reaches the supervisor, which sends a checked policy to every worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    configure(args.operations.log_format, args.operations.log_level, worker=args.index)
    try:
        if args.policy is not None:
            engine = args.engine_factory(policy=parse_policy(*args.policy))
        else:
            engine = args.engine_factory()
    except Exception as error:  # reported to the supervisor, which exits non-zero
        _report(args, f"could not open the engine: {'; '.join(problems_of(error))}")
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

    metrics = None
    if args.operations.metrics_port is not None:
        from dpproxy.metrics import Metrics

        metrics = Metrics()  # PROMETHEUS_MULTIPROC_DIR is set: its values go to this worker's files
    server = Server(
        engine,
        args.config,
        listen=args.listen,
        slot=(args.index, args.count),
        forward_cancel=forward,
        metrics=metrics,
    )
    reloading: set[asyncio.Task[None]] = set()

    async def reload(text: str, source: str) -> None:
        try:
            await server.reload(parse_policy(text, source))
        except Exception as error:  # answered, whatever it is: the supervisor waits for it
            answer: tuple[Any, ...] = ("refused", problems_of(error))
        else:
            answer = ("ok",)
        with contextlib.suppress(OSError, ValueError):
            args.control.send(answer)

    def control() -> None:
        try:
            if not args.control.poll():
                return
            message = args.control.recv()
        except (EOFError, OSError):
            loop.remove_reader(args.control.fileno())
            return
        if isinstance(message, tuple) and len(message) == 3 and message[0] == "reload":
            task = asyncio.ensure_future(reload(message[1], message[2]))
            reloading.add(task)
            task.add_done_callback(reloading.discard)

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
    loop.add_reader(args.control.fileno(), control)
    loop.call_later(_ORPHAN_CHECK, orphaned)
    _report(args, "ready")
    await stop.wait()
    loop.remove_reader(args.cancel_in.fileno())
    with contextlib.suppress(Exception):
        loop.remove_reader(args.control.fileno())
    await server.shutdown()  # _worker_main closes the backend and ledger every policy's engine shared


# ---------------------------------------------------------------------------------------------
# The supervisor
# ---------------------------------------------------------------------------------------------


@dataclass
class _Slot:
    index: int
    process: BaseProcess | None = None
    report: multiprocessing.connection.Connection | None = None  # open until the worker reported
    control: multiprocessing.connection.Connection | None = None  # the supervisor's end
    started: float = 0.0
    failures: int = 0  # consecutive starts that never reached "ready"
    ready: bool = False


class WorkersFailed(Exception):
    """Workers could not start (or kept dying before they served); the message says why."""


def run_workers(
    engine_factory: EngineFactory,
    config: ServerConfig,
    processes: int,
    *,
    ready: Callable[[int, int | None], None] | None = None,
    operations: Operations | None = None,
    budget: Engine | None = None,
    on_reload: Callable[[Policy], None] | None = None,
) -> int:
    """Serve with `processes` worker processes until SIGTERM or SIGINT; returns the exit status.

    Binds the listening sockets here (an OSError if it cannot), calls `ready(port, metrics port or
    None)` once every worker serves, and raises WorkersFailed if they cannot start. A worker that
    dies afterwards is restarted; on SIGTERM/SIGINT every worker shuts down gracefully
    (config.shutdown_grace). `operations`: metrics (budgets read through `budget`, an engine without
    a backend on the workers' ledger, closed here at the end) and the policy file SIGHUP re-reads
    (`on_reload(policy)` is called in this process with each policy every worker accepted)."""
    if processes < 1:
        raise ValueError("at least one worker process")
    ops = operations or Operations()
    listen = bind_listeners(config.host, config.port)
    port = int(listen[0].getsockname()[1])
    channels = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(processes)]
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    stopping = [False]
    hangups = [0]

    def on_signal(signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            hangups[0] += 1
        else:
            stopping[0] = True
        with contextlib.suppress(OSError):
            os.write(wake_write, b"x")

    handled = [signal.SIGTERM, signal.SIGINT]
    if ops.policy_file is not None:
        handled.append(signal.SIGHUP)
    previous = {signum: signal.signal(signum, on_signal) for signum in handled}
    context = multiprocessing.get_context("spawn")
    slots = [_Slot(index) for index in range(processes)]
    accepted: list[tuple[str, str] | None] = [None]  # the policy workers open (None: the file's)
    view = [budget]
    metrics_dir: str | None = None
    endpoint = None
    reloads: Reloads | None = None

    def start(slot: _Slot) -> None:
        receive, send = context.Pipe(duplex=False)
        mine, theirs = context.Pipe(duplex=True)
        args = _WorkerArgs(
            slot.index,
            processes,
            engine_factory,
            config,
            listen,
            channels[slot.index][1],
            [pair[0] for pair in channels],
            send,
            theirs,
            ops,
            accepted[0],
        )
        process = context.Process(target=_worker_main, args=(args,), name=f"dpproxy-worker-{slot.index}")
        process.start()
        send.close()
        theirs.close()
        if slot.control is not None:
            slot.control.close()
        slot.process, slot.report, slot.started, slot.ready = process, receive, time.monotonic(), False
        slot.control = mine

    def reload() -> None:
        assert reloads is not None
        try:
            text, policy = policy_text(reloads.policy_file)
            # The checks `serve` makes at start, on a backend and ledger of its own.
            engine_factory(policy=policy).close()
        except Exception as error:  # any problem refuses it: the supervisor and its workers go on
            reloads.refused(problems_of(error))
            return
        source = str(reloads.policy_file)
        failures = _send_reload(slots, text, source)
        accepted[0] = (text, source)  # workers that did reload serve it; restarts open it too
        if failures:
            reloads.refused(failures)
            return
        if view[0] is not None:
            view[0] = view[0].with_policy(policy)
            view[0].make_current()
        reloads.accepted(policy)
        if on_reload is not None:
            try:
                on_reload(policy)
            except Exception as error:
                log.error("could not hand the reloaded policy on: %s", failure(error))

    try:
        if ops.metrics_port is not None:
            from dpproxy.metrics import BudgetCollector, multiprocess_registry, start_endpoint

            metrics_dir = tempfile.mkdtemp(prefix="dpproxy-metrics-")
            os.environ[_METRICS_DIR] = metrics_dir  # inherited by every worker started from now on
            registry = multiprocess_registry(metrics_dir)
            registry.register(BudgetCollector(lambda: view[0]))
            endpoint = start_endpoint(registry, ops.metrics_host, ops.metrics_port)
        if ops.policy_file is not None:
            from dpproxy.policy import load_policy

            reloads = Reloads(
                ops.policy_file,
                ops.status_file,
                budget.policy if budget is not None else load_policy(ops.policy_file),
                ops.ledger,
            )
        for slot in slots:
            start(slot)
        _await_ready(slots, stopping, wake_read)
        if stopping[0]:
            return _stop(slots, config, metrics_dir)
        if ready is not None:
            ready(port, endpoint.port if endpoint is not None else None)
        while not stopping[0]:
            waitables: list[Any] = [wake_read]
            for slot in slots:
                assert slot.process is not None
                waitables.append(slot.process.sentinel)
                if slot.report is not None:
                    waitables.append(slot.report)
            if not hangups[0]:
                multiprocessing.connection.wait(waitables)
            with contextlib.suppress(OSError):
                os.read(wake_read, 64)
            if stopping[0]:
                break
            if hangups[0] and reloads is not None:
                hangups[0] = 0
                reload()
            for slot in slots:
                _read_report(slot)
                assert slot.process is not None
                if slot.process.is_alive() or slot.process.exitcode is None:
                    continue
                _forget(slot, metrics_dir)
                if not slot.ready:
                    slot.failures += 1
                    if slot.failures >= _MAX_START_FAILURES:
                        _stop(slots, config, metrics_dir)
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
        return _stop(slots, config, metrics_dir)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for sock in listen:
            sock.close()
        for pair in channels:
            for sock in pair:
                sock.close()
        for slot in slots:
            if slot.control is not None:
                slot.control.close()
        os.close(wake_read)
        os.close(wake_write)
        if endpoint is not None:
            endpoint.close()
        if metrics_dir is not None:
            os.environ.pop(_METRICS_DIR, None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if reloads is not None:
            reloads.remove()
        if view[0] is not None:
            view[0].close()


def _send_reload(slots: Sequence[_Slot], text: str, source: str) -> list[str]:
    """Send a checked policy to every worker and wait for their answers: the problems of those that
    could not swap it in (none, unless the database changed between the check and the swap)."""
    sent: list[_Slot] = []
    failures: list[str] = []
    for slot in slots:
        if slot.control is None or slot.process is None or not slot.process.is_alive():
            continue  # a worker being restarted opens the accepted policy
        try:
            slot.control.send(("reload", text, source))
            sent.append(slot)
        except OSError as error:
            failures.append(f"worker {slot.index}: could not be reached ({error.strerror or error})")
    deadline = time.monotonic() + _RELOAD_TIMEOUT
    for slot in sent:
        assert slot.control is not None
        try:
            if not slot.control.poll(max(0.0, deadline - time.monotonic())):
                failures.append(f"worker {slot.index}: no answer within {_RELOAD_TIMEOUT:g} s")
                continue
            answer = slot.control.recv()
        except (EOFError, OSError):
            failures.append(f"worker {slot.index}: exited while reloading")
            continue
        if answer[0] != "ok":
            failures.extend(f"worker {slot.index}: {problem}" for problem in answer[1])
    return failures


def _forget(slot: _Slot, metrics_dir: str | None) -> None:
    """A worker exited: its live gauges (sessions, backend connections) no longer count."""
    if metrics_dir is not None and slot.process is not None and slot.process.pid is not None:
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(slot.process.pid, metrics_dir)


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
        with contextlib.suppress(OSError):
            os.read(wake, 64)  # a hangup now is handled once the workers serve
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


def _stop(slots: Sequence[_Slot], config: ServerConfig | None, metrics_dir: str | None = None) -> int:
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
        _forget(slot, metrics_dir)
    return status
