"""A generator of SQL over the language's schema: what an analyst — or an attacker — could write.

`generate(seed, index)` gives one statement (and its parameters), deterministically from the seed
and index, so a failure is reproduced by its two numbers. The grammar is wider than what dpproxy
accepts on purpose: joins of every kind in both orders, self-joins, comma joins, table functions,
TABLESAMPLE; subqueries as IN / EXISTS / scalar / FROM / CTE, correlated or not, over public and
protected tables, in every clause; row expressions with partial functions (division, casts,
substring with negative starts, overflow), NULLs and odd literals, dates relative to now();
every aggregate (MIN/MAX of dates and of their casts too), FILTER, window functions (over rows, and
over the aggregates of their SELECT: `with_window`), aggregates of aggregates; GROUP BY positions and
aliases, HAVING, ORDER BY, LIMIT/OFFSET (or FETCH FIRST) and parameters; existence
probes (`SELECT 1 FROM t LIMIT 1`; tests/sql/language/temporal.py); the tools' wrappings of a
statement (a SQL editor's LIMIT, connectorx's count, Ibis' CTE, dbt's generic test two levels deep). One statement in ten (NOTES_SHARE) reads
`visit_notes`, whose person is reached through its visit (a foreign key): alone, joined with visits
on visit_id or on the person, visits LEFT JOIN visit_notes, with patients, in FROM-subqueries and
on other keys; whether a statement does is drawn apart from the rest, so the other statements are
the ones the batch had before the table. The harness decides what must hold for each: refused with a
documented SQLSTATE, or accepted and then sound.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from decimal import Decimal

import sqlglot
from sqlglot import exp

from tests.sql.language.temporal import (
    existence_probe,
    filtered,
    relative,
    relative_filter,
    temporal_aggregate,
)

NUMBER = ("int", "num", "float")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # int, num, float, text, bool, date, ts
    unit: bool = False


@dataclass(frozen=True)
class Source:
    alias: str | None  # how the query qualifies it (None: by its table name, unaliased)
    table: str  # the table, or the subquery's alias
    columns: tuple[Column, ...]
    protected: bool

    @property
    def qualifier(self) -> str:
        return self.alias or self.table


PATIENTS = (
    Column("patient_id", "int", unit=True),
    Column("age", "int"),
    Column("income", "num"),
    Column("score", "float"),
    Column("zip", "text"),
    Column("diagnosis", "text"),
    Column("birth", "date"),
    Column("smoker", "bool"),
    Column("seen", "ts"),
)
VISITS = (
    Column("visit_id", "int"),
    Column("patient_id", "int", unit=True),
    Column("cost", "num"),
    Column("department", "text"),
    Column("visit_date", "date"),
    Column("duration", "int"),
    Column("temperature", "float"),
    Column("checked_in", "tstz"),
)
# The unit is not a column of the table: the rewrite exposes it, read through the note's visit.
VISIT_NOTES = (
    Column("note_id", "int"),
    Column("visit_id", "int"),
    Column("words", "int"),
    Column("topic", "text"),
    Column("flagged", "bool"),
    Column("patient_id", "int", unit=True),
)
SURVEY = (Column("answer", "text"), Column("rating", "int"))
ZIP_INFO = (Column("zip", "text"), Column("state", "text"), Column("population", "int"))
TABLE_COLUMNS = {
    "patients": PATIENTS,
    "visits": VISITS,
    "visit_notes": VISIT_NOTES,
    "survey": SURVEY,
    "zip_info": ZIP_INFO,
}
# The share of statements that read visit_notes.
NOTES_SHARE = 0.1

INT_LITERALS = (
    "0",
    "1",
    "2",
    "3",
    "-1",
    "10",
    "100",
    "120",
    "2147483647",
    "9223372036854775807",
    "99999999999",
)
DECIMAL_LITERALS = ("0.5", "1.25", "-2.5", "0.1", "100.005", "1e3", "1.5e-3", "123456789.123456789", "0.0")
TEXT_LITERALS = (
    "'flu'",
    "'CA'",
    "''",
    "'%'",
    "'9%'",
    "'o''hara'",
    "'LONELY'",
    "'é'",
    "'er'",
    "'yes'",
    "' flu '",
    "'NaN'",
    "'Infinity'",
    "'1e400'",
    "'-0'",
)
# Grafana's $__timeFilter writes RFC 3339 text ('2023-01-01T00:00:00Z'); Superset folds its time
# range into TO_DATE/TO_TIMESTAMP calls (both documented in tests/sql/test_bi_tools.py).
DATE_LITERALS = (
    "DATE '2023-06-01'",
    "'2023-06-01'",
    "'2023-01-01T00:00:00Z'",
    "CAST('2000-02-29' AS date)",
    "'1999-12-31'",
    "TO_DATE('2023-01-15', 'YYYY-MM-DD')",
    "'2023-01-01T23:30:00-05'",
)
TS_LITERALS = (
    "TIMESTAMP '2022-01-01 12:00:00'",
    "'2021-05-05 10:00:00'",
    "'2023-01-01T00:00:00Z'",
    "'2022-07-01T06:30:00.5Z'",
)
TSTZ_LITERALS = (
    "TIMESTAMPTZ '2023-02-01 12:00:00+00'",
    "'2023-03-01 00:00:00+02'",
    "'2023-01-01T00:00:00Z'",
    "TO_TIMESTAMP('2023-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')",
    "to_timestamp(1672531200)",
)


@dataclass
class Generated:
    sql: str
    params: list[object] = field(default_factory=list)
    seed: int = 0
    index: int = 0

    def __str__(self) -> str:
        params = f" params={self.params!r}" if self.params else ""
        return f"[seed {self.seed} #{self.index}] {self.sql}{params}"


class QueryGenerator:
    def __init__(self, rng: random.Random, notes: bool = False, spell: random.Random | None = None) -> None:
        self.rng = rng
        self.notes = notes  # the statement reads visit_notes (notes_from_clause)
        # How a tool spells what the statement already says (`tool_spelling`): a stream of its own,
        # so a statement keeps its structure whichever spelling it gets.
        self.spell = spell or random.Random(0)
        self.params: list[object] = []
        self.scope: list[Source] = []
        self.depth = 0

    # -- helpers -----------------------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, options):
        return self.rng.choice(options)

    def parameter(self, value: object) -> str:
        self.params.append(value)
        return f"${len(self.params)}"

    def columns(
        self, kinds: tuple[str, ...] | str, scope: list[Source] | None = None
    ) -> list[tuple[Source, Column]]:
        kinds = (kinds,) if isinstance(kinds, str) else kinds
        return [(s, c) for s in (scope or self.scope) for c in s.columns if c.kind in kinds]

    def reference(self, source: Source, column: Column, scope: list[Source] | None = None) -> str:
        scope = scope or self.scope
        unique = sum(1 for s in scope for c in s.columns if c.name == column.name) == 1
        if unique and self.chance(0.4):
            return column.name
        if source.alias is None and source.table in TABLE_COLUMNS and self.chance(0.15):
            # schema.table.column, as Metabase and SQLAlchemy (schema='public') write every column.
            if self.chance(0.5):
                return f'"public"."{source.table}"."{column.name}"'
            return f"public.{source.table}.{column.name}"
        if self.chance(0.05):
            return f'"{source.qualifier}"."{column.name}"'
        return f"{source.qualifier}.{column.name}"

    def column(self, kinds: tuple[str, ...] | str, *, allow_unit: bool = False) -> str | None:
        found = [(s, c) for s, c in self.columns(kinds) if allow_unit or not c.unit or self.chance(0.05)]
        if not found:
            return None
        return self.reference(*self.pick(found))

    # -- literals ----------------------------------------------------------------------------------

    def literal(self, kind: str) -> str:
        if kind == "int":
            if self.chance(0.08):
                return self.parameter(self.pick((0, 1, 5, -3, 40)))
            return self.pick(INT_LITERALS[:8] if self.chance(0.85) else INT_LITERALS)
        if kind in ("num", "float"):
            if self.chance(0.08):
                return self.parameter(self.pick((Decimal("0.5"), Decimal("-1.25"), 2.5)))
            return self.pick(DECIMAL_LITERALS)
        if kind == "text":
            if self.chance(0.08):
                return self.parameter(self.pick(("flu", "CA", "", "er")))
            return self.pick(TEXT_LITERALS)
        if kind == "bool":
            return self.pick(("TRUE", "FALSE", "NULL"))
        if kind == "date":
            if self.chance(0.08):
                return self.parameter(dt.date(2023, 3, 1))
            return self.pick(DATE_LITERALS)
        if kind == "ts":
            return self.pick(TS_LITERALS)
        if kind == "tstz":
            return self.pick(TSTZ_LITERALS)
        return "NULL"

    # -- the tools' spellings ----------------------------------------------------------------------

    def spelled(self, p: float) -> bool:
        """Whether this construct takes a tool's spelling (drawn from the spelling stream only)."""
        return self.spell.random() < p

    def unit(self, unit: str) -> str:
        """A date_trunc unit or date_part field: a constant, or a bound parameter as psycopg and
        asyncpg send it (`$n`), or cast to text as SQLAlchemy writes every string bind."""
        roll = self.spell.random()
        if roll < 0.75:
            return f"'{unit}'"
        self.params.append(unit)
        slot = f"${len(self.params)}"
        return slot if roll < 0.9 else f"CAST({slot} AS VARCHAR)"

    def any_list(self, listed: list[str]) -> str:
        """An IN list as `ARRAY[…]`, or as one parameter holding the list (psycopg's `= ANY(%s)`) when
        every item is a plain literal."""
        values: list[object] = []
        for item in listed:
            if item.lstrip("-").isdigit() and abs(int(item)) < 2**31:
                values.append(int(item))
            elif len(item) >= 2 and item[0] == item[-1] == "'" and "'" not in item[1:-1] and "\\" not in item:
                values.append(item[1:-1])
            else:
                return f"ARRAY[{', '.join(listed)}]"
        if len({type(v) for v in values}) != 1 or self.spell.random() < 0.5:
            return f"ARRAY[{', '.join(listed)}]"
        self.params.append(values)
        return f"${len(self.params)}"

    # -- row expressions ---------------------------------------------------------------------------

    def expr(self, kind: str) -> str:
        """A row-level expression of `kind` ('number' for any number kind)."""
        self.depth += 1
        try:
            if self.depth > 3 or self.chance(0.35):
                return self.leaf(kind)
            if kind in ("number", *NUMBER):
                return self.number()
            return {
                "text": self.text,
                "bool": self.boolean,
                "date": self.date,
                "ts": self.timestamp,
                "tstz": self.timestamptz,
            }[kind]()
        finally:
            self.depth -= 1

    def leaf(self, kind: str) -> str:
        kinds = NUMBER if kind == "number" else (kind,)
        if self.chance(0.75):
            column = self.column(kinds)
            if column is not None:
                return column
        if self.chance(0.05):
            return "NULL"
        return self.literal(self.pick(kinds))

    def number(self) -> str:
        n = self.pick(range(22))
        x = lambda: self.expr("number")  # noqa: E731
        if n <= 4:
            op = self.pick(("+", "-", "*", "/", "%"))
            return f"({x()} {op} {x()})"
        if n == 5:
            return f"abs({x()})"
        if n == 6:
            return (
                f"round({x()})" if self.chance(0.5) else f"round({x()}, {self.pick(('0', '1', '2', '-1'))})"
            )
        if n == 7:
            return f"{self.pick(('floor', 'ceil', 'ceiling', 'sign'))}({x()})"
        if n == 8:
            return f"{self.pick(('greatest', 'least', 'coalesce', 'nullif'))}({x()}, {x()})"
        if n == 9:
            return f"CASE WHEN {self.expr('bool')} THEN {x()} ELSE {x()} END"
        if n == 10:
            target = self.pick(
                (
                    "int",
                    "integer",
                    "bigint",
                    "smallint",
                    "numeric",
                    "numeric(10, 2)",
                    "numeric(4, 1)",
                    "double precision",
                    "real",
                    "float8",
                )
            )
            source = self.expr(self.pick(("number", "number", "text", "bool")))
            return (
                f"CAST({source} AS {target})" if self.chance(0.7) else f"({source})::{target.split('(')[0]}"
            )
        if n == 11:
            return f"length({self.expr('text')})" if self.chance(0.7) else f"strpos({self.expr('text')}, 'a')"
        if n == 12:
            field = self.pick(("year", "month", "dow", "doy", "quarter", "epoch", "hour", "week"))
            source = self.expr(self.pick(("date", "ts", "tstz")))
            if self.chance(0.25):
                # Grafana's $__timeGroup(t, '1h'): floor(extract(epoch from t)/3600)*3600.
                seconds = self.pick(("60", "3600", "86400", "0.5"))
                return f"floor(extract(epoch from {source})/{seconds})*{seconds}"
            if field == "dow" and self.spelled(0.5):
                # Ibis's .day_of_week.index(): Monday 0 … Sunday 6.
                return f"(CAST(EXTRACT('dow' FROM {source}) + 6 AS SMALLINT) % 7)"
            if self.spelled(0.1):
                # SQLAlchemy over psycopg: the field a bound parameter cast to text.
                return f"date_part({self.unit(field)}, {source})"
            return (
                f"extract({field} FROM {source})" if self.chance(0.7) else f"date_part('{field}', {source})"
            )
        if n == 13:
            return self.scalar_subquery()
        if n == 14 and self.chance(0.3):
            hostile = self.pick(
                ("sqrt", "ln", "exp", "power", "mod", "div", "random", "width_bucket", "trunc")
            )
            if hostile == "random":
                return "random()"
            if hostile in ("power", "mod", "div"):
                return f"{hostile}({x()}, {x()})"
            if hostile == "width_bucket":
                return f"width_bucket({x()}, 0, 100, 10)"
            return f"{hostile}({x()})"
        if n == 15:
            negated = x()
            # "--" would start a comment: -(-1), not --1.
            return f"-({negated})" if negated.startswith("-") else f"-{negated}"
        if n == 16 and self.chance(0.2):
            return f"({x()} ^ 2)"
        if n == 17 and self.chance(0.4):
            # Constants at the edges of their types: arithmetic on them must not overflow anywhere.
            return self.pick(
                (
                    "CAST(32767 AS smallint) + CAST(1 AS smallint)",
                    "(2147483647 * 2)",
                    "abs(-2147483648)",
                    "(-9223372036854775807 - 1)",
                    "CAST(-32768 AS smallint) / CAST(-1 AS smallint)",
                    f"CAST({self.pick(('32767', '-32768', '2147483647'))} AS smallint)",
                )
            )
        if n == 18 and self.chance(0.4):
            # Values equal but spelled differently (-0.0 and 0.0; numeric 30 and 30.00).
            return self.pick(
                (
                    f"CAST(ceil((CASE WHEN {self.expr('bool')} THEN -1 ELSE 0 END) / 2.0) AS double precision)",
                    f"(CASE WHEN {self.expr('bool')} THEN 30 ELSE {self.column('num') or '30.00'} END)",
                    f"(-0.0 * {x()})",
                )
            )
        return self.leaf("number")

    def text(self) -> str:
        n = self.pick(range(16))
        t = lambda: self.expr("text")  # noqa: E731
        if n == 0:
            return f"{self.pick(('lower', 'upper', 'initcap', 'trim', 'ltrim', 'rtrim', 'btrim'))}({t()})"
        if n == 1:
            start = self.pick(("1", "2", "0", "-1", "-3", "5", "2147483647", "-2147483648"))
            if self.chance(0.5):
                return f"substring({t()}, {start})"
            length = self.pick(("1", "2", "3", "0", "-1"))
            if self.chance(0.3):
                text = t()
                if self.spelled(0.6):
                    # Ibis's .substr(s, n): a 0-based start turned into PostgreSQL's position.
                    zero = int(start) - 1
                    return (
                        f"substring({text} FROM CASE WHEN ({zero} + 1) >= 1 THEN {zero} + 1 "
                        f"ELSE {zero} + 1 + length({text}) END FOR {length})"
                    )
                return f"substring({text} FROM {start} FOR {length})"
            return f"substring({t()}, {start}, {length})"
        if n == 2:
            count = self.pick(
                ("1", "2", "0", "-1", "-2", "5", "2147483647", "-2147483648", "9223372036854775807")
            )
            return f"{self.pick(('left', 'right'))}({t()}, {count})"
        if n == 3:
            return f"concat({t()}, {self.expr(self.pick(('text', 'number', 'date', 'bool', 'ts', 'tstz')))})"
        if n == 4:
            return f"({t()} || {self.expr(self.pick(('text', 'number', 'text')))})"
        if n == 5:
            return f"replace({t()}, 'a', 'b')"
        if n == 6:
            source = self.expr(self.pick(("number", "date", "bool", "ts", "text", "tstz")))
            return f"CAST({source} AS {self.pick(('text', 'varchar', 'varchar(3)', 'char(2)'))})"
        if n == 7:
            return f"coalesce({t()}, {t()})" if self.chance(0.5) else f"nullif({t()}, {t()})"
        if n == 8:
            return f"CASE WHEN {self.expr('bool')} THEN {t()} ELSE {t()} END"
        if n == 9 and self.chance(0.3):
            hostile = self.pick(
                ("md5", "repeat", "lpad", "split_part", "to_char", "reverse", "regexp_replace")
            )
            if hostile == "repeat":
                return f"repeat({t()}, 1000000)"
            if hostile == "lpad":
                return f"lpad({t()}, 3, 'x')"
            if hostile == "split_part":
                return f"split_part({t()}, 'a', 1)"
            if hostile == "to_char":
                # Ibis's .strftime: the numeric fields with separators are read; others refused.
                pattern = self.spell.choice(
                    ("YYYY", "YYYY-MM", "YYYY-MM-DD", "HH24:MI", "YYYY/MM/DD HH24", "DD.MM.YYYY", "Mon YYYY")
                )
                return f"to_char({self.expr('date')}, '{pattern}')"
            if hostile == "regexp_replace":
                return f"regexp_replace({t()}, 'a+', 'b')"
            return f"{hostile}({t()})"
        if n == 10:
            return f"CASE {t()} WHEN 'flu' THEN 'f' WHEN 'cold' THEN 'c' ELSE {t()} END"
        return self.leaf("text")

    def boolean(self) -> str:
        n = self.pick(range(20))
        b = lambda: self.expr("bool")  # noqa: E731
        if n <= 4:
            kind = self.pick(("number", "number", "text", "date", "ts", "bool", "tstz"))
            op = self.pick(
                ("=", "<>", "<", "<=", ">", ">=", "!=", "IS DISTINCT FROM", "IS NOT DISTINCT FROM")
            )
            return f"{self.expr(kind)} {op} {self.expr(kind)}"
        if n == 5:
            return f"({b()} {self.pick(('AND', 'OR'))} {b()})"
        if n == 6:
            return f"NOT {b()}"
        if n == 7:
            kind = self.pick(("number", "text", "date", "bool"))
            return f"{self.expr(kind)} IS {self.pick(('NULL', 'NOT NULL'))}"
        if n == 8:
            kind = self.pick(("number", "text"))
            listed = [
                self.literal("int" if kind == "number" else "text") for _ in range(self.pick((1, 2, 3)))
            ]
            left, negated = self.expr(kind), self.pick(("IN", "NOT IN")) == "NOT IN"
            if not negated and self.spelled(0.5):
                return f"{left} = ANY({self.any_list(listed)})"
            return f"{left} {'NOT IN' if negated else 'IN'} ({', '.join(listed)})"
        if n == 9:
            return self.in_subquery()
        if n == 10:
            return self.exists_subquery()
        if n == 11:
            kind = self.pick(("number", "date", "text"))
            return f"{self.expr(kind)} {self.pick(('BETWEEN', 'NOT BETWEEN'))} {self.literal(self.pick(NUMBER) if kind == 'number' else kind)} AND {self.literal(self.pick(NUMBER) if kind == 'number' else kind)}"
        if n == 12:
            pattern = self.pick(("'9%'", "'%a%'", "'_'", "'%'", "'flu'", "'%\\%'", "'a\\'"))
            text, op = self.expr("text"), self.pick(("LIKE", "ILIKE", "NOT LIKE"))
            if op == "LIKE" and pattern == "'9%'" and self.spelled(0.8):
                return f"starts_with({text}, '9')"  # Ibis's .startswith
            return f"{text} {op} {pattern}"
        if n == 13 and self.chance(0.3):
            hostile = self.pick(("~ 'a+'", "SIMILAR TO 'a%'", "= ANY(ARRAY['flu', 'cold'])", "IS TRUE"))
            kind = "bool" if hostile == "IS TRUE" else "text"
            return f"{self.expr(kind)} {hostile}"
        if n == 14 and self.chance(0.2):
            return f"{self.expr('number')} > {self.pick(('ALL', 'ANY'))} (SELECT population FROM zip_info)"
        return self.leaf("bool")

    def date(self) -> str:
        n = self.pick(range(8))
        if n == 0:
            unit = self.pick(("month", "year", "week", "day", "quarter", "hour", "decade"))
            return f"date_trunc({self.unit(unit)}, {self.expr(self.pick(('date', 'ts')))})"
        if n == 1:
            source = self.expr("ts")
            # Ibis's .date() sends date(x), which PostgreSQL reads as the cast.
            return f"date({source})" if self.spelled(0.5) else f"CAST({source} AS date)"
        if n == 2:
            step = self.pick(("1", "INTERVAL '1 day'"))
            return f"({self.expr('date')} + {step})"
        if n == 3:
            return relative(self, "date") if self.chance(0.8) else "now()"
        return self.leaf("date")

    def timestamp(self) -> str:
        roll = self.rng.random()
        if roll < 0.3:
            return f"CAST({self.expr(self.pick(('date', 'tstz')))} AS timestamp)"
        if roll < 0.4:
            return relative(self, "ts")
        return self.leaf("ts")

    def timestamptz(self) -> str:
        roll = self.rng.random()
        if roll < 0.2:
            return f"CAST({self.expr(self.pick(('date', 'ts')))} AS timestamptz)"
        if roll < 0.35:
            return f"date_trunc('{self.pick(('day', 'month', 'hour'))}', {self.leaf('tstz')})"
        if roll < 0.45:
            return relative(self, "tstz")
        return self.leaf("tstz")

    # -- subqueries in expressions -----------------------------------------------------------------

    def _inner_table(self) -> tuple[str, tuple[Column, ...], str]:
        protected = ("patients", "visits", "visit_notes") if self.notes else ("patients", "visits")
        table = "zip_info" if self.chance(0.8) else self.pick(protected)
        return table, TABLE_COLUMNS[table], self.pick(("z2", "zz", "q"))

    def _inner_condition(self, alias: str, columns: tuple[Column, ...]) -> str:
        """A WHERE for a subquery: on its own columns, or correlated with the outer query (qualified, or
        unqualified names the inner table lacks, which SQL binds to the outer row)."""
        inner = Source(alias, alias, columns, False)
        roll = self.rng.random()
        if roll < 0.4:
            column = self.pick(columns)
            return f"{alias}.{column.name} {self.pick(('=', '<>', '>'))} {self.literal(column.kind if column.kind in NUMBER or column.kind == 'text' else 'text')}"
        outer = [(s, c) for s in self.scope for c in s.columns]
        if roll < 0.7 and outer:
            source, column = self.pick(outer)
            same = [c for c in columns if c.kind == column.kind] or [columns[0]]
            return f"{alias}.{self.pick(same).name} = {source.qualifier}.{column.name}"
        if outer:
            # The attack: a column the inner table does not have binds to the outer protected row.
            numbers = [
                c
                for s in self.scope
                for c in s.columns
                if c.kind in NUMBER and c.name not in {x.name for x in columns}
            ]
            if numbers:
                column = self.pick(numbers)
                partial = self.pick(
                    (f"1 / ({column.name} - 42)", f"CAST({column.name} AS smallint)", f"{column.name}")
                )
                return f"{partial} > 0"
        return f"{alias}.{columns[0].name} IS NOT NULL"
        del inner  # pragma: no cover

    def _inner_where(self, alias: str, columns: tuple[Column, ...]) -> str:
        condition = self._inner_condition(alias, columns)
        if self.chance(0.3):
            condition = f"({condition} {self.pick(('AND', 'OR'))} {self._inner_condition(alias, columns)})"
        return f" WHERE {condition}"

    def in_subquery(self) -> str:
        table, columns, alias = self._inner_table()
        text_columns = [c for c in columns if c.kind == "text"] or list(columns)
        selected = self.pick(text_columns)
        where = self._inner_where(alias, columns) if self.chance(0.8) else ""
        if self.chance(0.15):
            where += f" GROUP BY {alias}.{selected.name} HAVING COUNT(*) {self.pick(('>', '<='))} 1"
        elif self.chance(0.1):
            where += f" ORDER BY {alias}.{selected.name} LIMIT {self.pick(('1', '2', '0'))}"
        outer = self.column("text") or self.literal("text")
        negate = "NOT " if self.chance(0.2) else ""
        return f"{outer} {negate}IN (SELECT {alias}.{selected.name} FROM {table} {alias}{where})"

    def exists_subquery(self) -> str:
        table, columns, alias = self._inner_table()
        where = self._inner_where(alias, columns) if self.chance(0.8) else ""
        return f"{'NOT ' if self.chance(0.2) else ''}EXISTS (SELECT 1 FROM {table} {alias}{where})"

    def scalar_subquery(self) -> str:
        table, columns, alias = self._inner_table()
        numbers = [c for c in columns if c.kind in NUMBER] or [columns[0]]
        column = self.pick(numbers)
        selected = self.pick(
            (
                f"MAX({alias}.{column.name})",
                "COUNT(*)",
                f"{alias}.{column.name}",
                f"MIN({alias}.{column.name})",
            )
        )
        where = self._inner_where(alias, columns) if self.chance(0.6) else ""
        return f"(SELECT {selected} FROM {table} {alias}{where})"

    # -- FROM --------------------------------------------------------------------------------------

    def table_source(self, table: str, alias: str | None) -> tuple[str, Source]:
        columns = TABLE_COLUMNS[table]
        written = self.pick((table, table, table, f"public.{table}", f'"{table}"'))
        text = f"{written} {alias}" if alias else written
        if self.chance(0.1) and alias:
            text = f"{written} AS {alias}"
        return text, Source(alias, table, columns, table != "zip_info")

    def derived_source(self, alias: str) -> tuple[str, Source, str | None]:
        """A FROM-subquery: row-level, per person, public, or grouped by something else. Returns the
        text, the source, and the body for a CTE of the same name."""
        # A statement reading visit_notes reads it here, row-level or per person.
        roll = self.rng.random() * (0.7 if self.notes else 1)
        if roll < 0.35:
            table = "visit_notes" if self.notes else self.pick(("patients", "visits"))
            columns = TABLE_COLUMNS[table]
            saved, self.scope = self.scope, [Source(None, table, columns, True)]
            chosen = [c for c in columns if c.unit or self.chance(0.5)]
            outputs: list[Column] = []
            items = []
            for c in chosen:
                items.append(c.name)
                outputs.append(c)
            if self.chance(0.6):
                items.append(f"{self.expr('number')} AS computed")
                outputs.append(Column("computed", "num"))
            where = f" WHERE {self.expr('bool')}" if self.chance(0.5) else ""
            self.scope = saved
            body = f"SELECT {', '.join(items)} FROM {table}{where}"
            return f"({body}) {alias}", Source(alias, alias, tuple(outputs), True), body
        if roll < 0.7:
            table = "visit_notes" if self.notes else self.pick(("visits", "patients"))
            numbers = [c.name for c in TABLE_COLUMNS[table] if c.kind in NUMBER and not c.unit]
            value = self.pick(numbers)
            aggs = [
                ("n", "COUNT(*)", "int"),
                ("total", f"SUM({value})", "num"),
                ("mean", f"AVG({value})", "num"),
                ("top", f"MAX({value})", "num"),
                ("low", f"MIN({value})", "num"),
            ]
            chosen = [a for a in aggs if self.chance(0.5)] or [aggs[0]]
            others = ("topic", "visit_id") if table == "visit_notes" else ("zip", "department")
            key = "patient_id" if self.chance(0.9) else self.pick((*others, "patient_id, " + value))
            where = f" WHERE {value} > {self.literal('int')}" if self.chance(0.3) else ""
            items = ", ".join(f"{sql} AS {name}" for name, sql, _ in chosen)
            having = ""
            if key == "patient_id" and self.chance(0.3):
                # A person's row kept or not by their own aggregates (and unit), perhaps none shown.
                tests = [
                    f"COUNT(*) > {self.rng.randint(0, 4)}",
                    f"SUM({value}) >= {self.literal('int')}",
                    f"AVG({self.pick(numbers)}) < {self.literal('int')}",
                    f"MAX({value}) IS NOT NULL",
                    f"COUNT(*) FILTER (WHERE {value} > {self.literal('int')}) > 0",
                    f"patient_id % 2 = {self.rng.randint(0, 1)}",
                ]
                picked = [t for t in tests if self.chance(0.35)] or [tests[0]]
                having = " HAVING " + self.pick((" AND ", " OR ")).join(picked)
            body = f"SELECT {key.split(',')[0]}, {items} FROM {table}{where} GROUP BY {key}{having}"
            columns = (Column("patient_id", "int", unit=True), *(Column(n, k) for n, _, k in chosen))
            return f"({body}) {alias}", Source(alias, alias, columns, True), body
        if roll < 0.9:
            where = (
                f" WHERE {self.pick(('state = ' + repr('CA'), 'population > 100', 'zip IS NOT NULL'))}"
                if self.chance(0.6)
                else ""
            )
            body = f"SELECT zip, state, population FROM zip_info{where}"
            return f"({body}) {alias}", Source(alias, alias, ZIP_INFO, False), body
        body = "SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip"
        return (
            f"({body}) {alias}",
            Source(alias, alias, (Column("zip", "text"), Column("n", "int")), True),
            body,
        )

    def from_clause(self) -> tuple[str, str]:
        """The FROM clause and a WITH prefix (possibly empty); fills self.scope."""
        if self.notes:
            return self.notes_from_clause()
        roll = self.rng.random()
        self.scope = []
        if roll < 0.3:
            table = self.pick(
                ("patients", "patients", "visits", "visits", "survey", "patients", "visits", "zip_info")
            )
            text, source = self.table_source(table, self.pick((None, table[0], "t")))
            self.scope = [source]
            if self.chance(0.05):
                text += self.pick((" TABLESAMPLE SYSTEM (50)", " TABLESAMPLE BERNOULLI (10)"))
            return text, ""
        if roll < 0.75:
            return self.joins(), ""
        if roll < 0.95:
            return self.derived_from(("patients", "visits", "zip_info"))
        # Hostile FROM items.
        hostile = self.pick(
            (
                "patients p CROSS JOIN generate_series(1, 3) g",
                "generate_series(1, 2) g JOIN patients p ON p.age = g",
                "patients p, visits v",
                "ONLY patients p",
                "LATERAL (SELECT age FROM patients) l",
                "(VALUES (1), (2)) vals(x) JOIN patients p ON p.age = vals.x",
                "patients p JOIN LATERAL (SELECT v.cost FROM visits v WHERE v.patient_id = p.patient_id) l ON TRUE",
                "pg_catalog.pg_stats",
                "unnest(ARRAY[1, 2]) u",
            )
        )
        self.scope = [Source("p", "patients", PATIENTS, True)]
        if "visits v" in hostile:
            self.scope.append(Source("v", "visits", VISITS, True))
        return hostile, ""

    def derived_from(self, others: tuple[str, ...]) -> tuple[str, str]:
        """A FROM-subquery (or a CTE of it), joined half the time to one of the tables `others`."""
        alias = self.pick(("s", "d", "sub"))
        text, source, body = self.derived_source(alias)
        with_prefix = ""
        if self.chance(0.5) and body is not None:
            with_prefix = f"WITH {alias} AS ({body}) "
            text = alias
        self.scope = [source]
        if self.chance(0.5):
            other, other_source = self.table_source(self.pick(others), "o")
            condition = self.join_condition(source, other_source)
            kind = self.pick(("JOIN", "LEFT JOIN", "JOIN", "RIGHT JOIN"))
            text = (
                f"{text} {kind} {other} ON {condition}"
                if self.chance(0.5)
                else f"{other} {kind} {text} ON {condition}"
            )
            self.scope.append(other_source)
        return text, with_prefix

    def notes_from_clause(self) -> tuple[str, str]:
        """The FROM clause of a statement reading visit_notes, whose person is reached through its
        visit: alone; joined with visits on visit_id (which joins a note to its visit's person) or on
        the person, visits LEFT JOIN visit_notes, with patients, with itself; a FROM-subquery over it;
        or joined on another key or without a condition (to be refused)."""
        roll = self.rng.random()
        self.scope = []
        if roll < 0.35:
            text, source = self.table_source("visit_notes", self.pick((None, "n", "t")))
            self.scope = [source]
            return text, ""
        if roll < 0.75:
            pattern = self.pick(
                (
                    ("visit_notes", "visits"),
                    ("visit_notes", "visits"),
                    ("visits", "visit_notes"),
                    ("visits", "visit_notes"),
                    ("visit_notes", "patients"),
                    ("patients", "visits", "visit_notes"),
                    ("visit_notes", "visits", "patients"),
                    ("visit_notes", "visit_notes"),
                )
            )
            return self.joins(pattern), ""
        if roll < 0.9:
            return self.derived_from(("visits", "visit_notes", "patients"))
        hostile = self.pick(
            (
                "visit_notes n, visits v",
                "visit_notes n JOIN visits v ON n.note_id = v.visit_id",
                "visit_notes n JOIN visits v ON n.visit_id = v.visit_id AND n.patient_id = v.patient_id",
                "visits v RIGHT JOIN visit_notes n ON v.visit_id = n.visit_id",
                "visit_notes n JOIN LATERAL (SELECT v.cost FROM visits v WHERE v.visit_id = n.visit_id) l ON TRUE",
                "visit_notes n JOIN visits v ON n.visit_id = v.visit_id JOIN patients p ON v.patient_id = p.patient_id",
            )
        )
        self.scope = [Source("n", "visit_notes", VISIT_NOTES, True)]
        if "visits v" in hostile:
            self.scope.append(Source("v", "visits", VISITS, True))
        if "patients p" in hostile:
            self.scope.append(Source("p", "patients", PATIENTS, True))
        return hostile, ""

    def join_condition(self, left: Source, right: Source) -> str:
        units = [(c, d) for c in left.columns for d in right.columns if c.unit and d.unit]
        shared_text = [(c, d) for c in left.columns for d in right.columns if c.name == d.name and not c.unit]
        # The reference's key: a note joined to its visit, which is a join on the person.
        on_reference = {left.table, right.table} == {"visits", "visit_notes"} and self.chance(0.6)
        roll = self.rng.random()
        if on_reference:
            condition = f"{left.qualifier}.visit_id = {right.qualifier}.visit_id"
        elif units and roll < 0.75:
            c, d = units[0]
            condition = f"{left.qualifier}.{c.name} = {right.qualifier}.{d.name}"
        elif shared_text and roll < 0.9:
            c, d = self.pick(shared_text)
            condition = f"{left.qualifier}.{c.name} = {right.qualifier}.{d.name}"
        else:
            a = self.pick([c for c in left.columns if c.kind in NUMBER] or list(left.columns))
            b = self.pick([c for c in right.columns if c.kind == a.kind] or list(right.columns))
            condition = f"{left.qualifier}.{a.name} {self.pick(('=', '<', '='))} {right.qualifier}.{b.name}"
        if self.chance(0.25):
            saved, self.scope = self.scope, [left, right]
            condition += f" AND {self.expr('bool')}"
            self.scope = saved
        return condition

    def partner(self, source: Source) -> Source:
        """Which source already in scope a new one is joined to: usually one it can be joined to soundly."""
        if self.chance(0.8):
            if any(c.unit for c in source.columns):
                with_unit = [s for s in self.scope if any(c.unit for c in s.columns)]
                if with_unit:
                    return self.pick(with_unit)
            names = {c.name for c in source.columns}
            sharing = [s for s in self.scope if names & {c.name for c in s.columns}]
            if sharing:
                return self.pick(sharing)
        return self.pick(self.scope)

    def joins(self, pattern: tuple[str, ...] | None = None) -> str:
        pattern = pattern or self.pick(
            (
                ("patients", "visits"),
                ("visits", "patients"),
                ("patients", "zip_info"),
                ("zip_info", "patients"),
                ("patients", "patients"),
                ("visits", "visits"),
                ("patients", "visits", "zip_info"),
                ("zip_info", "patients", "visits"),
                ("patients", "zip_info", "visits"),
                ("survey", "zip_info") if self.chance(0.3) else ("visits", "patients"),
                ("survey", "patients") if self.chance(0.3) else ("patients", "visits"),
            )
        )
        aliases = ("a", "b", "c")
        text, first = self.table_source(pattern[0], aliases[0])
        self.scope = [first]
        for i, table in enumerate(pattern[1:], start=1):
            item, source = self.table_source(table, aliases[i])
            kind = self.pick(
                (
                    "JOIN",
                    "JOIN",
                    "JOIN",
                    "INNER JOIN",
                    "LEFT JOIN",
                    "LEFT JOIN",
                    "LEFT OUTER JOIN",
                    "USING",
                    "USING",
                )
            )
            if self.chance(0.12):
                kind = self.pick(("RIGHT JOIN", "FULL JOIN", "CROSS JOIN", "NATURAL JOIN"))
            if kind == "CROSS JOIN" or kind == "NATURAL JOIN":
                text += f" {kind} {item}"
            elif kind == "USING":
                shared = [
                    c.name
                    for c in source.columns
                    if any(c.name == d.name for s in self.scope for d in s.columns)
                ]
                if shared:
                    text += f" {self.pick(('JOIN', 'LEFT JOIN'))} {item} USING ({self.pick(shared)})"
                else:
                    text += f" JOIN {item} ON {self.join_condition(self.partner(source), source)}"
            else:
                text += f" {kind} {item} ON {self.join_condition(self.partner(source), source)}"
            self.scope.append(source)
        return text

    # -- aggregates and the select list ------------------------------------------------------------

    def aggregate(self) -> str:
        n = self.pick(range(24))

        def number() -> str:
            bounded = [
                (s, c)
                for s, c in self.columns(NUMBER)
                if c.name not in ("visit_id", "patient_id", "population", "note_id")
            ]
            if bounded and self.chance(0.5):
                return self.reference(*self.pick(bounded))
            return self.expr("number")

        if n == 3 and self.scope:
            # COUNT(t.*): t's rows (COUNT(*)), or 0A000 where a LEFT JOIN extends t with NULLs. The
            # first source, drawing nothing more: the other statements stay as they were.
            return f"COUNT({self.scope[0].qualifier}.*)"
        if n <= 3:
            return "COUNT(*)"
        if n == 4:
            return f"COUNT({self.expr(self.pick(('number', 'text', 'date')))})"
        if n == 5:
            unit = [f"{s.qualifier}.{c.name}" for s, c in self.columns("int") if c.unit]
            target = (
                self.pick(unit) if unit and self.chance(0.6) else self.expr(self.pick(("text", "number")))
            )
            return f"COUNT(DISTINCT {target})"
        if n <= 8:
            return f"SUM({number()})"
        if n <= 10:
            return f"AVG({number()})"
        if n == 11:
            temporal = temporal_aggregate(self) if self.chance(0.35) else None
            return temporal or f"{self.pick(('MIN', 'MAX'))}({number()})"
        if n == 12:
            return f"MEDIAN({number()})"
        if n == 13:
            fraction = self.pick(("0.5", "0.9", "0", "1", "0.25", "1.5"))
            order = " DESC" if self.chance(0.3) else ""
            return f"{self.pick(('percentile_cont', 'percentile_disc'))}({fraction}) WITHIN GROUP (ORDER BY {number()}{order})"
        if n == 14:
            return f"{self.pick(('VAR_POP', 'VAR_SAMP', 'VARIANCE', 'STDDEV', 'STDDEV_POP', 'STDDEV_SAMP'))}({number()})"
        if n == 15:
            column = self.column(("text", "int")) or "1"
            return f"mode() WITHIN GROUP (ORDER BY {column})"
        if n == 16 and self.chance(0.5):
            hostile = self.pick(
                (
                    f"SUM({number()}) FILTER (WHERE {self.expr('bool')})",
                    f"string_agg({self.expr('text')}, ',')",
                    f"bool_and({self.expr('bool')})",
                    "COUNT(*) OVER ()",
                    f"SUM(DISTINCT {number()})",
                    f"SUM(SUM({number()}))",
                    f"array_agg({number()})",
                    f"MAX({self.expr('text')})",
                    f"AVG({self.expr('text')})",
                    f"SUM({self.expr('bool')})",
                    "COUNT(1)",
                    f"COUNT(DISTINCT ({self.expr('text')}))",
                )
            )
            return hostile
        if n == 17:
            return f"SUM(CASE WHEN {self.expr('bool')} THEN 1 ELSE 0 END)"
        if n == 18 and self.chance(0.6):
            return filtered(self, f"{self.pick(('SUM', 'AVG', 'MIN', 'COUNT'))}({number()})")
        return f"{self.pick(('SUM', 'AVG', 'COUNT'))}({number()})"

    def over_aggregates(self) -> str:
        """An expression over released values (post-processing)."""
        roll = self.rng.random()
        agg = self.aggregate()
        if roll < 0.6:
            return agg
        if roll < 0.7:
            return f"{agg} {self.pick(('+', '-', '*', '/'))} {self.pick(('2', '0', '1.5', self.aggregate()))}"
        if roll < 0.8:
            return f"ROUND({agg}, {self.pick(('0', '1', '2'))})"
        if roll < 0.85:
            return f"CAST({agg} AS {self.pick(('int', 'bigint', 'numeric', 'double precision', 'text'))})"
        if roll < 0.9:
            return f"{agg} + {self.scalar_subquery()}"
        if roll < 0.93:
            return f"COALESCE({agg}, 0)"
        if roll < 0.97:  # mathematical functions of released values (NULL outside their domain)
            return self.pick(
                (f"sqrt({agg})", f"power({agg}, 2)", f"ln({agg})", f"log({agg})", f"exp({agg} * 0)")
            )
        return f"{agg}::int4"

    def query(self) -> str:
        from_text, with_prefix = self.from_clause()
        if not with_prefix and self.chance(0.03):
            return existence_probe(self, from_text)
        parts = []
        where = f" WHERE {self.expr('bool')}" if self.chance(0.55) else ""
        relative_condition = relative_filter(self) if self.chance(0.1) else None
        if relative_condition is not None:
            where = f"{where} AND {relative_condition}" if where else f" WHERE {relative_condition}"
        keys: list[str] = []
        restrictions: list[str] = []
        if self.chance(0.55):
            for _ in range(self.pick((1, 1, 1, 2, 2, 3))):
                roll = self.rng.random()
                if roll < 0.15:
                    key, restriction = self.public_key()
                    if restriction is not None:
                        restrictions.append(restriction)
                elif roll < 0.6:
                    key = self.column(
                        ("text", "bool", "int", "date", "tstz", "float"), allow_unit=self.chance(0.05)
                    )
                    named = self.named_values(key) if key and self.chance(0.5) else None
                    if named is not None:
                        restrictions.append(named)
                elif roll < 0.9:
                    key = self.pick(
                        (
                            f"CAST(ceil((CASE WHEN {self.expr('bool')} THEN -1 ELSE 0 END) / 2.0) AS double precision)",
                            f"CASE WHEN {self.expr('bool')} THEN 30 ELSE {self.column('num') or '30.00'} END",
                            f"date_trunc('month', {self.column('date') or 'NULL'})",
                            f"extract(year FROM {self.column('date') or 'NULL'})",
                            f"({self.column('int') or '1'} / 10)",
                            f"CASE WHEN {self.expr('bool')} THEN 'x' ELSE 'y' END",
                            # constant results only: public keys (PublicKeys._case), zero-filled
                            f"CASE WHEN {self.expr('bool')} THEN 1 WHEN {self.expr('bool')} THEN 2 ELSE 3 END",
                            f"substring({self.column('text') or repr('a')}, 1, 2)",
                            f"floor(extract(epoch FROM {self.column('ts') or 'NULL'}) / 86400) * 86400",
                            self.expr(self.pick(("text", "number", "bool"))),
                        )
                    )
                else:
                    key = self.in_subquery() if self.chance(0.5) else self.expr("bool")
                if key and key not in keys:
                    keys.append(key)
        if restrictions and self.chance(0.6):
            # A WHERE on a public key (or on the date column its buckets come from) restricts the
            # zero-filled keys to those it admits.
            condition = self.pick(restrictions)
            where = (
                f" WHERE ({where.removeprefix(' WHERE ')}) AND {condition}"
                if where
                else f" WHERE {condition}"
            )
        items: list[str] = []
        aliases: list[str] = []
        for j, key in enumerate(keys):
            if self.chance(0.85):
                alias = f"k{j}" if self.chance(0.5) else None
                items.append(f"{key} AS {alias}" if alias else key)
                aliases.append(alias or key)
        for i in range(self.pick((1, 1, 2, 2, 3))):
            alias = self.pick((None, f"a{i}", "n"))
            value = self.over_aggregates()
            items.append(f"{value} AS {alias}" if alias else value)
            aliases.append(alias or value)
        if self.chance(0.03):
            items.append(self.column(("text", "number")) or "1")  # a raw column: must be refused
        if self.chance(0.015):
            items = ["*"]
        if self.chance(0.04):
            items.insert(0, self.pick(("1", "'label'", "NULL", self.scalar_subquery())))
        self.rng.shuffle(items) if self.chance(0.2) else None
        group = ""
        if keys:
            written = []
            for j, key in enumerate(keys):
                position = next(
                    (i for i, item in enumerate(items) if item == key or item.startswith(f"{key} AS ")), None
                )
                if position is not None and self.chance(0.3):
                    written.append(str(position + 1))
                elif f"{key} AS k{j}" in items and self.chance(0.3):
                    written.append(f"k{j}")
                else:
                    written.append(key)
            group = f" GROUP BY {', '.join(written)}"
        having = f" HAVING {self.having()}" if self.chance(0.25) else ""
        order = ""
        if self.chance(0.45):
            terms = []
            for _ in range(self.pick((1, 1, 2))):
                roll = self.rng.random()
                if roll < 0.4:
                    term = str(self.rng.randrange(1, len(items) + 2))
                elif roll < 0.6 and aliases:
                    term = self.pick(aliases)
                elif roll < 0.8:
                    term = self.aggregate()
                else:
                    term = self.pick(keys) if keys else self.expr("number")
                terms.append(term + self.pick(("", " DESC", " ASC", " DESC NULLS LAST", " NULLS FIRST")))
            order = f" ORDER BY {', '.join(terms)}"
        limit = ""
        if self.chance(0.35):
            value = self.pick(("0", "1", "2", "3", "10", "NULL", "ALL", self.parameter(2), "-1", "1.5"))
            limit = f" LIMIT {value}"
        if self.chance(0.15):
            limit += f" OFFSET {self.pick(('0', '1', '2', self.parameter(1)))}"
        distinct = "DISTINCT " if self.chance(0.015) else ""
        parts.append(
            f"{with_prefix}SELECT {distinct}{', '.join(items)} FROM {from_text}{where}{group}{having}{order}{limit}"
        )
        return "".join(parts)

    def public_key(self) -> tuple[str | None, str | None]:
        """A GROUP BY key whose values are public knowledge (a public table's column, or a
        date_trunc bucket or extract field of a date column with a declared range, or of one
        without), and a WHERE condition restricting it (None: none fits)."""
        public = [(s, c) for s, c in self.columns(("text", "int")) if not s.protected]
        temporal = self.columns(("date", "ts", "tstz"))
        roll = self.rng.random()
        if public and (roll < 0.4 or not temporal):
            source, column = self.pick(public)
            key = self.reference(source, column)
            if column.kind == "int":
                return key, f"{key} {self.pick(('=', '<>', '>=', '<'))} {self.literal('int')}"
            values = ", ".join(
                self.pick(("'CA'", "'NY'", "'ny'", "'94103'", "'00501'", "''")) for _ in range(2)
            )
            return key, self.pick(
                (f"{key} IN ({values})", f"{key} = 'CA'", f"{key} <> 'NY'", f"{key} >= 'M'")
            )
        if not temporal:
            return self.column(("text", "int")), None
        source, column = self.pick(temporal)
        inner = self.reference(source, column)
        kind = column.kind
        range_condition = self.pick(
            (
                lambda: f"{inner} >= {self.literal(kind)}",
                lambda: f"{inner} < {self.literal(kind)}",
                lambda: f"{inner} BETWEEN {self.literal(kind)} AND {self.literal(self.pick(('date', 'ts')))}",
                lambda: f"{inner} = {self.literal(kind)}",
            )
        )
        if roll < 0.75:
            unit = self.pick(("day", "week", "month", "quarter", "year", "hour"))
            if unit in ("day", "month", "year") and self.spelled(0.25):
                # Ibis's .strftime('%Y-%m') as the key: a text key (partition selection), restricted
                # on the column.
                pattern = {"day": "YYYY-MM-DD", "month": "YYYY-MM", "year": "YYYY"}[unit]
                return f"to_char({inner}, '{pattern}')", range_condition()
            key = f"date_trunc({self.unit(unit)}, {inner})"
            operator = self.pick(("=", ">=", "<", "<>"))
            own = lambda: f"{key} {operator} {self.literal(self.pick(('ts', 'date', 'tstz')))}"  # noqa: E731
            return key, self.pick((range_condition, range_condition, own))()
        field = self.pick(
            ("year", "quarter", "month", "week", "dow", "day", "hour", "isodow", "doy", "isoyear")
        )
        key = f"extract({field} FROM {inner})" if self.chance(0.7) else f"date_part('{field}', {inner})"
        condition = self.pick(
            (f"{key} IN (1, 3, 2023)", f"{key} = 2", f"{key} BETWEEN 2 AND 5", f"{key} <> 1")
        )
        return key, self.pick((range_condition, lambda: condition, lambda: condition))()

    def named_values(self, key: str) -> str | None:
        """A WHERE condition naming values of a column key: its values are then public
        (dpproxy.sql.public_keys, PublicKeys._named), whether or not any row has them."""
        name = key.rsplit(".", 1)[-1].strip('"')
        kinds = {c.kind for s in self.scope for c in s.columns if c.name == name}
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind not in ("text", "int", "date", "tstz"):
            return None
        listed = [self.literal(kind) for _ in range(self.pick((1, 2, 3)))]
        named = self.pick((f"{key} IN ({', '.join(listed)})", f"{key} = {self.literal(kind)}"))
        if named.startswith(f"{key} IN (") and self.spelled(0.4):
            return f"{key} = ANY({self.any_list(listed)})"  # psycopg's list, or a literal array
        return named

    def having(self) -> str:
        roll = self.rng.random()
        if roll < 0.6:
            return f"{self.aggregate()} {self.pick(('>', '<', '>=', '=', '<>'))} {self.pick(('0', '1', '3', '2.5', self.aggregate()))}"
        if roll < 0.8:
            return f"({self.aggregate()} > 1 {self.pick(('AND', 'OR'))} {self.aggregate()} < 100)"
        return self.expr("bool")


def generate(seed: int, index: int) -> Generated:
    """Query `index` of the batch `seed`: the same two numbers always give the same statement."""
    rng = random.Random(f"{seed}:{index}")
    # Drawn apart from the statement's own generator: the statements not reading visit_notes are
    # the ones the batch had before it.
    notes = random.Random(f"notes:{seed}:{index}").random() < NOTES_SHARE
    generator = QueryGenerator(rng, notes, random.Random(f"spell:{seed}:{index}"))
    sql = generator.query()
    if not sql.startswith("WITH") and rng.random() < 0.06:
        # A tool's wrapping: an outer query over the statement's answer (dpproxy.sql.released).
        sql = rng.choice(
            (
                "SELECT * FROM ({}) AS w ORDER BY 1 DESC LIMIT 3",
                "SELECT count(*) FROM ({}) AS CXTMPTAB_COUNT",
                "WITH w AS ({}) SELECT * FROM w",
                "SELECT w.* FROM ({}) w WHERE 1 = 1 LIMIT 500",
            )
        ).format(sql)
    elif not sql.startswith("WITH") and random.Random(f"dbt:{seed}:{index}").random() < DBT_SHARE:
        # dbt's generic test: its query (a CTE's reader, filtered) wrapped in the count of failures —
        # post-processing of post-processing (dbt-adapters, macros/materializations/tests/helpers.sql).
        sql = DBT_TEST.format(sql)
    interval = random.Random(f"interval:{seed}:{index}")
    if interval.random() < INTERVAL_SHARE:
        sql = with_interval_columns(sql, interval)
    window = random.Random(f"window:{seed}:{index}")
    if window.random() < WINDOW_SHARE:
        sql = with_window(sql, window)
    return Generated(sql, generator.params, seed, index)


# A share of statements that also ask for a window function over one of their aggregates (a share
# of the total, a rank, a running sum, LAG; dpproxy.sql.released lifts them), some with their LIMIT
# spelled FETCH FIRST, drawn from a stream of their own.
WINDOW_SHARE = 0.06


def with_window(sql: str, rng: random.Random) -> str:
    """The statement with a window function over its first select-list aggregate appended to the
    select list (partitioned by its first GROUP BY key, at times), and its LIMIT written as FETCH
    FIRST … ROWS ONLY at times; unchanged when its top-level SELECT has no aggregate."""
    tree = sqlglot.parse_one(sql, read="postgres")
    if not isinstance(tree, exp.Select):
        return sql
    aggregate = next(
        (
            a
            for item in tree.expressions
            for a in item.find_all(exp.AggFunc)
            if a.find_ancestor(exp.Window) is None
        ),
        None,
    )
    if aggregate is None:
        return sql
    agg = aggregate.sql("postgres")
    group = tree.args.get("group")
    keys = [k for k in (group.expressions if group is not None else []) if not isinstance(k, exp.Literal)]
    partition = f"PARTITION BY {keys[0].sql('postgres')} " if keys and rng.random() < 0.4 else ""
    window = rng.choice(
        (
            f"{agg} * 100.0 / SUM({agg}) OVER ({partition.strip()})",
            f"RANK() OVER ({partition}ORDER BY {agg} DESC)",
            f"SUM({agg}) OVER ({partition}ORDER BY {agg})",
            f"LAG({agg}) OVER ({partition}ORDER BY {agg})",
            f"COUNT(*) OVER ({partition.strip()})",
        )
    )
    tree.append("expressions", sqlglot.parse_one(window, read="postgres"))
    limit = tree.args.get("limit")
    if isinstance(limit, exp.Limit) and isinstance(limit.expression, exp.Literal) and rng.random() < 0.3:
        tree.set("limit", None)  # …[OFFSET m] FETCH FIRST n ROWS ONLY
        return f"{tree.sql('postgres')} FETCH FIRST {limit.expression.sql('postgres')} ROWS ONLY"
    return tree.sql("postgres")


# A share of statements that also ask for an aggregate's 95% interval as columns (dp_interval_low/high
# of the select list's first aggregate, or of its output alias), drawn from a stream of their own so
# that every other statement is the one the batch had before.
INTERVAL_SHARE = 0.05


def with_interval_columns(sql: str, rng: random.Random) -> str:
    """The statement with dp_interval_low/high of its first select-list aggregate appended to the
    select list (sometimes under ROUND or by its alias, as Snowflake's form names it); unchanged
    when its top-level SELECT has no aggregate."""
    tree = sqlglot.parse_one(sql, read="postgres")
    if not isinstance(tree, exp.Select):
        return sql
    for item in tree.expressions:
        aggregate = item.find(exp.AggFunc)
        if aggregate is None or aggregate.find_ancestor(exp.Window) is not None:
            continue
        argument: exp.Expression = aggregate.copy()
        if isinstance(item, exp.Alias) and item.this is aggregate and rng.random() < 0.3:
            argument = exp.column(item.alias)
        elif rng.random() < 0.2:
            argument = exp.Round(this=argument, decimals=exp.Literal.number(1))
        for end in ("dp_interval_low", "dp_interval_high"):
            tree.append("expressions", exp.Anonymous(this=end, expressions=[argument.copy()]))
        return tree.sql("postgres")
    return sql


# A share of statements wrapped as dbt wraps a generic test's query, drawn from a stream of their own.
DBT_SHARE = 0.03
DBT_TEST = (
    "select count(*) as failures, count(*) > 50 as should_warn, count(*) <> 0 as should_error "
    "from (with all_values as ({}) select * from all_values where 1 = 1) dbt_internal_test"
)
