"""The state the rewrite passes fold over: a chain of named SELECTs, each reading the previous one."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from dpproxy.sql.numbers import emit
from dpproxy.sql.query import ComponentKind, GroupKey, PrivateQuery
from dpproxy.sql.types import PgType

UNIT = "__unit"
# With `null_units: each_a_person`, a row whose unit is NULL is told apart by the digest of its listed
# columns (Relation.unit_row; NULL for every row with a unit): a person is (UNIT, UNIT_ROW).
UNIT_ROW = "__unit_row"


@dataclass(frozen=True)
class NumberedColumn:
    """A family of columns, one per component i or per candidate j: `family(i)` names the i-th."""

    prefix: str

    def __call__(self, number: int) -> str:
        return f"{self.prefix}{number}"


key_column = NumberedColumn("__k")  # the j-th GROUP BY key
component_column = NumberedColumn("__c")  # the i-th component's value


def key_value(key: GroupKey, dialect: str) -> exp.Expression:
    """A GROUP BY key as every later pass reads it: equal values spelled alike. GROUP BY, PARTITION BY
    and equality take -0.0 and 0.0 as one value, and PostgreSQL's numeric 30 and 30.00 too, but their
    text differs, and the salted hash that chooses a person's groups and rows hashes the text: one
    person's rows under two spellings of one key would count as two groups, each bounded, and merge
    into one group afterwards (twice the bound). So a double becomes x + 0 (-0.0 + 0.0 is +0.0; NaN
    and infinities unchanged), and a PostgreSQL numeric loses its trailing fractional zeros
    (trim_scale, PostgreSQL 13 and later); DuckDB's and Spark's decimals have one scale per column."""
    value = key.sql.copy()
    if key.type.is_float or key.double:
        kind = key.type.value if key.type.is_float else PgType.FLOAT8.value
        zero = exp.Cast(this=exp.Literal.number(0), to=exp.DataType.build(kind))
        return exp.Paren(this=exp.Add(this=value, expression=zero))
    if key.type is PgType.NUMERIC and dialect == "postgres":
        return exp.Anonymous(this="trim_scale", expressions=[value])
    return value


ROWS = "__rows"  # per unit and group: rows kept
UNITS = "__units"  # per group: units present (partition selection, COUNT(DISTINCT unit))
# Bounds chosen per query (PrivateQuery.bounds), per unit and group:
TOTAL = "__total"  # the unit's rows (each group's capped at row_cap) in all its groups
GROUPS = "__groups"  # how many groups the unit has rows in
GROUP_RANK = "__gn"  # the group's rank among the unit's groups (salted hash): 1 is its first
PERSONS = "__persons"  # per group: units whose first group it is (summed: every unit once)


def candidate_column(i: int, j: int) -> str:
    """Component i's per-group value at the j-th candidate of k (bounds chosen per query)."""
    return f"__c{i}_{j}"


# Per unit and group, component i's value (its magnitude, when it may be negative) div TOTAL, its
# mod TOTAL, and its sign (-1 or 1) for a component whose values may be negative.
quotient_column = NumberedColumn("__q")
remainder_column = NumberedColumn("__m")
sign_column = NumberedColumn("__sign")
# Per group, for the j-th candidate: the units whose first group it is and whose TOTAL exceeds the
# j-th candidate of k; the units present that count it among their first g groups, g the j-th
# candidate; the units whose first group it is and who have more groups than the j-th candidate of g.
above_column = NumberedColumn("__above")
units_column = NumberedColumn("__units")
wider_column = NumberedColumn("__wider")
# With PrivateQuery.estimate_left_out, per group and candidate j of k: the rows' worth k_j takes from
# the units whose first group it is, below the ceiling, LEAST(TOTAL, ceiling) − k_j when TOTAL is
# above k_j; and once, LEAST(TOTAL, ceiling) of those units (what the ceiling keeps of them).
excess_column = NumberedColumn("__excess")
REACH = "__reach"


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.column(name, table=table, quoted=True)


@dataclass(frozen=True)
class RewriteContext:
    """What every pass may read: the analyzed query, the physical table, and the plan's salt."""

    query: PrivateQuery
    salt: str  # per-plan value mixed into the per-unit selection order
    dialect: str = "postgres"  # the backend's: selection hashes are native where possible

    @property
    def keys(self) -> list[str]:
        return [key_column(j) for j in range(len(self.query.keys))]

    @property
    def valued_components(self) -> list[int]:
        """PrivateQuery.valued_components."""
        return self.query.valued_components

    @property
    def row_components(self) -> list[int]:
        """Components the row pipeline computes (COUNT(DISTINCT x))."""
        return [i for i, c in enumerate(self.query.components) if c.kind.row_pipeline]

    @property
    def only_counts_rows(self) -> bool:
        return all(c.kind in (ComponentKind.ROWS, ComponentKind.UNITS) for c in self.query.components)

    @property
    def persons(self) -> list[str]:
        """The columns that name a row's person in every per-person pass: the unit, and with
        `null_units: each_a_person` the digest that tells rows without one apart (UNIT_ROW). Rows
        with a unit keep the unit's own type and equality (a citext or numeric unit is one person
        however it is spelled); the digest is NULL for them."""
        return [UNIT, UNIT_ROW] if self.query.relation.null_unit_columns else [UNIT]

    @property
    def per_unit(self) -> bool:
        """Whether contributions must be bounded per unit (not when every row is its own unit)."""
        return not self.query.row_level

    @property
    def chosen(self) -> bool:
        """Whether the bounds are chosen per query: the main statement then computes every
        candidate's values (PrivateQuery.bounds)."""
        return self.per_unit and self.query.bounds is not None


@dataclass(frozen=True)
class Step:
    name: str
    summary: str
    select: exp.Select


@dataclass(frozen=True)
class RewriteState:
    """CTEs built so far; the last one is the current relation. `final` is set by the last pass."""

    steps: tuple[Step, ...] = ()
    final: exp.Select | None = None
    # Further complete statements the plan runs (the row pipeline), each a SELECT with its own CTEs.
    auxiliary: tuple[Step, ...] = ()

    def statements(self, dialect: str) -> list[str]:
        """Every statement the plan runs, main first (when there is one), in the backend's dialect."""
        main = [emit(self.query(), dialect, owned=True)] if self.steps else []  # query() builds a copy
        return [*main, *(emit(step.select, dialect) for step in self.auxiliary)]

    def then(self, name: str, summary: str, select: exp.Select) -> RewriteState:
        return replace(self, steps=(*self.steps, Step(name, summary, select)))

    @property
    def current(self) -> str:
        return self.steps[-1].name

    def query(self, upto: int | None = None) -> exp.Select:
        """A runnable SELECT: the CTE chain up to step `upto` (default: all), then its rows."""
        steps = self.steps if upto is None else self.steps[: upto + 1]
        if upto is None and self.final is not None:
            body = self.final.copy()
        else:
            body = exp.select("*").from_(steps[-1].name)
        for step in steps:
            body = body.with_(step.name, as_=step.select.copy(), copy=False)
        return body
