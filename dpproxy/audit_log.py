"""The audit writer: records of statements that charged nothing, written to the ledger in batches from
a thread of its own, and old records deleted.

A charged statement's record is written by the ledger itself, with its charge (dpproxy.budget); this
module writes the others and completes those (the wire stage, the final duration and status). The
record is dpproxy.audit's; this module sits above the ledger, which it is given.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from dpproxy.audit import StatementRecord
from dpproxy.budget import Ledger
from dpproxy.errors import failure

__all__ = ["AuditLog"]

log = logging.getLogger("dpproxy.audit")


class AuditLog:
    """Writes the records of statements that charged nothing (and the final state of those that
    did) to the ledger, in batches, from a thread of its own: the event loop never waits for it.
    Also deletes records older than the retention (`retention_days`, 0: keep them) when started
    and once a day.

    A record that was charged already has its row (written with the reservation); what is
    submitted for it afterwards only completes it (the wire stage, the final duration and status).
    """

    BATCH = 512
    LINGER = 0.05  # seconds a batch waits for more records
    PRUNE_EVERY = 86400.0

    def __init__(self, ledger: Ledger, *, retention_days: int = 0) -> None:
        self.ledger = ledger
        self.retention_days = retention_days
        self._queue: queue.SimpleQueue[StatementRecord | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._next_prune = 0.0

    def submit(self, record: StatementRecord) -> None:
        """Queue a finished record for writing. Cheap; never raises."""
        if self._closed:
            return
        if self._thread is None:
            self._start()
        self._queue.put(record)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every record submitted so far is written."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, then stop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(60)

    def prune(self) -> int:
        """Delete records older than the retention now; how many."""
        if self.retention_days <= 0:
            return 0
        return self.ledger.prune_audit(datetime.now(UTC) - timedelta(days=self.retention_days))

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="dpproxy-audit", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._maybe_prune()
            try:
                item = self._queue.get(timeout=60.0)
            except queue.Empty:
                continue
            batch: list[StatementRecord] = []
            waiters: list[threading.Event] = []
            stop = False
            # Gather for a moment: one transaction per LINGER seconds, not one per statement.
            deadline = time.monotonic() + self.LINGER
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    waiters.append(item)
                else:
                    batch.append(item)
                if len(batch) >= self.BATCH or stop or waiters:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if batch:
                self._write(batch)
            for waiter in waiters:
                waiter.set()
            if stop:
                return

    def _write(self, batch: Sequence[StatementRecord]) -> None:
        try:
            self.ledger.audit_write(batch)
        except Exception as error:
            # The records are lost, not the statements' answers; the operator's log says so (the
            # error's type and place: its text could quote a statement's parameters).
            log.error("could not write %d audit records: %s", len(batch), failure(error))

    def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + self.PRUNE_EVERY
        try:
            pruned = self.prune()
        except Exception as error:
            log.error("could not delete old audit records: %s", failure(error))
            return
        if pruned:
            log.info("deleted %d audit records older than %d days", pruned, self.retention_days)
