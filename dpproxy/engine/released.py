"""Running a query over the released rows of a private aggregate (dpproxy.sql.released).

The private aggregate at the bottom is planned, charged and released exactly as if it had been sent
alone (its replay and its notice included); each outer query is then computed from the released rows
on an in-memory DuckDB that holds those rows and nothing else: external access (files, the network,
extensions) is disabled and the configuration locked before a row is loaded. The rows go into a
temporary table of a connection of their own (a cursor of the process's one in-memory database:
opening a database costs ~27 ms, a cursor ~1 ms), which no other connection sees and which goes when
that connection is closed, once the answer is read.
Nothing here reads the backing database, and nothing here is charged: post-processing is free.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import duckdb
from sqlglot import exp

from dpproxy.engine.plan import Plan
from dpproxy.engine.protocol import EngineLike
from dpproxy.errors import DPProxyError, InvalidParameter
from dpproxy.results import Result, ResultColumn
from dpproxy.sql.bounds import SessionBounds
from dpproxy.sql.folding import fold_constants
from dpproxy.sql.names import qualify_names
from dpproxy.sql.public import backend_sql
from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.released import ReleasedQuery, released_query, split_released
from dpproxy.sql.types import SQLGLOT_SCHEMA_TYPE, PgType

# How a released column is held while the outer query runs: as the public queries' schema types it,
# but numeric in DOUBLE (a noisy sum beyond 10^29 or with more than 9 decimals would not fit the
# schema's DECIMAL(38, 9)), like the released values' floats; an untyped text as VARCHAR.
_DUCKDB_TYPES = {**SQLGLOT_SCHEMA_TYPE, PgType.NUMERIC: "DOUBLE", PgType.UNKNOWN: "VARCHAR"}


@dataclass(frozen=True)
class ReleasedPlan:
    """The plan of a query over released rows: the plan of the private aggregate at the bottom, and
    the statement's outer query (whose `layers` are the outer queries to run over its answer)."""

    private: Plan
    query: ReleasedQuery


def post_process_released(plan: ReleasedPlan, answer: Result) -> Result:
    """The statement's answer from the private aggregate's `answer`: each outer query in turn over
    the previous one's rows. Cost, budget and notes stay the aggregate's; a column the outer query
    passes through unchanged keeps its ±, any other has none."""
    columns, rows = answer.columns, answer.rows
    for query in plan.query.layers():
        rows = run_over_rows(query, rows)
        columns = tuple(
            dataclasses.replace(columns[source], name=output.name, type=output.type)
            if source is not None
            else ResultColumn(output.name, output.type)
            for output, source in zip(query.outputs, query.passed, strict=True)
        )
    note = (
        "the window functions were computed from the released groups, at no further cost"
        if plan.query.lifted
        else f"the outer query was computed from the released rows of subquery {plan.query.name}, "
        "at no further cost"
    )
    return dataclasses.replace(answer, columns=columns, rows=rows, notes=(*answer.notes, note))


def run_over_rows(
    query: ReleasedQuery, rows: Sequence[Sequence[object]], *, charged: bool = True
) -> list[tuple]:
    """The outer query's rows over `rows` (the inner answer's, in its columns' order); with `charged`
    False, when the statement is analysed and `rows` is ignored, over no rows and then over one row
    of NULLs, so an outer query DuckDB cannot bind, or whose constants fail, is refused before
    anything is read or charged."""
    conn = _connection()
    try:
        table = _quoted(query.name)
        columns = ", ".join(f"{_quoted(c.name)} {_DUCKDB_TYPES[c.type]}" for c in query.columns)
        conn.execute(f"CREATE TEMPORARY TABLE {table} ({columns})")
        marks = ", ".join("?" for _ in query.columns)
        sql = backend_sql(_total_division(query.outer), "duckdb")
        try:
            if not charged:
                # Bound and typed on no data, then run over one row of NULLs: DuckDB evaluates an
                # expression of constants only per row (concat('-0', CAST(32767 AS smallint) +
                # CAST(1 AS smallint)) in a WHERE overflowed over the released rows, after the
                # charge, not over none).
                conn.execute(sql).fetchall()
                rows = [tuple(None for _ in query.columns)]
            if rows:
                conn.executemany(f"INSERT INTO {table} VALUES ({marks})", [_plain(row) for row in rows])
            return [tuple(row) for row in conn.execute(sql).fetchall()]
        except duckdb.Error as error:
            raise InvalidParameter(
                f"the query over the answer of {query.source} failed: {str(error).splitlines()[0]}",
                hint="the answer was released and charged; compute the rest in your client"
                if charged
                else "nothing was read or charged; write the outer query with explicit casts",
            ) from None
    finally:
        conn.close()


def _total_division(tree: exp.Expression) -> exp.Expression:
    """`tree` with every divisor x of `/`, `%`, mod() and div() read as NULLIF(x, 0): over released
    values a division by zero gives NULL (README), as the engine's own post-processing computes it.
    DuckDB would raise, or divide integers in double precision to an infinity that then fails the
    cast back to an integer (a noisy COUNT of 0 as a divisor, found by a long language run)."""
    tree = tree.copy()
    for node in list(tree.find_all(exp.Div, exp.Mod, exp.IntDiv)):
        divisor = node.expression
        guarded = exp.Nullif(this=divisor.copy(), expression=exp.Literal.number(0))
        guarded.type = divisor.type  # the divisor's type: a quotient of integers stays integer division
        node.set("expression", guarded)
    return tree


_DATABASE: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (pid, connection)
_DATABASE_LOCK = threading.Lock()


def _connection() -> duckdb.DuckDBPyConnection:
    """A new connection (a cursor) to this process's in-memory database for outer queries, opened
    once per process (a worker forked from the supervisor opens its own) with external access off and
    its configuration locked; its main schema stays empty, every row lives in a cursor's temporary
    table."""
    global _DATABASE
    with _DATABASE_LOCK:
        if _DATABASE is None or _DATABASE[0] != os.getpid():
            conn = duckdb.connect(":memory:", config={"enable_external_access": False, "threads": 1})
            conn.execute("SET lock_configuration = true")
            _DATABASE = (os.getpid(), conn)
        return _DATABASE[1].cursor()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _plain(row: Sequence[object]) -> list[object]:
    return [float(v) if isinstance(v, Decimal) else v for v in row]


def analyze_released(
    engine: EngineLike, tree: exp.Expression, refused: DPProxyError, *, answer: bool
) -> ReleasedQuery | None:
    """`tree` (refused as one private query: `refused`) as a query over the answer of the private
    aggregate in its FROM, or None when it is not one. The inner aggregate is analysed as a statement
    of its own: its refusal, if any, is the one the analyst sees, as it names what they wrote."""
    units = {t.privacy_unit.lower() for t in engine.policy.tables if t.privacy_unit}
    split = split_released(fold_constants(qualify_names(tree, engine.policy, engine.database)), units)
    if split is None:
        return None
    inner = engine.analyze_tree(split.inner, answer=answer)
    if not isinstance(inner, (PrivateQuery, ReleasedQuery)):
        return None  # an aggregate of public tables only: the refusal stands
    query = released_query(split, inner, tree.sql("postgres"))
    run_over_rows(query, [], charged=False)  # binds, types and runs it on no data
    return query


def plan_released(
    engine: EngineLike, query: ReleasedQuery, epsilon: float, bounds: SessionBounds | None
) -> ReleasedPlan:
    """The plan of a query over released rows: its private aggregate planned as if sent alone."""
    private = engine.plan_private(query.private, epsilon, salt=engine.new_salt(), bounds=bounds)
    return ReleasedPlan(private, query)
