"""Differential certification of the engine's fast paths: every cache path gives the cold path's answer.

For a statement S (generated, a regression, or a BI tool's), `cache_failures` builds variants of S
with other constants — every integer numeral of its text replaced by adversarial values (numerals
equal to values the engine once used internally, the same numeral in every place, boundaries), in
the text and as `$n` parameters — and, for each pair (A, B) of variants, asks an engine that has seen
A (so its caches learned from A) for B, and checks that what it would run is exactly what a fresh
engine's cold analysis of B gives: the same refusal, or the same SQL (statements and refined-quantile
statements), normalised text, analysed query, noise plan and cost for a private statement, the same
SQL and columns for a public one. It goes through `Engine.prepare`, the one way `execute` gets what
it runs, so a cache added there is certified by this without a test of its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from dpproxy.engine import Engine, Plan
from dpproxy.engine.caches import PublicStatement
from dpproxy.errors import DPProxyError
from dpproxy.policy import Policy

SALT = "cache"
# Values that once had meaning inside the engine (the shape cache's sentinels and its public
# templates' integer sentinels), boundaries of the integer types, and ordinary values.
ADVERSARIAL = (738_291_000, 738_291_007, 2_000_000_011, 999_999_999, 2_147_483_647, 0, 1, 7, 30, 100)

_POSTGRES = Dialect.get_or_raise("postgres")


def engine(policy: Policy) -> Engine:
    made = Engine(policy, None)
    made.new_salt = lambda: SALT
    return made


def integer_numerals(sql: str) -> list[tuple[int, int]]:
    """(start, end) of every unsigned integer numeral token of the text."""
    try:
        tokens = _POSTGRES.tokenize(sql)
    except TokenError:
        return []
    return [
        (t.start, t.end + 1)
        for t in tokens
        if t.token_type is TokenType.NUMBER and t.text.isdigit() and sql[t.start : t.end + 1] == t.text
    ]


def _with_numerals(sql: str, places: list[tuple[int, int]], values: Sequence[str]) -> str:
    out, at = [], 0
    for (start, end), value in zip(places, values, strict=True):
        out += [sql[at:start], value]
        at = end
    return "".join([*out, sql[at:]])


def variants(sql: str, params: list[object]) -> list[tuple[str, str, list[object]]]:
    """(label, text, parameters): S itself, S with adversarial numerals, and S with its numerals as
    trailing `$n` parameters (with their own values and with adversarial ones)."""
    found = [("as written", sql, params)]
    places = integer_numerals(sql)
    if not places:
        return found
    n = len(places)
    seed = zlib.crc32(sql.encode())
    choices = {
        "old sentinels": [str(738_291_000 + 7 * i) for i in range(n)],
        "one value everywhere": [str(ADVERSARIAL[seed % len(ADVERSARIAL)])] * n,
        "mixed": [str(ADVERSARIAL[(seed + 3 * i) % len(ADVERSARIAL)]) for i in range(n)],
        "plus one": [str(int(sql[a:b]) + 1) for a, b in places],
    }
    for label, values in choices.items():
        found.append((label, _with_numerals(sql, places, values), params))
    first = len(params) + 1
    as_parameters = _with_numerals(sql, places, [f"${first + i}" for i in range(n)])
    own = [int(sql[a:b]) for a, b in places]
    found.append(("as $n", as_parameters, [*params, *own]))
    found.append(("as $n, adversarial", as_parameters, [*params, *(int(v) for v in choices["mixed"])]))
    return found


Outcome = Plan | PublicStatement | DPProxyError | object


def _prepared(made: Engine, sql: str, params: list[object]) -> Outcome:
    try:
        return made.prepare(sql, params, epsilon=made.query_epsilon(None))
    except DPProxyError as error:
        return error


def difference(cached: Outcome, cold: Outcome) -> str | None:
    """How what a warm engine would run differs from the cold analysis (None: it does not)."""
    if isinstance(cold, DPProxyError) or isinstance(cached, DPProxyError):
        if type(cached) is not type(cold) or str(cached) != str(cold):
            return f"cold gives {cold!r}, the warm engine {cached!r}"
        return None
    if type(cached) is not type(cold):
        return f"cold gives a {type(cold).__name__}, the warm engine a {type(cached).__name__}"
    if isinstance(cold, Plan):
        assert isinstance(cached, Plan)
        if cached.statements != cold.statements:
            return "the SQL sent differs"
        bins = [0, 1, 2]
        refined = {h: r.sql(bins) for h, r in cold.refinements.items()}
        if {h: r.sql(bins) for h, r in cached.refinements.items()} != refined:
            return "a refined quantile's second statement differs"
        if cached.query.text != cold.query.text or repr(cached.query) != repr(cold.query):
            return "the analysed query differs"
        if repr(cached.noise) != repr(cold.noise) or cached.cost != cold.cost:
            return "the noise plan differs"
        return None
    if isinstance(cold, PublicStatement):
        assert isinstance(cached, PublicStatement)
        if cached.sql != cold.sql or repr(cached.query.outputs) != repr(cold.query.outputs):
            return "the public statement's SQL or columns differ"
        return None
    if repr(cached) != repr(cold):
        return "the answer without data differs"
    return None


def cache_failures(sql: str, params: list[object], policy: Policy) -> list[str]:
    """Every variant asked twice, in turn, of one engine (so each is asked once its predecessors were
    learned, then again from its own entry), and again in the reverse order of a second engine; each
    answer compared with a fresh engine's cold analysis of the same input."""
    found = variants(sql, params)
    cold = {label: _prepared(engine(policy), text, ps) for label, text, ps in found}
    failures = []
    for order in (found, found[::-1]):
        warm = engine(policy)
        seen: list[str] = []
        for label, text, ps in order:
            for attempt in ("first", "again"):
                gap = difference(_prepared(warm, text, ps), cold[label])
                if gap:
                    failures.append(f"asked {label!r} ({attempt}) after {seen}: {text} {ps}: {gap}")
            seen.append(label)
    return failures
