"""Policy reload without restart: reading the policy file again, telling why a new policy was refused,
and the reload-status file `dpproxy policy reload` waits on.

This module owns the outcome of a reload (`Reloads`: a generation counter, the problems, one log line
per problem) and the status file's place and shape. Checking a new policy is the engine's (the same
checks `serve` makes at start: dpproxy.policy's validation, then Engine's comparison with the live
schema); swapping it in is the server's (`Server.reload`) or, with several workers, the supervisor's
(dpproxy.wire.workers). A refused policy changes nothing: the running one keeps serving.

The status file holds the generation, whether the last reload was accepted, its problems (policy
file lines, table and column names: never a value from the data) and when it happened. Each outcome is
also an operator action in the audit log (kind "operator", written to the ledger `serve` uses).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dpproxy.backends import BackendError
from dpproxy.errors import DPProxyError, PolicyError
from dpproxy.policy import Policy
from dpproxy.policy.loading import parse_policy

__all__ = ["ReloadStatus", "Reloads", "policy_text", "problems_of", "read_status", "status_path"]

log = logging.getLogger("dpproxy.reload")

STATUS_SUFFIX = ".reload.json"


def status_path(pid_file: Path | None, pid: int) -> Path:
    """Where the server with `pid` writes its reload status: beside its pid file (`F.reload.json`),
    else in the user's runtime directory ($XDG_RUNTIME_DIR/dpproxy, or a private one under the temp
    directory), named by the pid."""
    if pid_file is not None:
        return pid_file.with_name(pid_file.name + STATUS_SUFFIX)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "dpproxy" if runtime else Path(tempfile.gettempdir()) / f"dpproxy-{os.getuid()}"
    return base / f"{pid}{STATUS_SUFFIX}"


@dataclass
class ReloadStatus:
    generation: int  # 0 at start, +1 per reload asked for (accepted or refused)
    accepted: bool
    policy: str  # the policy file
    problems: list[str] = field(default_factory=list)
    at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    tables: int = 0  # of the policy serving now
    analysts: int = 0


def read_status(path: Path) -> ReloadStatus | None:
    """The status in `path`; None if there is none (yet) or it cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ReloadStatus(**data)
    except (OSError, ValueError, TypeError):
        return None


def _write(path: Path, status: ReloadStatus) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".reload-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(asdict(status), file)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def policy_text(path: Path) -> tuple[str, Policy]:
    """The policy file's text and the policy it validates to (PolicyError listing every problem)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(
            [f"{path}: cannot read the policy file ({exc.strerror}); check the path and its permissions"],
            source=str(path),
        ) from None
    except UnicodeDecodeError:
        raise PolicyError(
            [f"{path}: the policy file is not UTF-8 text; save it as UTF-8"], source=str(path)
        ) from None
    return text, parse_policy(text, str(path))


def problems_of(error: BaseException) -> list[str]:
    """What made a policy unservable, one problem per item: a policy's own problems, a mismatch with the
    live schema, or an unreachable backend (whose text names where the DSN points, never a password)."""
    if isinstance(error, PolicyError):
        return list(error.problems)
    if isinstance(error, DPProxyError):
        return [error.message]
    if isinstance(error, BackendError):
        return [f"cannot reach the backing database: {error}"]
    return [f"the policy could not be loaded: {type(error).__name__}"]


class Reloads:
    """The reload outcomes of one server (or supervisor): counted, logged and written to `path`."""

    def __init__(
        self, policy_file: Path, path: Path | None, policy: Policy, ledger: str | None = None
    ) -> None:
        self.policy_file = policy_file
        self.path = path
        self.ledger = ledger  # where reloads are audited (None or ":memory:": not audited)
        self.generation = 0
        self._lock = threading.Lock()
        self._status = self._outcome(True, tables=len(policy.tables), analysts=len(policy.analysts))
        self._save()

    def _outcome(
        self, accepted: bool, *, tables: int, analysts: int, problems: Sequence[str] = ()
    ) -> ReloadStatus:
        """The status of this generation: accepted or refused (with its problems), and the size of
        the policy serving now."""
        return ReloadStatus(
            self.generation,
            accepted,
            str(self.policy_file),
            list(problems),
            tables=tables,
            analysts=analysts,
        )

    def accepted(self, policy: Policy) -> None:
        with self._lock:
            self.generation += 1
            self._status = self._outcome(True, tables=len(policy.tables), analysts=len(policy.analysts))
            log.info(
                "policy %s reloaded (generation %d): %d table(s), %d analyst(s); new connections use it",
                self.policy_file,
                self.generation,
                len(policy.tables),
                len(policy.analysts),
                extra={"generation": self.generation, "accepted": True},
            )
            self._save()
        self._audit(
            f"policy reload accepted (generation {self.generation}): {self.policy_file}, "
            f"{len(policy.tables)} table(s), {len(policy.analysts)} analyst(s)"
        )

    def refused(self, problems: list[str]) -> None:
        with self._lock:
            self.generation += 1
            self._status = self._outcome(
                False, tables=self._status.tables, analysts=self._status.analysts, problems=problems
            )
            log.error(
                "policy %s refused (generation %d): %d problem(s); the running policy stays",
                self.policy_file,
                self.generation,
                len(problems),
                extra={"generation": self.generation, "accepted": False, "problems": list(problems)},
            )
            for problem in problems:
                log.error(
                    "policy problem: %s", problem, extra={"generation": self.generation, "problem": problem}
                )
            self._save()
        self._audit(
            f"policy reload refused (generation {self.generation}): {self.policy_file}: "
            + "; ".join(problems)
        )

    def _audit(self, what: str) -> None:
        """The reload as an operator action in the audit log (who: the OS user serving, on SIGHUP)."""
        if self.ledger is None or self.ledger == ":memory:":
            return
        from dpproxy.budget import open_ledger
        from dpproxy.policy import DATASET

        try:
            with open_ledger(self.ledger) as ledger:
                ledger.audit_operator(DATASET, what, by=f"{_os_user()} (SIGHUP)")
        except Exception as error:  # the reload stands; only its audit row is missing
            log.warning("could not audit the policy reload: %s", type(error).__name__)

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            _write(self.path, self._status)
        except OSError as error:
            log.warning("cannot write the reload status %s: %s", self.path, error.strerror or error)

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
