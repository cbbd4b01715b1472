"""The `tables:` section of a policy file: which tables analysts may query, and who is in each row.

This module owns reading a table entry into `TablePolicy`: public or protected, its schema, and for
a protected table the privacy unit (a listed column, `row`, or a reference to a protected table that
names it: `{references: orders, on: order_id}`, resolved up the chain once every table is read), the
contribution limits
(max_groups_per_unit, max_rows_per_unit, within 1..MAX_CONTRIBUTIONS), row bounding and randomized
response. Columns are read by `dpproxy.policy.columns`, told which column is the unit.

It must never see a database: whether the tables exist with these columns is checked by
`dpproxy.policy.live_schema` against what a backend reports.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TypedDict

from dpproxy.policy.columns import read_columns
from dpproxy.policy.marked_yaml import Node
from dpproxy.policy.model import (
    CONTRIBUTION_BOUNDS,
    NULL_UNITS,
    ROW_BOUNDING,
    VALUE_RANGES,
    ColumnPolicy,
    TablePolicy,
    UnitReference,
    is_valid_name,
)
from dpproxy.policy.problems import Problems
from dpproxy.policy.readers import (
    check_keys,
    check_names,
    read_boolean,
    read_choice,
    read_integer,
    read_mapping,
    read_text,
)

# A person contributing to more groups or rows than this is not a contribution *bound*; a larger
# value is almost certainly a slip of the data owner. With bounds chosen per query the limits are
# ceilings, each query choosing its bounds below them, but not far below: k stays at or above a
# quarter of the rows ceiling (docs/privacy.md §3), so a ceiling far above the most rows a person has
# costs accuracy.
MAX_CONTRIBUTIONS = 100_000

# Who is in a row and how much each person contributes: a protected table's keys, refused on a public one.
_PRIVACY_KEYS = (
    "privacy_unit",
    "max_groups_per_unit",
    "max_rows_per_unit",
    "row_bounding",
    "contribution_bounds",
    "value_ranges",
    "null_units",
    "randomized_response",
    "unit_unique",
)
_PROTECTED_TABLE_KEYS = ("public", *_PRIVACY_KEYS, "schema", "columns")
_PUBLIC_TABLE_KEYS = ("public", "schema", "columns")


def read_tables(node: Node, p: Problems) -> tuple[TablePolicy, ...]:
    entries = read_mapping(node, "tables", p, example="{patients: {privacy_unit: ..., columns: {...}}}")
    if entries is None:
        return ()
    if not entries:
        p.add(node.line, "tables", "no tables are listed", "list at least one table analysts may query")
        return ()
    check_names(node, "tables", p, kind="table")
    tables = []
    for name, child in entries.items():
        table = _read_table(name, child, p)
        if table is not None:
            tables.append(table)
    return _resolve_references(tables, entries, p)


_REFERENCE_KEYS = ("references", "on", "key_unique")


def _read_reference(node: Node, path: str, p: Problems) -> UnitReference | None:
    """`privacy_unit: {references: <protected table>, on: <column>[, key_unique: true]}`."""
    entries = read_mapping(node, path, p, example="{references: orders, on: order_id}")
    if entries is None:
        return None
    check_keys(node, path, p, _REFERENCE_KEYS)
    values = {}
    for key in ("references", "on"):
        if key not in entries:
            p.add(
                node.line,
                f"{path}.{key}",
                "missing",
                "write privacy_unit: {references: <the table naming the person>, on: <the column both "
                "tables share>}",
            )
            continue
        values[key] = read_text(entries[key], f"{path}.{key}", p, fix="name a table or column")
    key_unique = False
    if "key_unique" in entries:
        key_unique = bool(read_boolean(entries["key_unique"], f"{path}.key_unique", p))
    if values.get("references") is None or values.get("on") is None:
        return None
    return UnitReference(values["references"], values["on"], key_unique)


def _resolve_references(
    tables: list[TablePolicy], entries: dict[str, Node], p: Problems
) -> tuple[TablePolicy, ...]:
    """Each table whose unit is a reference gets the unit column's name at the end of its chain:
    the referenced table must be protected, list the `on` column, and name its person (a unit
    column, or a reference in turn); chains never loop."""
    by_name = {t.name: t for t in tables}
    resolved: dict[str, str | None] = {}

    def unit_of(table: TablePolicy, seen: tuple[str, ...]) -> str | None:
        reference = table.unit_reference
        if reference is None:
            return table.privacy_unit
        if table.name in resolved:
            return resolved[table.name]
        path = f"tables.{table.name}.privacy_unit"
        line = entries[table.name].value["privacy_unit"].line
        target = by_name.get(reference.table)
        unit: str | None = None
        chain = (*seen, table.name)
        if reference.table in chain:
            p.add(
                line,
                f"{path}.references",
                "the references go round in a circle: " + " → ".join((*chain, reference.table)),
                "end the chain at a table whose privacy_unit is a column",
            )
        elif target is None:
            known = [t.name for t in tables if not t.public and t.name != table.name]
            close = difflib.get_close_matches(reference.table, known, n=1, cutoff=0.6)
            p.add(
                line,
                f"{path}.references",
                f"`{reference.table}` is not a protected table of the policy",
                f"did you mean `{close[0]}`?" if close else "name a protected table listed under tables",
            )
        elif target.public:
            p.add(
                line,
                f"{path}.references",
                f"`{reference.table}` is public: it names no person",
                "reference the protected table whose rows belong to the person",
            )
        elif target.unit_is_row and target.unit_reference is None:
            p.add(
                line,
                f"{path}.references",
                f"`{reference.table}` has privacy_unit: row, which names no column to reach the person by",
                f"name the person's column as {reference.table}'s privacy_unit",
            )
        elif target.column(reference.on) is None or table.column(reference.on) is None:
            missing = table.name if table.column(reference.on) is None else reference.table
            p.add(
                line,
                f"{path}.on",
                f"`{reference.on}` is not a listed column of {missing}",
                f"list {reference.on} in both {table.name} and {reference.table}",
            )
        else:
            unit = unit_of(target, chain)
            if unit is not None and table.column(unit) is not None:
                p.add(
                    line,
                    path,
                    f"{table.name} lists a column `{unit}`, the name of the person it "
                    f"reaches through {reference.table}",
                    f"write privacy_unit: {unit} if that column "
                    "names the person, or leave it out of the policy",
                )
                unit = None
        resolved[table.name] = unit
        return unit

    out = []
    for table in tables:
        if table.unit_reference is None:
            out.append(table)
            continue
        unit = unit_of(table, ())
        if unit is not None:
            out.append(dataclasses.replace(table, privacy_unit=unit))
    return tuple(out)


def _read_table(name: str, node: Node, p: Problems) -> TablePolicy | None:
    path = f"tables.{name}"
    entries = read_mapping(
        node, path, p, example="{public: true} or {privacy_unit: <column or row>, columns: {...}}"
    )
    if entries is None:
        return None
    public = False
    if "public" in entries:
        public = bool(read_boolean(entries["public"], f"{path}.public", p))

    schema = None
    if "schema" in entries:
        child = entries["schema"]
        schema = read_text(child, f"{path}.schema", p, fix="write the schema name, e.g. public")
        if schema is not None and not is_valid_name(schema):
            p.add(
                child.line,
                f"{path}.schema",
                f"`{schema}` is not a valid schema name",
                "use lowercase letters, digits and _, not starting with a digit",
            )
            schema = None

    if public:
        privacy_keys = {
            key: "a public table has no privacy unit or contribution limits (set public: false to protect it)"
            for key in _PRIVACY_KEYS
        }
        check_keys(node, path, p, _PUBLIC_TABLE_KEYS, refused=privacy_keys)
        columns: tuple[ColumnPolicy, ...] = ()
        if "columns" in entries and not (
            entries["columns"].kind == "scalar" and entries["columns"].value is None
        ):
            columns = read_columns(
                entries["columns"], f"{path}.columns", p, public=True, unit=None, unit_known=True
            )
        return TablePolicy(name=name, columns=columns, public=True, schema=schema)

    check_keys(node, path, p, _PROTECTED_TABLE_KEYS)
    unit_text = None
    reference: UnitReference | None = None
    if "privacy_unit" not in entries:
        p.add(
            node.owner_line,
            f"{path}.privacy_unit",
            "missing: a protected table needs a privacy unit",
            "name the column identifying the person a row belongs to, or write `row` when each row is a "
            "different person, or set `public: true` if the table holds no personal data",
        )
    elif entries["privacy_unit"].kind == "map":
        reference = _read_reference(entries["privacy_unit"], f"{path}.privacy_unit", p)
        unit_text = None if reference is None else ""
    else:
        unit_text = read_text(
            entries["privacy_unit"],
            f"{path}.privacy_unit",
            p,
            fix="name a column of this table, write row, or {references: <table>, on: <column>}",
        )
    contributions = _read_contributions(entries, path, unit_text, p)

    columns_node = entries.get("columns")
    if columns_node is None or (columns_node.kind == "scalar" and columns_node.value is None):
        p.add(
            node.owner_line if columns_node is None else columns_node.line,
            f"{path}.columns",
            "missing: a protected table must list the columns analysts may use",
            "add `columns:` with each column's type (and bounds for summed numbers)",
        )
        return None
    if columns_node.kind != "map":
        read_columns(columns_node, f"{path}.columns", p, public=False, unit=None, unit_known=False)
        return None
    column_entries = columns_node.value

    unit = None
    if unit_text is not None:
        unit_line = entries["privacy_unit"].line
        if unit_text == "row":
            if "row" in column_entries:
                p.add(
                    unit_line,
                    f"{path}.privacy_unit",
                    "`row` is ambiguous: the table also lists a column named row",
                    "rename the column in the policy's view or name the unit column explicitly",
                )
        elif reference is not None or unit_text in column_entries:
            unit = unit_text or None  # a reference: resolved with the other tables (_resolve_references)
        else:
            close = difflib.get_close_matches(unit_text, list(column_entries), n=1, cutoff=0.6)
            hint = (
                f"did you mean `{close[0]}`?" if close else "name one of the listed columns, or write `row`"
            )
            p.add(unit_line, f"{path}.privacy_unit", f"`{unit_text}` is not a listed column", hint)
            unit_text = None
    # With the unit unknown, any number column might be it: do not ask for bounds on them yet.
    columns = read_columns(
        columns_node, f"{path}.columns", p, public=False, unit=unit, unit_known=unit_text is not None
    )
    unit_unique = contributions["unit_unique"]
    if unit_unique and reference is not None:
        p.add(
            entries["unit_unique"].line,
            f"{path}.unit_unique",
            "a table whose person is reached through a reference has more than one row per person",
            "remove unit_unique",
        )
    elif unit_unique:
        _check_unit_unique(entries, path, unit_text, p)
    if not columns or unit_text is None:
        return None
    return TablePolicy(
        name=name,
        columns=columns,
        public=False,
        privacy_unit=unit,
        **contributions,
        schema=schema,
        unit_reference=reference,
    )


class _Contributions(TypedDict):
    """How much each person of a protected table contributes, keyed by their `TablePolicy` fields."""

    max_groups_per_unit: int
    max_rows_per_unit: int
    randomized_response: bool
    unit_unique: bool
    row_bounding: str
    contribution_bounds: str
    value_ranges: str
    null_units: str


def _read_contributions(
    entries: dict[str, Node], path: str, unit_text: str | None, p: Problems
) -> _Contributions:
    """How much each person of a protected table contributes and how that is enforced, keyed by the
    `TablePolicy` fields, which are the policy's keys: max_groups_per_unit and max_rows_per_unit
    (1..MAX_CONTRIBUTIONS, 1 with `privacy_unit: row`; 1 when absent or refused), randomized_response,
    unit_unique, row_bounding, contribution_bounds (fixed when rows are sampled), value_ranges and
    null_units (each_a_person only with a unit column of the table itself, and without randomized
    response or unit_unique: `_check_null_units`)."""
    limits = {}
    for key in ("max_groups_per_unit", "max_rows_per_unit"):
        limits[key] = 1
        if key not in entries:
            continue
        child = entries[key]
        value = read_integer(child, f"{path}.{key}", p)
        if value is None:
            continue
        if unit_text == "row" and value != 1:
            p.add(
                child.line,
                f"{path}.{key}",
                "must be 1 when the privacy unit is `row` (each row is one person)",
                f"remove `{key}`, or name the column identifying the person as privacy_unit",
            )
        elif not 1 <= value <= MAX_CONTRIBUTIONS:
            p.add(
                child.line,
                f"{path}.{key}",
                f"must be between 1 and {MAX_CONTRIBUTIONS}",
                "give the most a single person may contribute (a ceiling: each query chooses its "
                "bounds below it); a larger value is almost certainly a mistake",
            )
        else:
            limits[key] = value

    flags = {
        key: key in entries and bool(read_boolean(entries[key], f"{path}.{key}", p))
        for key in ("randomized_response", "unit_unique")
    }
    row_bounding = "clamp"
    if "row_bounding" in entries:
        row_bounding = (
            read_choice(
                entries["row_bounding"],
                f"{path}.row_bounding",
                p,
                ROW_BOUNDING,
                what="a row bounding",
                fix="write clamp or sample",
            )
            or row_bounding
        )
    # Sampling rows is a way of enforcing fixed limits: asking for it fixes them.
    bounds = "fixed" if row_bounding == "sample" else "chosen"
    if "contribution_bounds" in entries:
        child = entries["contribution_bounds"]
        value_text = read_choice(
            child,
            f"{path}.contribution_bounds",
            p,
            CONTRIBUTION_BOUNDS,
            what="a way of bounding contributions",
            fix="write chosen (each query chooses its bounds within the limits) or fixed (the limits)",
        )
        if value_text == "chosen" and row_bounding == "sample":
            p.add(
                child.line,
                f"{path}.contribution_bounds",
                "row_bounding: sample keeps max_rows_per_unit rows per person and group: "
                "the limits are fixed",
                "remove row_bounding: sample, or write contribution_bounds: fixed",
            )
        elif value_text is not None:
            bounds = value_text
    value_ranges = "chosen"
    if "value_ranges" in entries:
        value_ranges = (
            read_choice(
                entries["value_ranges"],
                f"{path}.value_ranges",
                p,
                VALUE_RANGES,
                what="a way of ranging averaged values",
                fix="write chosen (each AVG's range chosen per query) or declared (the declared bounds)",
            )
            or value_ranges
        )
    null_units = "left_out"
    if "null_units" in entries:
        null_units = (
            read_choice(
                entries["null_units"],
                f"{path}.null_units",
                p,
                NULL_UNITS,
                what="a way of reading rows whose privacy unit is NULL",
                fix="write left_out (such rows belong to no person) or each_a_person (each is a person of "
                "its own)",
            )
            or null_units
        )
        if null_units == "each_a_person" and not _check_null_units(entries, path, unit_text, flags, p):
            null_units = "left_out"
    return _Contributions(
        value_ranges=value_ranges,
        null_units=null_units,
        max_groups_per_unit=limits["max_groups_per_unit"],
        max_rows_per_unit=limits["max_rows_per_unit"],
        randomized_response=flags["randomized_response"],
        unit_unique=flags["unit_unique"],
        row_bounding=row_bounding,
        contribution_bounds=bounds,
    )


def _check_null_units(
    entries: dict[str, Node], path: str, unit_text: str | None, flags: dict[str, bool], p: Problems
) -> bool:
    """`null_units: each_a_person` needs a unit column of the table itself: with `row` every row is a
    person already, a unit reached through a reference is the referenced row's person, unit_unique
    vouches that the unit is never NULL, and randomized response counts persons with a unit."""
    line = entries["null_units"].line
    if unit_text == "row":
        problem = "`privacy_unit: row` already takes each row to be a different person"
    elif unit_text == "":  # a reference (read_table)
        problem = "a row reached through a reference has the referenced row's person, or none"
    elif flags["unit_unique"]:
        problem = "unit_unique vouches that the privacy unit is never NULL"
    elif flags["randomized_response"]:
        problem = "randomized response counts the persons who have a unit"
    else:
        return True
    p.add(line, f"{path}.null_units", problem, "remove null_units")
    return False


def _check_unit_unique(entries: dict[str, Node], path: str, unit_text: str | None, p: Problems) -> None:
    """`unit_unique: true` says each person has exactly one row: it needs a named unit column, and
    limits above 1 would contradict it."""
    line = entries["unit_unique"].line
    if unit_text == "row":
        p.add(
            line,
            f"{path}.unit_unique",
            "`privacy_unit: row` already takes each row to be a different person",
            "remove unit_unique",
        )
        return
    for key in ("max_groups_per_unit", "max_rows_per_unit"):
        child = entries.get(key)
        if child is not None and isinstance(child.value, int) and child.value != 1:
            p.add(
                child.line,
                f"{path}.{key}",
                "must be 1 when unit_unique is true (each person then has exactly one row)",
                f"remove `{key}`, or remove unit_unique if one person can have several rows",
            )
