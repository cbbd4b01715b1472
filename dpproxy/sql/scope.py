"""What a private query's row-level expressions can name: its sources and their columns.

A source is a table of the policy (protected or public) or a derived per-unit relation (a subquery
grouped by the privacy unit), read under an alias the rewritten SQL chooses. Each of its columns
carries what the checks need: its type, the interval its values lie in (after clipping), whether it
is clipped when read, whether it may be summed, its public values, whether it is the privacy unit.
Nothing here reads data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import AmbiguousColumn, NotSupported, PolicyViolation, UndefinedColumn, UndefinedTable
from dpproxy.policy import ColumnPolicy, NamedColumns, TablePolicy
from dpproxy.sql.intervals import Interval
from dpproxy.sql.types import INTEGER_RANGE, PgType, from_column_type


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type: PgType
    interval: Interval | None = None  # values' range (bounded numbers; integer type ranges)
    clip: bool = False  # clip to `interval` when read: the policy's bounds, not a guarantee
    summable: bool = True
    public_values: tuple[object, ...] | None = None
    grid_scale: int = 0
    is_unit: bool = False
    fractional: bool = False  # a numeric/real/double column (decides the grid of sums)
    # A date or time column's declared range (the policy's lower/upper): its values are clamped into
    # it when read, and date_trunc/extract keys over it are public (dpproxy.sql.public_keys).
    temporal_range: tuple[dt.date, dt.date] | None = None

    @staticmethod
    def of_policy(column: ColumnPolicy, table: TablePolicy) -> SourceColumn:
        pg_type = from_column_type(column.type)
        interval = None
        clip = False
        temporal_range = None
        if column.type.is_number and column.bounded:
            assert isinstance(column.lower, Decimal) and isinstance(column.upper, Decimal)
            interval, clip = Interval(column.lower, column.upper), True
        elif column.type.is_temporal and column.bounded:
            assert isinstance(column.lower, dt.date) and isinstance(column.upper, dt.date)
            temporal_range = (column.lower, column.upper)
        elif pg_type.is_integer:
            lo, hi = INTEGER_RANGE[pg_type]
            interval = Interval.point(lo).union(Interval.point(hi))
        return SourceColumn(
            name=column.name,
            type=pg_type,
            interval=interval,
            clip=clip,
            summable=column.summable,
            public_values=column.public_values,
            grid_scale=column.grid_scale,
            is_unit=column.name == table.privacy_unit,
            fractional=column.type.is_fractional,
            temporal_range=temporal_range,
        )


@dataclass(frozen=True)
class Source(NamedColumns[SourceColumn]):
    alias: str  # the alias rewritten SQL reads it under (t0, t1, …)
    names: frozenset[str]  # what the query may qualify its columns with
    label: str  # for messages: the table's name, or the subquery's alias
    public: bool
    columns: tuple[SourceColumn, ...]
    item: exp.Expression  # the FROM item as emitted: a table or a subquery, under `alias`
    policy: TablePolicy | None = None  # for tables of the policy
    # A subquery grouped by the privacy unit: the table its persons are read from (its rows whose
    # unit is NULL are left out there, whatever the table's null_units).
    persons_of: TablePolicy | None = None

    @property
    def unit(self) -> SourceColumn | None:
        return next((c for c in self.columns if c.is_unit), None)


@dataclass(frozen=True)
class RowScope:
    """The sources a clause of a private query may read, and the clause's name for messages."""

    sources: tuple[Source, ...]
    clause: str

    def in_clause(self, clause: str) -> RowScope:
        return RowScope(self.sources, clause)

    def unsummable(self, expression: exp.Expression) -> bool:
        """Whether `expression` reads a column that may not be summed; `check_summable` says which."""
        return any(not self.resolve(c)[1].summable for c in expression.find_all(exp.Column))

    def check_summable(self, expression: exp.Expression) -> None:
        """Refuses (42501) an `expression` to be summed, averaged or ranked when it reads a column
        with summable: false, or a per-person subquery's MIN or MAX of one."""
        for node in expression.find_all(exp.Column):
            source, column = self.resolve(node)
            if column.summable:
                continue
            if source.policy is not None:
                where, why = "table", "summable: false in the policy"
            else:
                where, why = "subquery", "a MIN or MAX of a column with summable: false in the policy"
            raise PolicyViolation(
                f'column "{column.name}" of {where} "{source.label}" may not be summed or averaged ({why})',
                hint="it can still be filtered on, grouped by and counted",
            )

    def resolve(self, node: exp.Column) -> tuple[Source, SourceColumn]:
        qualifier = node.table.lower() if node.table else None
        if isinstance(node.this, exp.Star):
            raise NotSupported(
                f"{node.sql('postgres')} is not supported in {self.clause}",
                hint="name the columns it stands for",
            )
        if node.args.get("db") or node.args.get("catalog"):
            raise PolicyViolation(f"column reference {node.sql('postgres')} has too many qualifiers")
        name = node.name if node.this.quoted else node.name.lower()
        if qualifier is not None:
            source = next((s for s in self.sources if qualifier in s.names), None)
            if source is None:
                read = ", ".join(sorted(n for s in self.sources for n in s.names))
                raise UndefinedTable(
                    f'missing FROM-clause entry for table "{node.table}" ({self.clause})',
                    hint=f"the query reads: {read}",
                )
            column = source.column(name)
            if column is None:
                raise self._not_exposed(name, [source])
            return source, column
        found = [(s, c) for s in self.sources if (c := s.column(name)) is not None]
        if not found:
            raise self._not_exposed(name, list(self.sources))
        if len(found) > 1:
            raise AmbiguousColumn(
                f'column reference "{name}" is ambiguous ({self.clause})',
                hint="qualify it with its table's name or alias",
            )
        return found[0]

    def _not_exposed(self, name: str, sources: list[Source]) -> PolicyViolation:
        if len(sources) == 1:
            exposed = ", ".join(c.name for c in sources[0].columns)
            return PolicyViolation(
                f'column "{name}" of table "{sources[0].label}" is not exposed by the policy',
                hint=f"exposed columns: {exposed}",
            )
        labels = ", ".join(f'"{s.label}"' for s in sources)
        return PolicyViolation(
            f'column "{name}" is not exposed by the policy in any of {labels}',
            hint="check the column's name and which table it belongs to",
        )


def refuse_output_alias(
    node: exp.Column, aliases: Collection[str], sources: Sequence[Source], clause: str, where: str, hint: str
) -> None:
    """An output alias is not a column outside a bare ORDER BY or GROUP BY item: where the query reads
    an unqualified name that is one of `aliases` and no source's column, PostgreSQL answers 42703
    (`where`: "in HAVING", "inside an expression in ORDER BY")."""
    name = node.name if node.this.quoted else node.name.lower()
    if node.table or name not in aliases or any(s.column(name) for s in sources):
        return
    raise UndefinedColumn(
        f'column "{name}" does not exist ({clause}: "{name}" is an output alias, which cannot be used '
        f"{where})",
        hint=hint,
    )
