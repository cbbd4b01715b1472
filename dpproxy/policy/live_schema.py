"""A policy against the live schema: do its tables and columns exist, with types it can trust?

This module owns `check_against_schema`, `units_kept_not_null` and what "compatible" means: a
policy type accepts a live type whose every value is a value of the declared type (a narrower
integer, an exactly representable integer for a fractional type, text for varchar and back). Live
columns the policy does not list are fine: they are simply not exposed. `LiveColumnLike` is the
shape of a live column it reads.

It must never import a backend or touch data (dependencies point down): it works on the column list
the caller got from the backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from dpproxy.policy.model import ColumnPolicy, Policy, TablePolicy
from dpproxy.policy.types import ColumnType


class LiveColumnLike(Protocol):
    """A column as the backend reports it (dpproxy.backends.LiveColumn satisfies this)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> ColumnType | None: ...  # None: a type dpproxy does not support

    @property
    def sql_type(self) -> str: ...  # the database's own spelling, for messages

    @property
    def nullable(self) -> bool: ...  # False: the database keeps it NOT NULL


# Within a family, a policy type accepts any live type of equal or lower rank: every value the live
# column can hold is then a value of the declared type. Fractional policy types accept exactly
# representable integer types.
_ACCEPTS: dict[ColumnType, frozenset[ColumnType]] = {
    ColumnType.SMALLINT: frozenset({ColumnType.SMALLINT}),
    ColumnType.INTEGER: frozenset({ColumnType.SMALLINT, ColumnType.INTEGER}),
    ColumnType.BIGINT: frozenset({ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.BIGINT}),
    ColumnType.NUMERIC: frozenset(
        {ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.BIGINT, ColumnType.NUMERIC}
    ),
    ColumnType.REAL: frozenset({ColumnType.SMALLINT, ColumnType.REAL}),
    ColumnType.DOUBLE: frozenset(
        {ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.REAL, ColumnType.DOUBLE}
    ),
    ColumnType.TEXT: frozenset({ColumnType.TEXT, ColumnType.VARCHAR}),
    ColumnType.VARCHAR: frozenset({ColumnType.TEXT, ColumnType.VARCHAR}),
    ColumnType.BOOLEAN: frozenset({ColumnType.BOOLEAN}),
    ColumnType.DATE: frozenset({ColumnType.DATE}),
    ColumnType.TIMESTAMP: frozenset({ColumnType.TIMESTAMP}),
    ColumnType.TIMESTAMPTZ: frozenset({ColumnType.TIMESTAMPTZ}),
}


def units_kept_not_null(policy: Policy, live: Mapping[str, Sequence[LiveColumnLike]]) -> frozenset[str]:
    """The protected tables whose privacy-unit column the database keeps NOT NULL (`live` as for
    check_against_schema): their answers need not say that rows without a person were left out."""
    return frozenset(
        table.name
        for table in policy.tables
        if table.privacy_unit is not None
        and any(c.name == table.privacy_unit and not c.nullable for c in _live_columns(live, table) or ())
    )


def _live_columns(
    live: Mapping[str, Sequence[LiveColumnLike]], table: TablePolicy
) -> Sequence[LiveColumnLike] | None:
    """The live columns of a policy table: under "schema.table" when the policy names a schema, else
    (or if absent) under its name; None when the database has no such table."""
    qualified = f"{table.schema}.{table.name}" if table.schema else table.name
    found = live.get(qualified)
    return found if found is not None else live.get(table.name)


def check_against_schema(policy: Policy, live: Mapping[str, Sequence[LiveColumnLike]]) -> list[str]:
    """Problems between the policy and the live schema the backend reports; empty when they agree.

    `live` maps a table name (or "schema.table") to its columns. Live columns of a protected table
    that the policy does not list are fine: they are simply not exposed.
    """
    problems: list[str] = []
    for table in policy.tables:
        path = f"tables.{table.name}"
        qualified = f"{table.schema}.{table.name}" if table.schema else table.name
        live_columns = _live_columns(live, table)
        if live_columns is None:
            problems.append(
                f"{policy.source}: {path}: the database has no table {qualified}; "
                "create it, fix the table name (or its `schema:`), or remove it from the policy"
            )
            continue
        by_name = {column.name: column for column in live_columns}
        for column in table.columns:
            column_path = f"{path}.columns.{column.name}"
            found = by_name.get(column.name)
            if found is None:
                problems.append(
                    f"{policy.source}: {column_path}: the database table {qualified} has no column "
                    f"{column.name}; fix the column name or remove it from the policy"
                )
            elif found.type is None:
                problems.append(
                    f"{policy.source}: {column_path}: the database column {qualified}.{column.name} has type "
                    f"{found.sql_type}, which dpproxy does not support; remove the column from the policy, "
                    "or expose a view that casts it to a supported type"
                )
            elif (problem := _bounds_outscale(column, found)) is not None:
                problems.append(f"{policy.source}: {column_path}: the database column {qualified}.{problem}")
            elif found.type not in _ACCEPTS[column.type]:
                widest = found.type.is_number and column.type.is_number
                what = "wider than" if widest else "incompatible with"
                problems.append(
                    f"{policy.source}: {column_path}: the database column {qualified}.{column.name} is "
                    f"{found.sql_type}, {what} the policy's {column.type}; declare `type: {found.type}` "
                    "in the policy (and check its bounds)"
                )
    return problems


def _bounds_outscale(column: ColumnPolicy, found: LiveColumnLike) -> str | None:
    """Why a decimal column's bounds cannot be compared with its values (None: they can). A bound
    with more decimals than the database column is compared in a decimal of its scale: DuckDB then
    fails on a value whose integer digits do not fit in the rest of 38 (policy `scale: 1` over a
    DECIMAL(38,0) failed on 10^37), and whether a query fails would depend on that value."""
    shape = _DECIMAL.fullmatch(found.sql_type.strip()) if column.type is ColumnType.NUMERIC else None
    if shape is None or column.lower is None or column.upper is None:
        return None
    precision, scale = int(shape.group(1)), int(shape.group(2))
    places = max(-min(0, b.as_tuple().exponent) for b in (column.lower, column.upper))  # type: ignore[union-attr]
    if places <= scale or precision - scale + places <= 38:
        return None
    return (
        f"{column.name} is {found.sql_type}: bounds with {places} decimal(s) are compared with its values "
        f"in a decimal of that scale, which cannot hold its {precision - scale} integer digits; write the "
        f"bounds with at most {scale} decimal(s) and declare `scale: {scale}`"
    )


_DECIMAL = re.compile(r"(?:DECIMAL|NUMERIC)\((\d+),\s*(\d+)\)", re.IGNORECASE)


def reference_warnings(
    policy: Policy, foreign_keys: Mapping[str, Sequence[tuple[str, str, str]]]
) -> list[str]:
    """Warnings for `policy check --backend`: a table declared `privacy_unit: row` whose foreign key
    points at a protected table of the policy. Each of its rows then most likely belongs to the
    person of the row it references, and `row` would count one person once per row.
    `foreign_keys`: per table, (column, referenced table, referenced column) of its one-column
    foreign keys."""
    warnings = []
    for table in policy.tables:
        if table.public or not table.unit_is_row:
            continue
        for column, target_name, referenced in foreign_keys.get(table.name, ()):
            target = policy.table(target_name)
            if target is None or target.public:
                continue
            fix = (
                f"write privacy_unit: {{references: {target_name}, on: {column}}}"
                if column == referenced
                else f"name the person's column, or reference {target_name} on a column both tables share"
            )
            warnings.append(
                f"tables.{table.name}: privacy_unit is row, but {table.name}.{column} references the "
                f"protected table {target_name}: each of its rows probably belongs to the person of its "
                f"{target_name} row, and `row` would count that person once per row; {fix}"
            )
    return warnings
