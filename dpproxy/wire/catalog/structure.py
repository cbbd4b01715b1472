"""The exposed tables' keys and indexes as the shadow shows them: which the analyst may see, their
OIDs, and the text pg_get_constraintdef and pg_get_indexdef give for them.

What is shown is structure the operator declared, never anything derived from data:
- PRIMARY KEY, UNIQUE and FOREIGN KEY constraints whose every column is exposed; a foreign key only
  when the table it references is exposed too (with every referenced column), and the unique index
  it relies on is shown;
- NOT NULL on exposed columns;
- indexes on plain exposed columns: names, columns, uniqueness, access method, ASC/DESC.
Never a CHECK or exclusion constraint, a column DEFAULT, an expression or partial index (their text
can hold literals chosen from the data), nor a statistic: indexes are shown as empty as the tables.

The structure is read from the backing database once, at start (`read_structure`, through the
backend's `structure`); this module only filters it and numbers it, and never runs SQL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dpproxy.backends import LiveColumn, LiveConstraint, LiveIndex, LiveStructure
from dpproxy.wire.catalog.pg_types import type_modifier
from dpproxy.wire.router import quote_identifier

if TYPE_CHECKING:
    from dpproxy.engine import Engine, ExposedTable
    from dpproxy.wire.catalog.objects import ShadowTable

# Access methods by name (pg_am of PostgreSQL 15).
ACCESS_METHODS = {"btree": 403, "hash": 405, "gist": 783, "gin": 2742, "brin": 3580, "spgist": 4000}
# The equality operator of a foreign key's columns, per column type (pg_constraint.conpfeqop …).
EQUALITY_OPERATORS = {21: 94, 23: 96, 20: 410, 25: 98, 1043: 98, 1042: 1054, 16: 91, 1082: 1093, 1700: 1752}
EQUALITY_OPERATORS |= {700: 620, 701: 670, 1114: 2060, 1184: 1320, 1083: 1108}
_RULES = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}
_MATCH = {"s": "", "f": " MATCH FULL", "p": " MATCH PARTIAL"}


@dataclass(frozen=True)
class ExposedStructure:
    """The structure of the exposed tables, by their exposed names: what the analyst may see."""

    not_null: Mapping[str, frozenset[str]]
    constraints: tuple[LiveConstraint, ...]  # referenced_table is an exposed table's name
    indexes: tuple[LiveIndex, ...]
    # Per table, each exposed column's type as the database declares it ("numeric(12,2)",
    # "DECIMAL(12,2)"): its modifier (precision, scale, length) is shown, as PostgreSQL shows it.
    sql_types: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


NO_STRUCTURE = ExposedStructure({}, (), ())


def expose_structure(
    live: Mapping[str, LiveStructure],
    places: Mapping[tuple[str, str], str],
    exposed: Sequence[ExposedTable],
    sql_types: Mapping[str, Mapping[str, Sequence[LiveColumn]]] | None = None,
) -> ExposedStructure:
    """Keep what concerns only exposed tables and columns.

    `live`: each schema's structure; `places`: (schema, table) in the database → exposed name;
    `sql_types`: each schema's tables and their columns (Backend.tables), for their declared types."""
    columns = {t.name: {c for c, _ in t.columns} for t in exposed}

    def shown(table: str, names: Sequence[str]) -> bool:
        return table in columns and bool(names) and set(names) <= columns[table]

    not_null: dict[str, frozenset[str]] = {}
    constraints: list[LiveConstraint] = []
    indexes: list[LiveIndex] = []
    for schema, structure in live.items():

        def name_of(table: str | None, schema: str = schema) -> str | None:
            return places.get((schema, table)) if table is not None else None

        for table, names in structure.not_null.items():
            if (name := name_of(table)) is not None:
                not_null[name] = frozenset(names & columns.get(name, set()))
        for index in structure.indexes:
            name = name_of(index.table)
            if name is not None and shown(name, index.columns):
                indexes.append(replace(index, table=name))
        for constraint in structure.constraints:
            name = name_of(constraint.table)
            if name is None or not shown(name, constraint.columns):
                continue
            referenced = None
            if constraint.kind == "f":
                referenced = places.get(
                    (constraint.referenced_schema or schema, constraint.referenced_table or "")
                )
                if referenced is None or not shown(referenced, constraint.referenced_columns):
                    continue
            constraints.append(
                replace(constraint, table=name, referenced_table=referenced, referenced_schema=None)
            )
    # A key is shown with its index; a foreign key only with a unique index on what it references.
    index_names = {(i.table, i.name) for i in indexes}
    kept = [c for c in constraints if c.kind == "f" or (c.table, c.index) in index_names]
    keyed = [c for c in kept if c.kind == "f" and unique_index_for(c, indexes) is not None]
    kept = [c for c in kept if c.kind != "f"] + keyed
    return ExposedStructure(
        not_null, tuple(kept), tuple(indexes), exposed_sql_types(sql_types or {}, places, exposed)
    )


def exposed_sql_types(
    live: Mapping[str, Mapping[str, Sequence[LiveColumn]]],
    places: Mapping[tuple[str, str], str],
    exposed: Sequence[ExposedTable],
) -> dict[str, dict[str, str]]:
    """The declared type of each exposed column, by exposed table name (`live`: per schema, the
    backend's tables)."""
    columns = {t.name: {c for c, _ in t.columns} for t in exposed}
    found: dict[str, dict[str, str]] = {}
    for schema, tables in live.items():
        for table, table_columns in tables.items():
            name = places.get((schema, table))
            if name is not None:
                found[name] = {c.name: c.sql_type for c in table_columns if c.name in columns.get(name, ())}
    return found


def unique_index_for(constraint: LiveConstraint, indexes: Sequence[LiveIndex]) -> LiveIndex | None:
    """The unique index on the referenced columns that a foreign key relies on (its conindid)."""
    wanted = set(constraint.referenced_columns)
    candidates = [
        i
        for i in indexes
        if i.table == constraint.referenced_table and i.unique and set(i.columns[: i.key_count]) == wanted
    ]
    candidates.sort(key=lambda i: (not i.primary, i.name))
    return candidates[0] if candidates else None


def read_structure(engine: Engine) -> ExposedStructure:
    """The exposed tables' structure, read from the engine's backend (none without a backend)."""
    backend = engine.backend
    if backend is None:
        return NO_STRUCTURE
    tables = engine.policy.tables
    places = {(t.schema or backend.default_schema, t.name): t.name for t in tables}
    schemas = sorted({s for s, _ in places})
    live = {schema: backend.structure(schema) for schema in schemas}
    columns = {schema: backend.tables(schema) for schema in schemas}
    return expose_structure(live, places, engine.exposed_tables(), columns)


# -- the rows the shadow stores -------------------------------------------------------------------


@dataclass(frozen=True)
class ShadowIndex:
    oid: int
    name: str
    table: ShadowTable
    attnums: tuple[int, ...]
    key_count: int
    unique: bool
    primary: bool
    method: int  # pg_am OID
    options: tuple[int, ...]
    definition: str  # pg_get_indexdef(oid)


@dataclass(frozen=True)
class ShadowConstraint:
    oid: int
    name: str
    kind: str
    table: ShadowTable
    attnums: tuple[int, ...]
    index_oid: int  # its own index (p, u), or the referenced unique index (f)
    referenced: ShadowTable | None
    referenced_attnums: tuple[int, ...]
    live: LiveConstraint
    definition: str  # pg_get_constraintdef(oid)


@dataclass(frozen=True)
class NumberedStructure:
    not_null: frozenset[tuple[int, int]]  # (table OID, attnum)
    indexes: tuple[ShadowIndex, ...]
    constraints: tuple[ShadowConstraint, ...]
    typmods: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (table OID, attnum) → atttypmod


def number_structure(
    structure: ExposedStructure, tables: Sequence[ShadowTable], first_oid: int
) -> NumberedStructure:
    """OIDs for the indexes, then the constraints, from `first_oid` on, and their definitions."""
    by_name = {t.name: t for t in tables}

    def attnums(table: ShadowTable, names: Sequence[str]) -> tuple[int, ...]:
        positions = {name: i + 1 for i, (name, _) in enumerate(table.columns)}
        return tuple(positions[n] for n in names)

    oid = first_oid
    indexes: list[ShadowIndex] = []
    index_oids: dict[tuple[str, str], int] = {}
    for index in structure.indexes:
        table = by_name[index.table]
        options = tuple(index.options[: index.key_count]) + (0,) * (index.key_count - len(index.options))
        indexes.append(
            ShadowIndex(
                oid,
                index.name,
                table,
                attnums(table, index.columns),
                index.key_count,
                index.unique,
                index.primary,
                ACCESS_METHODS.get(index.method, 403),
                options,
                _index_definition(index, options),
            )
        )
        index_oids[(index.table, index.name)] = oid
        oid += 1
    constraints: list[ShadowConstraint] = []
    for constraint in structure.constraints:
        table = by_name[constraint.table]
        referenced = by_name.get(constraint.referenced_table or "")
        if constraint.kind == "f":
            target = unique_index_for(constraint, structure.indexes)
            index_oid = index_oids[(target.table, target.name)] if target is not None else 0
        else:
            index_oid = index_oids.get((constraint.table, constraint.index or ""), 0)
        constraints.append(
            ShadowConstraint(
                oid,
                constraint.name,
                constraint.kind,
                table,
                attnums(table, constraint.columns),
                index_oid,
                referenced,
                attnums(referenced, constraint.referenced_columns) if referenced is not None else (),
                constraint,
                constraint_definition(constraint),
            )
        )
        oid += 1
    not_null = frozenset(
        (by_name[t].oid, n)
        for t, names in structure.not_null.items()
        if t in by_name
        for n in attnums(by_name[t], sorted(names))
    )
    # A primary key's columns are NOT NULL whatever the backend said (PostgreSQL enforces it).
    not_null |= {(c.table.oid, n) for c in constraints if c.kind == "p" for n in c.attnums}
    typmods = {
        (table.oid, i + 1): modifier
        for table in tables
        for i, (name, type_oid) in enumerate(table.columns)
        if (declared := structure.sql_types.get(table.name, {}).get(name)) is not None
        and (modifier := type_modifier(declared, type_oid)) != -1
    }
    return NumberedStructure(not_null, tuple(indexes), tuple(constraints), typmods)


NO_NUMBERED_STRUCTURE = NumberedStructure(frozenset(), (), ())


def _columns(names: Sequence[str]) -> str:
    return ", ".join(quote_identifier(n) for n in names)


def constraint_definition(constraint: LiveConstraint, *, qualified: bool = False) -> str:
    """pg_get_constraintdef's text for a key the shadow shows; `qualified`: the referenced table named
    with its schema, as PostgreSQL names it when public is not on the search_path (pg_dump's '')."""
    if constraint.kind == "p":
        text = f"PRIMARY KEY ({_columns(constraint.columns)})"
    elif constraint.kind == "u":
        text = f"UNIQUE ({_columns(constraint.columns)})"
    else:
        referenced = ("public." if qualified else "") + quote_identifier(constraint.referenced_table or "")
        text = (
            f"FOREIGN KEY ({_columns(constraint.columns)}) REFERENCES "
            f"{referenced}({_columns(constraint.referenced_columns)}){_MATCH.get(constraint.match, '')}"
        )
        if constraint.update_rule != "a":
            text += f" ON UPDATE {_RULES.get(constraint.update_rule, 'NO ACTION')}"
        if constraint.delete_rule != "a":
            text += f" ON DELETE {_RULES.get(constraint.delete_rule, 'NO ACTION')}"
    if constraint.deferrable:
        text += " DEFERRABLE"
    if constraint.deferred:
        text += " INITIALLY DEFERRED"
    return text


def _index_definition(index: LiveIndex, options: Sequence[int]) -> str:
    """pg_get_indexdef's text: CREATE [UNIQUE] INDEX name ON public.t USING method (a, b DESC)."""
    keys = []
    for name, option in zip(index.columns[: index.key_count], options, strict=False):
        key = quote_identifier(name)
        if option & 1:
            key += " DESC" if option & 2 else " DESC NULLS LAST"
        elif option & 2:
            key += " NULLS FIRST"
        keys.append(key)
    text = (
        f"CREATE {'UNIQUE ' if index.unique else ''}INDEX {quote_identifier(index.name)} "
        f"ON public.{quote_identifier(index.table)} USING {index.method} ({', '.join(keys)})"
    )
    if index.key_count < len(index.columns):
        text += f" INCLUDE ({_columns(index.columns[index.key_count :])})"
    return text


def rule_name(letter: str) -> str:
    """information_schema's update_rule / delete_rule for a pg_constraint letter."""
    return _RULES.get(letter, "NO ACTION")
