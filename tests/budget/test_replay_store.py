"""Free replay in the store: stored answers, per analyst, first writer wins, the newest kept, and
keys and payloads checked.

Tests taking the `store` or `ledger` fixture run on both stores: a SQLite file and a PostgreSQL table
(marked `postgres`; a table of their own in one database of the shared throwaway cluster; tests that
change the database itself use `pg_dsn`, a fresh empty one).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dpproxy.budget import REPLAY_LIMIT, Ledger
from dpproxy.budget.sqlite import SQLiteLedger
from dpproxy.privacy.accounting import Cost
from tests.budget.stores import BUDGET, Store, race

KEY_A, KEY_B = "a" * 64, "0123456789abcdef" * 4


def test_replay_returns_what_was_stored_and_nothing_else(ledger: Ledger) -> None:
    assert ledger.replay_get("alice", KEY_A) is None
    payload = bytes(range(256)) * 4000  # binary, with NULs, about 1 MB
    ledger.replay_put("alice", KEY_A, payload)
    assert ledger.replay_get("alice", KEY_A) == payload
    assert ledger.replay_get("alice", KEY_B) is None
    assert ledger.spent("alice") == Cost(0.0, 0.0)  # storing an answer charges nothing


def test_replay_first_writer_wins(ledger: Ledger) -> None:
    ledger.replay_put("alice", KEY_A, b'{"rows": [[1]]}')
    ledger.replay_put("alice", KEY_A, b'{"rows": [[2]]}')
    ledger.replay_put("alice", KEY_A, b'{"rows": [[1]]}')  # idempotent
    assert ledger.replay_get("alice", KEY_A) == b'{"rows": [[1]]}'


def test_replay_is_per_analyst(ledger: Ledger) -> None:
    ledger.replay_put("alice", KEY_A, b"alice's answer")
    assert ledger.replay_get("bob", KEY_A) is None
    ledger.replay_put("bob", KEY_A, b"bob's answer")
    assert ledger.replay_get("alice", KEY_A) == b"alice's answer"
    assert ledger.replay_get("bob", KEY_A) == b"bob's answer"


def test_replay_forget_and_reset_drop_one_analysts_answers(ledger: Ledger) -> None:
    ledger.replay_put("alice", KEY_A, b"1")
    ledger.replay_put("alice", KEY_B, b"2")
    ledger.replay_put("bob", KEY_A, b"3")
    assert ledger.replay_forget("alice") == 2
    assert ledger.replay_get("alice", KEY_A) is None and ledger.replay_get("alice", KEY_B) is None
    assert ledger.replay_get("bob", KEY_A) == b"3"
    assert ledger.replay_forget("alice") == 0

    ledger.replay_put("alice", KEY_A, b"4")
    ledger.commit(ledger.reserve("alice", Cost(0.5), BUDGET))
    assert ledger.reset("alice") == 1  # counts ledger entries, as before
    assert ledger.replay_get("alice", KEY_A) is None
    assert ledger.replay_get("bob", KEY_A) == b"3"
    ledger.replay_put("alice", KEY_A, b"5")  # a new answer after a reset is stored afresh
    assert ledger.replay_get("alice", KEY_A) == b"5"


def test_replay_keeps_the_newest_answers_per_analyst(store: Store) -> None:
    assert REPLAY_LIMIT == 10_000
    ledger = store.open(replay_limit=3)
    keys = [f"{i:032x}" for i in range(5)]
    ledger.replay_put("bob", keys[0], b"bob")
    for i, key in enumerate(keys):
        ledger.replay_put("alice", key, str(i).encode())
    assert [ledger.replay_get("alice", key) for key in keys] == [None, None, b"2", b"3", b"4"]
    ledger.replay_put("alice", keys[4], b"again")  # already stored: nothing new, nothing evicted
    assert [ledger.replay_get("alice", key) for key in keys] == [None, None, b"2", b"3", b"4"]
    ledger.replay_put("alice", keys[0], b"anew")  # an evicted answer bought again is the newest
    assert [ledger.replay_get("alice", key) for key in keys] == [b"anew", None, None, b"3", b"4"]
    assert ledger.replay_get("bob", keys[0]) == b"bob"  # another analyst's answers are not evicted


def test_replay_answers_survive_reopen(store: Store) -> None:
    with store.open() as ledger:
        ledger.replay_put("alice", KEY_A, b"stored")
    with store.open() as reopened:
        assert reopened.replay_get("alice", KEY_A) == b"stored"


def test_replay_puts_racing_on_one_key_keep_one_answer(store: Store) -> None:
    ledger = store.open(max_connections=8) if store.kind == "postgres" else store.open()
    payloads = iter(str(i).encode() for i in range(20))
    lock = threading.Lock()

    def put_one() -> bool:
        with lock:
            payload = next(payloads)
        ledger.replay_put("alice", KEY_A, payload)
        return ledger.replay_get("alice", KEY_A) is not None

    assert race(put_one, contenders=20) == 20
    stored = ledger.replay_get("alice", KEY_A)
    assert stored in {str(i).encode() for i in range(20)}
    assert store.open().replay_get("alice", KEY_A) == stored


@pytest.mark.parametrize("key", ["", "ABCDEF0123456789", "abc", "g" * 32, "a" * 129, b"a" * 32, None])
def test_replay_keys_must_be_hex_digests(key: object) -> None:
    with SQLiteLedger(":memory:") as ledger:
        with pytest.raises(ValueError, match="replay key"):
            ledger.replay_put("alice", key, b"x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="replay key"):
            ledger.replay_get("alice", key)  # type: ignore[arg-type]


def test_replay_payloads_are_bytes_and_the_limit_positive(tmp_path: Path) -> None:
    with SQLiteLedger(tmp_path / "ledger.sqlite3") as ledger:
        with pytest.raises(TypeError, match="payload must be bytes"):
            ledger.replay_put("alice", KEY_A, '{"rows": []}')  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="analyst"):
            ledger.replay_get("", KEY_A)
        ledger.replay_put("alice", KEY_A, bytearray(b"ok"))
        assert ledger.replay_get("alice", KEY_A) == b"ok"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="replay_limit"):
            SQLiteLedger(tmp_path / "other.sqlite3", replay_limit=bad)  # type: ignore[arg-type]
