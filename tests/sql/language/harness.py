"""What must hold for every generated statement (the checks of tests/sql/test_language.py).

For a statement S and the adversarial databases:
  1. S is refused with a documented SQLSTATE — the same on every dialect, and before any statement
     that reads a protected table reached a backend — or it is accepted on all (answered without a
     private plan — a probe — only if no statement reading a protected table reached a backend); Spark alone may
     refuse a construct it cannot give PostgreSQL's meaning (0A000, "… on the Spark backend");
  2. accepted, its rewritten SQL runs without error on DuckDB and on PostgreSQL (and Spark, when the
     databases are loaded there too), on every database;
  3. with limits no generated person reaches (so no per-person choice drops anything), every
     backend gives the pre-noise values and group sets DuckDB gives;
  4. the sensitivity certificate holds on neighbouring databases (each person removed, including the
     person with very many rows and the person alone in a group): every pre-noise component moves
     by at most its declared sensitivity, no person changes more than max_groups groups; on DuckDB
     for one statement in four under `contribution_bounds: fixed`, and for another one in four (and
     on PostgreSQL one in sixteen) under `null_units: each_a_person` (schema.EACH_A_PERSON), where
     each person without a unit (their rows alike in every column) is a neighbour too;
  5. group keys outside a key's public values never reach the released set;
  6. released rows come in an order that depends on released values only (handed the same groups
     in another order, post-processing gives the same rows);
  7. on the database with one row per person, told that only patients' unit is unique: a statement
     whose keys read patients alone (each person in one group, no ranking of their groups) is
     certified, and every candidate's values are those of the plan that ranks them;
  8. on the first database, on DuckDB, the plan is released once (bounds and groups chosen, noise
     drawn at the chosen bounds, rows post-processed) without failing.
One statement in four (by a hash of its text) is planned as with SET dpproxy.estimate_left_out =
on: their counts of what bounding removed and of the groups holding persons are certified (4) and
released (8) with the rest.
`check` returns the failures it found as strings (empty: the statement passed).
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from dpproxy.engine import Engine, Plan
from dpproxy.engine.released import plan_released, post_process_released
from dpproxy.errors import DPProxyError
from dpproxy.policy import Policy
from dpproxy.release import ExactGroups, post_process
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.clock import CLOCK
from dpproxy.sql.postprocess.intervals import interval_slots
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.released import ReleasedQuery
from dpproxy.sql.types import PgType
from tests.certify import _candidates_by_key, certify
from tests.sql.language import temporal
from tests.sql.language.databases import Loaded, RawBackend
from tests.sql.language.grammar import Generated

# Every SQLSTATE a refusal may carry (README, "Errors").
DOCUMENTED_SQLSTATES = {
    "42501",  # the policy forbids it
    "0A000",  # not supported
    "42601",  # syntax
    "42P01",  # unknown table
    "42703",  # unknown column
    "42702",  # ambiguous column
    "42803",  # grouping
    "42804",  # datatype mismatch
    "42883",  # no such operator or function for these types
    "22023",  # bad parameter value
    "22P02",  # malformed constant
    "22003",  # a constant out of its integer type
    "22007",  # malformed date or time constant
    "22008",  # date or time constant out of range
    "3F000",  # unknown schema
    "22012",  # division by zero in the query's constants
    "21000",  # a public scalar subquery returned more than one row
    "54000",  # a public subquery returned more rows than can be inlined
    "54001",  # a statement past the limits on statements (README), refused before it is planned
}


@dataclass
class Backends:
    """One database loaded in each engine, with an Engine per policy and dialect over it."""

    name: str
    duckdb: Loaded
    postgres: Loaded | None
    spark: Loaded | None = None
    engines: dict[tuple[str, str], Engine] = field(default_factory=dict)  # (policy, dialect)

    @staticmethod
    def build(
        name: str,
        duckdb: Loaded,
        postgres: Loaded | None,
        policies: dict[str, Policy],
        spark: Loaded | None = None,
    ) -> Backends:
        backends = Backends(name, duckdb, postgres, spark)
        for label, policy in policies.items():
            for loaded in (duckdb, postgres, spark):
                if loaded is not None:
                    backends.engines[(label, loaded.kind)] = Engine(policy, RawBackend(loaded))
        db = duckdb.db
        assert db is not None
        if db.one_row_per_person:
            # The database keeps one row per person in each protected table: the plans that trust an
            # enforced-unique unit (no per-person bounding, r = g = 1) are certified on it too.
            for loaded in (duckdb, postgres, spark):
                if loaded is not None:
                    backends.engines[("unique", loaded.kind)] = Engine(
                        policies["limits"],
                        RawBackend(loaded),
                        unique_columns={
                            "patients": frozenset({"patient_id"}),
                            "visits": frozenset({"patient_id"}),
                        },
                    )
                    # Only patients' unit known unique: keys read from patients alone put each
                    # person in one group, which the rewrite then does not rank (_one_group_each).
                    backends.engines[("unique-patients", loaded.kind)] = Engine(
                        policies["limits"],
                        RawBackend(loaded),
                        unique_columns={"patients": frozenset({"patient_id"})},
                    )
        return backends

    def loaded(self, dialect: str) -> Loaded:
        chosen = {"duckdb": self.duckdb, "postgres": self.postgres, "spark": self.spark}[dialect]
        assert chosen is not None
        return chosen

    def persons(self) -> list[int]:
        db = self.duckdb.db
        assert db is not None
        return [*db.patient_ids, *db.survey_ids]


def _refused_by_the_high_limits_alone(plan: object, high: DPProxyError) -> bool:
    """A refusal that only the high limits bring, the same on every database and backend because it
    depends on the policy and the statement alone: MODE over a per-person count has one candidate
    per count up to the ceiling, too many under the high limits (0A000); a sum whose sensitivity
    at the high limits is past what noise can be calibrated for (22023, e.g. SUM(strpos(…) * x) with
    a row ceiling of thousands); a variance whose squares, or a sum whose values, times the row
    ceiling leave bigint (0A000, e.g. STDDEV of a per-person SUM, whose range grows with the ceiling,
    or SUM(strpos(…) * extract(dow …))). Accepted under the small
    limits, the statement is certified there."""
    if plan is None or isinstance(plan, DPProxyError):
        return False
    text = str(high)
    return (
        (high.sqlstate == "0A000" and "possible values; at most" in text)
        or (high.sqlstate == "22023" and "is too large to calibrate noise for" in text)
        or (
            high.sqlstate == "0A000" and ("are too wide for" in text or "are too wide to sum exactly" in text)
        )
    )


def _plan(engine: Engine, query: Generated) -> Plan | DPProxyError | None:
    """The statement's private plan, its refusal, or None when it reads no protected table (a
    public or constant query: no privacy to certify)."""
    backend = engine.backend
    assert isinstance(backend, RawBackend)
    backend.statements.clear()
    try:
        analyzed = engine.analyze(query.sql, query.params)
        if isinstance(analyzed, ReleasedQuery):  # the outer query is post-processing: certify the aggregate
            analyzed = analyzed.private
        if not isinstance(analyzed, PrivateQuery):
            return None
        # One statement in four also estimates what bounding and selection leave out (SET
        # dpproxy.estimate_left_out = on): its counts are certified and released with the rest.
        bounds = SessionBounds(estimate=True) if zlib.crc32(query.sql.encode()) % 4 == 0 else None
        return engine.plan_private(analyzed, engine.query_epsilon(None), salt="language", bounds=bounds)
    except DPProxyError as error:
        return error


def _same_exact_groups(a: ExactGroups, b: ExactGroups, names: tuple[str, str]) -> str | None:
    left = {
        k: (c, u, h)
        for k, c, u, h in zip(
            a.keys, a.components, a.units, a.histograms or [None] * len(a.keys), strict=True
        )
    }
    right = {
        k: (c, u, h)
        for k, c, u, h in zip(
            b.keys, b.components, b.units, b.histograms or [None] * len(b.keys), strict=True
        )
    }
    if set(left) != set(right):
        return f"group sets differ: only {names[0]} {sorted(map(repr, set(left) - set(right)))[:5]}, only {names[1]} {sorted(map(repr, set(right) - set(left)))[:5]}"
    for key, value in left.items():
        if value != right[key]:
            return f"group {key!r}: {names[0]} {value} != {names[1]} {right[key]}"
    return None


def check(
    query: Generated, databases: Sequence[Backends], *, certify_on: Sequence[str] = ("duckdb",)
) -> list[str]:
    """The failures of one statement over the databases (see the module docstring), now() being
    tests/sql/language/temporal.CLOCK for every dialect."""
    token = CLOCK.set(temporal.CLOCK)
    try:
        return _check(query, databases, certify_on)
    finally:
        CLOCK.reset(token)


def _certified_too(
    db: Backends, dialect: str, query: Generated, label: str, what: str, unitless: bool = False
) -> list[str]:
    """The statement planned by the database's `label` engine, if it has one and accepts it, and
    certified on every neighbour (`what` says what that engine's policy or catalog differs in); with
    `unitless`, also on D minus each person without a unit of the tables that make each such row a
    person (schema.EACH_A_PERSON; rows alike in every column are one)."""
    engine = db.engines.get((label, dialect))
    plan = _plan(engine, query) if engine is not None else None
    if unitless and isinstance(plan, DPProxyError):  # it changes who the persons are, not the language
        return [f"accepted, but refused with {what} on {db.name}/{dialect}: {plan.sqlstate} {plan}"]
    if plan is None or isinstance(plan, DPProxyError):
        return []
    loaded = db.loaded(dialect)
    neighbours = [*db.persons(), *(loaded.unitless_persons() if unitless else ())]
    try:
        certify(plan, loaded.run, neighbours)  # type: ignore[arg-type]
    except AssertionError as error:
        return [f"certificate fails with {what} on {db.name}: {error}"]
    except Exception as error:
        return [f"the plan with {what} fails on {db.name}/{dialect}: {error}"]
    return []


def _one_group_each(db: Backends, dialect: str, query: Generated, ranked: Plan) -> list[str]:
    """Told that only patients' unit is unique, a statement whose keys read patients alone
    (PrivateQuery.one_group_per_unit: no ranking of a person's groups) is certified on every
    neighbour, and every candidate's values equal those of `ranked`, the plan that ranks them."""
    engine = db.engines.get(("unique-patients", dialect))
    plan = _plan(engine, query) if engine is not None else None
    if not isinstance(plan, Plan) or not plan.query.one_group_per_unit or not plan.chooses_bounds:
        return []
    loaded = db.loaded(dialect)
    try:
        certify(plan, loaded.run, db.persons())
        one, many = (p.measure(*(loaded.run(sql) for sql in p.statements)) for p in (plan, ranked))
    except AssertionError as error:
        return [f"certificate fails with one group per person on {db.name}: {error}"]
    except Exception as error:
        return [f"the plan with one group per person fails on {db.name}/{dialect}: {error}"]
    assert one.candidates is not None
    if many.candidates is None:  # the same policy with fewer unique columns chooses bounds as well
        return [f"one group per person: the ranked plan chooses no bounds on {db.name}/{dialect}"]
    if _candidates_by_key(one) != _candidates_by_key(many) or one.candidates.above != many.candidates.above:
        return [f"one group per person: candidates differ from the ranked plan's on {db.name}/{dialect}"]
    return []


def _check(query: Generated, databases: Sequence[Backends], certify_on: Sequence[str]) -> list[str]:
    failures: list[str] = []
    first = databases[0]
    dialects = [d for d in ("duckdb", "postgres", "spark") if (("limits", d) in first.engines)]
    outcomes: dict[str, Plan | DPProxyError | None] = {}
    for dialect in dialects:
        engine = first.engines[("limits", dialect)]
        try:
            outcomes[dialect] = _plan(engine, query)
        except Exception as crash:
            return [f"analysis crashed on {dialect}: {type(crash).__name__}: {crash}"]
        backend = engine.backend
        assert isinstance(backend, RawBackend)
        if isinstance(outcomes[dialect], DPProxyError) and backend.touched_protected_data():
            failures.append(f"refused on {dialect} after reading protected data: {backend.statements}")
        if outcomes[dialect] is None and backend.touched_protected_data():
            # A probe (no rows, or one row of constants) is answered from the text alone.
            failures.append(f"answered without a private plan on {dialect} after reading protected data")
    spark = outcomes.get("spark")
    if isinstance(spark, DPProxyError) and len(outcomes) > 1:
        others = [o for d, o in outcomes.items() if d != "spark"]
        if not any(isinstance(o, DPProxyError) for o in others):
            if spark.sqlstate != "0A000" or "on the Spark backend" not in str(spark):
                return [*failures, f"refused on Spark only, not as a Spark limit: {spark.sqlstate} {spark}"]
            # A construct Spark cannot give PostgreSQL's meaning: the others still agree.
            dialects.remove("spark")
            del outcomes["spark"]
    refused = {d: o for d, o in outcomes.items() if isinstance(o, DPProxyError)}
    if all(o is None for o in outcomes.values()):
        return failures
    if any(o is None for o in outcomes.values()):
        return [*failures, f"private on one dialect only: {outcomes}"]
    if refused:
        codes = {d: o.sqlstate for d, o in refused.items()}
        if len(refused) != len(outcomes):
            return [*failures, f"accepted on one dialect only: refused {codes}"]
        if len(set(codes.values())) > 1:
            failures.append(f"refused with different SQLSTATEs per dialect: {codes}")
        for dialect, error in refused.items():
            if error.sqlstate not in DOCUMENTED_SQLSTATES:
                failures.append(f"refused on {dialect} with undocumented SQLSTATE {error.sqlstate}: {error}")
        return failures
    failures.extend(_released_rows(first, query))
    for db in databases:
        measured: dict[str, ExactGroups] = {}
        for dialect in dialects:
            # The first database's plan under the limits is the one analysed above.
            plan = outcomes[dialect] if db is first else _plan(db.engines[("limits", dialect)], query)
            high = _plan(db.engines[("high", dialect)], query)
            if plan is None and high is None:
                # No private plan on this database: a public subquery's answer made the WHERE
                # never true (an EmptyQuery, answered from public data alone, touching nothing).
                continue
            if isinstance(high, DPProxyError) and _refused_by_the_high_limits_alone(plan, high):
                continue
            if (
                plan is None
                or high is None
                or isinstance(plan, DPProxyError)
                or isinstance(high, DPProxyError)
            ):
                error = plan if isinstance(plan, DPProxyError) else high
                failures.append(
                    f"accepted on the first database but refused on {db.name}/{dialect}: "
                    f"{getattr(error, 'sqlstate', 'no private plan')} {error}"
                )
                continue
            loaded = db.loaded(dialect)
            # Spark queries are slow: the plan that bounds persons runs there on the first database
            # (the one with persons to bound) and where it is certified; agreement needs `high` only.
            bounded = dialect != "spark" or db is first or dialect in certify_on
            try:
                rows = [loaded.run(sql) for sql in plan.statements] if bounded else []
                if bounded:
                    plan.measure(*rows)
                measured[dialect] = high.measure(*(loaded.run(sql) for sql in high.statements))
            except Exception as error:
                failures.append(
                    f"accepted but fails on {db.name}/{dialect}: {type(error).__name__}: {str(error).splitlines()[0]}"
                )
                continue
            failures.extend(_public_keys(plan, measured[dialect], f"{db.name}/{dialect}"))
            if bounded:
                failures.extend(_order_of_released_rows(plan, plan.measure(*rows), f"{db.name}/{dialect}"))
            if db is first and dialect == "duckdb":
                failures.extend(_released(db.engines[("limits", dialect)], plan, rows, loaded.run))
            if dialect in certify_on:
                try:
                    certify(plan, loaded.run, db.persons())
                except AssertionError as error:
                    failures.append(f"sensitivity certificate fails on {db.name}/{dialect}: {error}")
                except Exception as error:
                    # It ran on D: failing on a neighbour is a failure one person decides.
                    failures.append(
                        f"fails on a neighbour of {db.name}/{dialect}: {type(error).__name__}: {error}"
                    )
                # With fixed limits (one statement in four, on DuckDB): the limits bound every
                # query, and an average's sums are scaled per person on the fine grid.
                if dialect == "duckdb" and query.index % 4 == 2:
                    failures += _certified_too(db, dialect, query, "fixed", "fixed limits")
                failures += _certified_too(db, dialect, query, "unique", "enforced-unique units")
                # With null_units: each_a_person (one statement in four on DuckDB, one in sixteen on
                # PostgreSQL): a row without a person is a neighbour of its own.
                if (dialect == "duckdb" and query.index % 4 == 1) or (
                    dialect == "postgres" and query.index % 16 == 0
                ):
                    failures += _certified_too(
                        db, dialect, query, "each", "null_units: each_a_person", unitless=True
                    )
                if dialect == "duckdb":
                    failures += _one_group_each(db, dialect, query, plan)
        if "duckdb" in measured:
            for other in (d for d in dialects if d != "duckdb" and d in measured):
                difference = _same_exact_groups(measured["duckdb"], measured[other], ("duckdb", other))
                if difference:
                    failures.append(f"backends disagree on {db.name}: {difference}")
    return failures


def _stand_in(key: tuple, index: int, pg_type: PgType) -> object:
    """A released value for an aggregate of a group that depends only on the group's key: what
    neighbouring databases would release alike for a group both have."""
    h = zlib.crc32(f"{key!r}:{index}".encode())
    if pg_type.is_integer:
        return h % 7  # few distinct values: ORDER BY ties are common, the canonical order decides
    if pg_type is PgType.NUMERIC:
        return Decimal(h % 700) / 100
    if pg_type.is_float:
        return (h % 700) / 100
    if pg_type is PgType.BOOL:
        return bool(h % 2)
    if pg_type is PgType.DATE:
        return dt.date(2020, 1, 1) + dt.timedelta(days=h % 7)
    if pg_type in (PgType.TIMESTAMP, PgType.TIMESTAMPTZ):
        return dt.datetime(2020, 1, 1) + dt.timedelta(hours=h % 7)
    return str(h % 7)


def _order_of_released_rows(plan: Plan, measured: ExactGroups, where: str) -> list[str]:
    """Released rows come in an order that depends on released values only: the same groups with
    the same values, handed over in the backend's order or in reverse, give the same answer."""
    query = plan.query
    if not query.keys or query.randomized_response:
        return []
    key_types = [k.type for k in query.keys]
    types = [a.result_type for a in query.aggregates]
    values = [[_stand_in(k, i, t) for i, t in enumerate(types)] for k in measured.keys]
    # The interval ends the query reads come after the aggregates' own columns, as the release
    # appends them (dpproxy.release.aggregates): here the aggregate's own stand-in for each end.
    slots = interval_slots(query.post_processing)
    values = [[*row, *(row[a] for a, _ in slots)] for row in values]
    try:
        forward = post_process(query.post_processing, key_types, types, measured.keys, values)
        backward = post_process(query.post_processing, key_types, types, measured.keys[::-1], values[::-1])
    except DPProxyError:
        return []  # a post-processing error on stand-in values (an overflowing cast, say)
    except Exception as crash:
        return [f"{where}: post-processing crashed: {type(crash).__name__}: {crash}"]
    if forward != backward:
        return [f"{where}: the released rows depend on the order the backend returned them in"]
    return []


def _public_keys(plan: Plan, measured: ExactGroups, where: str) -> list[str]:
    query = plan.query
    failures = []
    for j, key in enumerate(query.keys):
        if key.public_values is None:
            continue
        allowed = set(key.public_values)
        outside = {k[j] for k in measured.keys if k[j] not in allowed}
        if outside:
            failures.append(
                f"{where}: key {key.text} has values outside its public values: {sorted(map(repr, outside))}"
            )
    return failures


def _released(engine: Engine, plan: Plan, rows: list, run: Callable[[str], list]) -> list[str]:
    """The plan released once from its statements' rows (Engine.release: the bounds and groups
    chosen, noise drawn at the chosen bounds — one k, or the averages' and the others' — the rows
    post-processed), which must not fail: after the backend has run, a failure is charged."""
    try:
        engine.release(plan, rows, run)
    except Exception as error:
        return [f"the release fails on DuckDB: {type(error).__name__}: {error}"]
    return []


def _released_rows(db: Backends, query: Generated) -> list[str]:
    """A query over a private aggregate's answer (dpproxy.sql.released): the aggregate released once
    on DuckDB and the outer query run over its rows, which must not fail."""
    engine = db.engines[("limits", "duckdb")]
    analyzed = engine.analyze(query.sql, query.params)
    if not isinstance(analyzed, ReleasedQuery):
        return []
    plan = plan_released(engine, analyzed, engine.query_epsilon(None), None)
    loaded = db.loaded("duckdb")
    try:
        answer = engine.release(
            plan.private, [loaded.run(sql) for sql in plan.private.statements], loaded.run
        )
        result = post_process_released(plan, answer)
    except Exception as error:
        return [f"the outer query over released rows fails: {type(error).__name__}: {error}"]
    if [c.name for c in result.columns] != [o.name for o in analyzed.outputs]:
        return [f"released-rows columns {result.columns} differ from the analysis's {analyzed.outputs}"]
    return []
