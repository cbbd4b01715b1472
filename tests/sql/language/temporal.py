"""The language's dates and times relative to now(), MIN/MAX of dates, FILTER and existence probes:
the constructs of issue 20 (B4, B5, B8) the generator of grammar.py writes, from the SQL the tools
send (Metabase's "previous 30 days", dbt's source freshness, Django's .exists() and Max()).

`CLOCK` is the instant now() gives every generated statement (test_language sets it for a batch),
inside the declared ranges of the schema's date and time columns, so relative filters cut the
generated rows and every backend and every cache path sees the same constants."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from dpproxy.sql.clock import Clock

if TYPE_CHECKING:
    from tests.sql.language.grammar import QueryGenerator

CLOCK = Clock(dt.datetime(2023, 6, 15, 12, 34, 56, 789012, tzinfo=dt.UTC))

DATE_RELATIVE = (
    "current_date",
    "CAST(now() AS date)",
    "(current_date - 30)",
    "(CURRENT_DATE + 7)",
    "CAST((NOW() + INTERVAL '-30 day') AS date)",
    "(current_date - INTERVAL '1 month')",
    "date_trunc('month', current_date)",
    # Ibis: ibis.now().date() - ibis.interval(days=365), ibis.date(2024, 1, 1).
    "(DATE(CURRENT_TIMESTAMP) - INTERVAL '365 DAY')",
    "MAKE_DATE(2023, 1, 1)",
)
TS_RELATIVE = (
    "localtimestamp",
    "(localtimestamp(0) - INTERVAL '2 hours 30 minutes')",
    "CAST(now() AS timestamp)",
    "(current_date - INTERVAL '1 year')",
)
TSTZ_RELATIVE = (
    "now()",
    "current_timestamp",
    "transaction_timestamp()",
    "(NOW() + INTERVAL '-30 day')",
    "(now() - interval '7 days')",
    "date_trunc('month', now())",
    "(date_trunc('day', now()) - INTERVAL '1 mon')",
    "current_timestamp(0)",
)
RELATIVE = {"date": DATE_RELATIVE, "ts": TS_RELATIVE, "tstz": TSTZ_RELATIVE}


def relative(generator: QueryGenerator, kind: str) -> str:
    """A date, timestamp or timestamptz computed from now()."""
    return generator.pick(RELATIVE[kind])


def temporal_aggregate(generator: QueryGenerator) -> str | None:
    """MIN, MAX or percentile_disc of a date or time column of the scope (with a declared range or,
    birth, without: refused, naming the column), or of its cast between date and timestamp, None
    when the scope has none."""
    found = generator.columns(("date", "ts", "tstz"))
    if not found:
        return None
    source, picked = generator.pick(found)
    column = generator.reference(source, picked)
    if generator.chance(0.2):
        # A cast between date and timestamp keeps the order (dbt's freshness: max(d::timestamp));
        # to or from timestamptz it depends on the session's time zone (refused alike everywhere).
        target = {"date": "timestamp", "ts": "date", "tstz": "timestamp"}[picked.kind]
        column = generator.pick((f"CAST({column} AS {target})", f"{column}::{target}"))
    if generator.chance(0.25):
        fraction = generator.pick(("0.5", "0.1", "1"))
        return f"percentile_disc({fraction}) WITHIN GROUP (ORDER BY {column})"
    return f"{generator.pick(('MIN', 'MAX', 'max', 'min'))}({column})"


def filtered(generator: QueryGenerator, aggregate: str) -> str:
    """An aggregate with FILTER (WHERE …): COUNT(*), one the grammar wrote, or MIN/MAX of a date."""
    if generator.chance(0.3):
        aggregate = "COUNT(*)"
    elif generator.chance(0.2):
        aggregate = temporal_aggregate(generator) or aggregate
    condition = (relative_filter(generator) if generator.chance(0.3) else None) or generator.expr("bool")
    return f"{aggregate} FILTER (WHERE {condition})"


def relative_filter(generator: QueryGenerator) -> str | None:
    """A date or time column of the scope compared with a value relative to now() (Metabase's
    "previous 30 days", dbt's freshness windows), None when the scope has none."""
    found = generator.columns(("date", "ts", "tstz"))
    if not found:
        return None
    source, column = generator.pick(found)
    name = generator.reference(source, column)
    if generator.chance(0.3):
        return f"{name} >= {relative(generator, 'date')} AND {name} < CAST(NOW() AS date)"
    operator = generator.pick((">=", "<", ">", "<=", "="))
    return f"{name} {operator} {relative(generator, generator.pick((column.kind, column.kind, 'date')))}"


def existence_probe(generator: QueryGenerator, table: str) -> str:
    """`SELECT <constants> FROM t [WHERE …] LIMIT 1`: Great Expectations, Django's .exists()."""
    items = generator.pick(("1", '1 AS "a"', "1, 'x', NULL", "TRUE AS _", "CAST(1 AS bigint)"))
    where = ""
    if generator.chance(0.6):
        where = f" WHERE {generator.expr('bool')}"
    tail = generator.pick((" LIMIT 1", " LIMIT 1", " LIMIT 1 OFFSET 0", " LIMIT 2", " LIMIT 1 OFFSET 1"))
    return f"SELECT {items} FROM {table}{where}{tail}"
