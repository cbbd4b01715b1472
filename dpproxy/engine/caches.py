"""The engine's caches: what the cold path already answered for this very statement, kept.

A cache here holds the result of analysing one exact input — the statement's text, each bound
parameter's type and value, the per-query ε, the bounds the session set and the session's time
zone (which casts to timestamptz and timestamptz arithmetic are folded in, even in a statement that
reads no clock) — under the policy and schema the engine was built
with (a policy reload builds a new engine, with empty caches). A hit is the cold path's own answer to
an identical input, so it cannot differ from what a cold analysis would give: **no cache re-binds new
constants into SQL it learned from other ones** (docs/privacy.md §7, "Caches"). What is kept:

- `private`: the plan of a private statement (its SQL, noise and cost, and its salt, so a repeated
  dashboard statement bounds the same rows each time); never a plan whose public subqueries were
  answered first (their answer is data of its moment);
- `public`: a statement over public tables only, with the SQL its analysis emitted; never one with a
  subquery, for the same reason.

A statement with new constants is analysed cold. (Earlier versions re-bound learned "shapes" and
public templates by editing emitted text; an analyst made one run SQL the analyser had refused. The
cost of not doing so is measured in bench/cpu.py and the README's Performance section.)

Also here: `kept_key`, the key of what the ledger keeps for an analyst (a replayed answer, a released
value range), which no reload or new epoch may reuse.

Nothing here analyses SQL or runs it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from dpproxy.engine.plan import Plan
from dpproxy.lru import LRU
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.clock import session_zone
from dpproxy.sql.query import PublicQuery

CacheKey = tuple[str, tuple[tuple[type, str], ...], float, object, str]


@dataclass(frozen=True)
class PublicStatement:
    """A statement over public tables only: the analysed query and the SQL its analysis emitted."""

    query: PublicQuery
    sql: str


def cache_key(
    sql: str, params: Sequence[object], epsilon: float, bounds: SessionBounds | None = None
) -> CacheKey:
    """The exact input: the text, each parameter by its type and its repr (1, True, 1.0 and
    Decimal('1.0') are equal in Python but bind as different constants), ε, the bounds the
    session set (dpproxy.sql.bounds), and the statement clock's time zone (dpproxy.sql.clock)."""
    return (sql, tuple((type(p), repr(p)) for p in params), float(epsilon), bounds, session_zone())


class PlanCaches:
    """The two caches of one engine, each bounded (least recently used first out)."""

    SIZE = 512

    def __init__(self, size: int = SIZE) -> None:
        self.private: LRU[CacheKey, Plan] = LRU(size)
        self.public: LRU[CacheKey, PublicStatement] = LRU(size)


def kept_key(policy_digest: str, data_epoch: int | str, *material: str) -> str:
    """The key under which the ledger keeps something released to an analyst: the policy, `material`
    (what was asked), the session's time zone (which casts to timestamptz are folded in) and the
    operator's data epoch — nothing read from the database (dpproxy.engine.replay.replay_key)."""
    digest = json.dumps([policy_digest, *material, session_zone(), data_epoch])
    return hashlib.sha256(digest.encode()).hexdigest()
