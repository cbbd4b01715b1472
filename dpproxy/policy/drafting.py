"""Drafting a policy from a live schema (`dpproxy policy init`).

This module owns `draft_policy`: a commented YAML skeleton that loads as-is and is conservative (no
number column summable until the data owner gives bounds, no public value sets, an analyst without a
password), with every guess, such as the privacy unit, marked `# TODO` for the data owner to check.

It must never import a backend or touch data: it works on the column list the caller got from the
backend (and, for the ceilings, on what the caller's `most_rows` reads: the most rows one person has
in a table; for the bounds, on what its `value_ranges` reads: where a column's values lie; for a
note, on its `unitless_rows`: the rows without a person), and writes text for a person to review,
never a `Policy` that is used unreviewed.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from dpproxy.policy.live_schema import LiveColumnLike
from dpproxy.policy.model import is_valid_name
from dpproxy.policy.tables import MAX_CONTRIBUTIONS
from dpproxy.policy.types import ColumnType

# Column names that usually identify a person, used only to pre-fill a draft's privacy unit.
_PERSON_ID_NAMES = (
    "person_id", "user_id", "patient_id", "customer_id", "individual_id", "member_id", "employee_id",
    "participant_id", "subject_id", "student_id", "client_id", "account_id", "household_id",
)  # fmt: skip


@dataclass(frozen=True)
class ValueRange:
    """Where a column's values lay when the draft was made, read by the caller (`policy init`, with
    the data owner's connection): the least and the most, and for a number column the values with
    half a percent of the rows below and above (`low`, `high`; None for dates and times)."""

    least: object
    most: object
    low: object = None
    high: object = None


# The share of a number column's values the draft says lie between `low` and `high`.
TYPICAL_SHARE = "99%"


@dataclass(frozen=True)
class _Unit:
    """A drafted privacy unit: a column of the table, or a reference to a table naming the person."""

    column: str | None = None
    references: str | None = None  # the referenced table's key in `live`
    on: str | None = None
    person_named: bool = False  # found by a person-id name (customer_id), not as a referenced key
    note: str = ""


def rows_ceiling(most: int) -> int:
    """The rows ceiling to write for a table whose heaviest person has `most` rows: rounded up to a
    power of two, as analysts see the ceilings (NOTICE, EXPLAIN) and the exact count would be one
    person's, published without noise."""
    return min(1 << (max(most, 1) - 1).bit_length(), MAX_CONTRIBUTIONS)


def draft_policy(
    live: Mapping[str, Sequence[LiveColumnLike]],
    *,
    analyst: str = "analyst",
    foreign_keys: Mapping[str, Sequence[tuple[str, str, str]]] | None = None,
    most_rows: Callable[[str, str], int | None] | None = None,
    value_ranges: Callable[[str, Sequence[str]], Mapping[str, ValueRange]] | None = None,
    unitless_rows: Callable[[str, str], int | None] | None = None,
) -> str:
    """A commented policy skeleton for the live schema (`dpproxy policy init`).

    The draft loads as-is and is conservative: no number column is summable until the data owner
    gives its bounds, no value set is public, the analyst has no password (so cannot connect over
    the network). Every guess is marked `# TODO` for the data owner to check. Tables and columns
    that cannot be exposed are listed as comments. ValueError if `analyst` is not a valid name.

    `foreign_keys`: per table (keyed as in `live`), its one-column foreign keys as (column,
    referenced table's key in `live`, referenced column). A table without a person's id column that
    references another drafts its unit through it (`privacy_unit: {references: orders, on:
    order_id}`), or names the referenced table's unit directly when it carries it; a table others
    reference by its key, naming no person itself, is drafted as the person (`privacy_unit: tailnum`
    for planes, which flights reference). A table with a foreign key is never drafted `row`.

    `most_rows(table, unit)`: the most rows one person has in the table (keyed as in `live`), read
    by the caller (`policy init` counts them), or None. A table whose unit is one of its columns
    then gets that number, rounded up to a power of two (analysts see the ceilings, and the exact
    count is one person's), as its `max_rows_per_unit` ceiling: with bounds chosen per query a ceiling
    far above it costs accuracy (the choice never goes below a quarter of the ceiling), and one
    below it drops data. Without it the draft keeps the restrictive 1.

    `unitless_rows(table, unit)`: how many rows of the table have no unit (NULL), read by the caller:
    the draft notes them when there are some, as every private query leaves them out.

    `value_ranges(table, columns)`: where each of those columns' values lie (keyed by column; a
    column missing: unknown), read by the caller for the number, date and time columns other than
    the unit. The draft says it in a comment under the column, for the data owner choosing `lower`
    and `upper`: a number column's noise grows with the width of its range, so the range that holds
    nearly all values (TYPICAL_SHARE) is usually the better bound than the least and the most; a
    date or time range, when public knowledge, makes date_trunc buckets public keys. The comments
    quote the data: the draft is for the data owner, not for analysts.
    """
    shared_ids = _ids_shared_between_tables(live)
    units = _draft_units(live, shared_ids, foreign_keys or {})
    out = [
        "# dpproxy policy drafted from the database schema. Review every TODO before serving:",
        "# a wrong privacy unit, bound or public value set weakens the privacy guarantee.",
        "# Reference: the README (Policy reference). Check with `dpproxy policy check`.",
        "version: 1",
        "",
        "defaults:",
        "  epsilon: 0.5        # per-query epsilon when a query does not ask for another",
        "  delta: 1.0e-7       # per-query delta",
        "  mechanism: laplace",
        "",
        "analysts:",
        f"  # TODO: add `password:` with the output of `dpproxy policy passwd`; without one, {analyst}",
        "  # can use dpproxy only from the command line and the Python API, not over the network.",
        f"  {_draft_name(analyst, 'analyst')}: {{epsilon: 1.0, delta: 1.0e-6}}  # TODO: set the total budget",
        "",
        "tables:",
    ]
    for key in sorted(live):
        schema, _, table_name = key.rpartition(".")
        columns = [c for c in live[key] if c.type is not None and is_valid_name(c.name)]
        skipped = [c for c in live[key] if c not in columns]
        if not is_valid_name(table_name) or (schema and not is_valid_name(schema)):
            out.append(f"  # skipped table {key}: its name is not a lowercase SQL identifier")
            continue
        if not columns:
            out.append(f"  # skipped table {key}: no column of a supported type")
            continue
        out.append(f"  {table_name}:")
        if schema:
            out.append(f"    schema: {schema}")
        drafted = units.get(key)
        unit = drafted.column if drafted is not None else None
        if drafted is not None and drafted.references is not None:
            target = drafted.references.rpartition(".")[2]
            out.append(
                f"    privacy_unit: {{references: {target}, on: {drafted.on}}}  # TODO: check that each "
                f"row belongs to the person of its {target} row"
            )
            if drafted.note:
                out.append(f"    # TODO: {drafted.note}")
            out.append(
                "    max_groups_per_unit: 1  # TODO: the most groups one person may contribute to per query"
            )
            out.append(
                "    max_rows_per_unit: 1    # TODO: the most rows one person may contribute per group"
            )
        elif unit is None:
            out.append(
                "    # TODO: `row` says each row is a different person. If one person can have several"
            )
            out.append(
                "    # rows, name the column identifying the person instead, and set max_rows_per_unit."
            )
            out.append(
                "    # If the table holds no personal data at all, replace all this with `public: true`."
            )
            out.append("    privacy_unit: row")
        else:
            out.append(f"    privacy_unit: {unit}  # TODO: check that {unit} identifies one person")
            if drafted is not None and drafted.note:
                out.append(f"    # TODO: {drafted.note}")
            out.append(
                "    max_groups_per_unit: 1  # TODO: the most groups one person may contribute to per query"
            )
            most = most_rows(key, unit) if most_rows is not None else None
            if most is not None and most >= 1:
                ceiling = rows_ceiling(most)
                out.append(
                    f"    max_rows_per_unit: {ceiling}  # TODO: the most rows one person has here when"
                    " drafted, rounded up to a power of two (analysts see it: never a person's exact count)"
                )
            else:
                out.append(
                    "    max_rows_per_unit: 1    # TODO: the most rows one person may contribute to a query"
                )
            without = unitless_rows(key, unit) if unitless_rows is not None else None
            if without:
                out += [
                    f"    # NOTE: {without:,} row(s) had no {unit} when drafted: they belong to no person",
                    "    # and are left out of every private query. If each is a different person, write",
                    '    # null_units: each_a_person (README, "Rows without a person").',
                ]
        width = max(len(c.name) for c in columns) + 1
        ranged = [c.name for c in columns if c.name != unit and c.type is not None and _ranged(c.type)]
        found = value_ranges(key, ranged) if value_ranges is not None and ranged else {}
        if found:
            out += [
                '    # "values when drafted" quote the data: keep them out of what analysts see.',
                "    # The noise of SUM and AVG grows with upper - lower, and values outside are",
                f"    # clipped: where {TYPICAL_SHARE} of the values lie is usually a better range than",
                "    # where all of them do.",
            ]
        out.append("    columns:")
        for column in columns:
            label = f"{column.name}:".ljust(width)
            assert column.type is not None
            if column.name == unit:
                out.append(f"      {label} {{type: {column.type}}}  # the privacy unit")
            elif column.type.is_number:
                out.append(
                    f"      {label} {{type: {column.type}, summable: false}}"
                    "  # TODO: to allow SUM/AVG, replace summable: false by lower: ..., upper: ..."
                )
            elif column.type.is_text or column.type is ColumnType.BOOLEAN:
                out.append(
                    f"      {label} {{type: {column.type}}}"
                    "  # TODO: if its set of values is public knowledge, add public_values: [...]"
                )
            elif column.type.is_temporal:
                out.append(
                    f"      {label} {{type: {column.type}}}  # TODO: if the range of its values is public"
                    " knowledge, add lower: ..., upper: ... (date_trunc buckets become public keys)"
                )
            else:
                out.append(f"      {label} {{type: {column.type}}}")
            if column.name in found and column.name != unit:
                out.append(f"      #   {_range_note(found[column.name])}")
        for column in skipped:
            reason = "unsupported type " + column.sql_type if column.type is None else "name is not lowercase"
            out.append(f"      # {column.name}: not exposed ({reason})")
    if len(out) and out[-1] == "tables:":
        out.append("  {}  # TODO: no table could be drafted; list the tables analysts may query")
    return "\n".join(out) + "\n"


def _ranged(column_type: ColumnType) -> bool:
    return column_type.is_number or column_type.is_temporal


def _range_note(found: ValueRange) -> str:
    """The comment under a column saying where its values lay when drafted."""
    whole = f"[{value_text(found.least)}, {value_text(found.most)}]"
    if found.low is None or found.high is None:
        return f"values when drafted: {whole}"
    typical = f"[{value_text(found.low)}, {value_text(found.high)}]"
    return f"values when drafted: {TYPICAL_SHARE} in {typical}, all in {whole}"


def value_text(value: object) -> str:
    """A value as the policy would spell it: numbers plainly (1272, not 1272.0 or 1.272E+3), dates
    and times in ISO form."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # as PostgreSQL spells them
            return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        return str(int(value)) if value.is_integer() else format(value, ".6g")
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _draft_name(name: str, kind: str) -> str:
    if not is_valid_name(name):
        raise ValueError(f"{kind} name `{name}` is not a lowercase SQL identifier")
    return name


def _ids_shared_between_tables(live: Mapping[str, Sequence[LiveColumnLike]]) -> set[str]:
    seen: dict[str, int] = {}
    for columns in live.values():
        for name in {c.name for c in columns if c.name.endswith("_id")}:
            seen[name] = seen.get(name, 0) + 1
    return {name for name, count in seen.items() if count > 1}


def _draft_units(
    live: Mapping[str, Sequence[LiveColumnLike]],
    shared_ids: set[str],
    foreign_keys: Mapping[str, Sequence[tuple[str, str, str]]],
) -> dict[str, _Unit]:
    """Each table's drafted unit (absent: `row`). In order: a person's id column (customer_id); for a
    table that others reference by a key and that names no person, that key (the table's rows are
    the persons: planes, referenced by flights on tailnum); for a table with foreign keys, the unit
    of a referenced table — named directly when the foreign key is that unit, else as a reference —
    preferring a table with a person's id, then the one described by the most columns (a two-column
    code list is more likely public); last, an id column several tables share."""
    names = {
        key: [c.name for c in columns if c.type is not None and is_valid_name(c.name)]
        for key, columns in live.items()
    }
    usable = {
        key: [
            (column, target, referenced)
            for column, target, referenced in fks
            if column == referenced
            and target in live
            and target != key
            and column in names[key]
            and referenced in names[target]
        ]
        for key, fks in foreign_keys.items()
        if key in live
    }
    units: dict[str, _Unit] = {}
    for key, columns in names.items():
        person = next((n for n in _PERSON_ID_NAMES if n in columns), None)
        if person is not None:
            units[key] = _Unit(column=person, person_named=True)
    for _key, fks in sorted(usable.items()):
        for _, target, referenced in fks:
            if target not in units and not usable.get(target):  # a table that references none
                units[target] = _Unit(
                    column=referenced,
                    note=f"each row is taken to be one person, identified by {referenced}, because "
                    "other tables reference it; if the table holds no personal data, write public: true",
                )
    changed = True
    while changed:
        changed = False
        for key, fks in sorted(usable.items()):
            if key in units:
                continue
            known = [(column, target) for column, target, _ in fks if target in units]
            if not known:
                continue
            known.sort(key=lambda f: (not units[f[1]].person_named, -len(names[f[1]]), f[1]))
            column, target = known[0]
            others = ", ".join(f"{t.rpartition('.')[2]}({c})" for c, t in known[1:])
            note = f"it also references {others}: the person is whichever the rows describe" if others else ""
            reached = units[target]
            if reached.column == column:  # the foreign key is the referenced table's unit itself
                units[key] = _Unit(column=column, person_named=reached.person_named, note=note)
            else:
                units[key] = _Unit(references=target, on=column, person_named=reached.person_named, note=note)
            changed = True
    for key, columns in names.items():
        if key not in units:
            shared = next((n for n in columns if n in shared_ids), None)
            if shared is not None:
                units[key] = _Unit(column=shared)
    return units
