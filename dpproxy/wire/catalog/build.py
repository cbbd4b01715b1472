"""Building the shadow database: PostgreSQL's built-in rows, the exposed tables' structure, the
lookup tables behind the reg* types and the macros, the macros (data/macros.sql) and the views
that compute the session-dependent relations (data/views.sql).

It runs once per catalog, on the connection shadow.py opens, before the configuration is locked.
It reads the built-in catalog and the exposed tables' names and column types, never a row of one.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from dpproxy.wire.catalog.builtin import DATA_DIR, PgColumn, PgData, PgRelation
from dpproxy.wire.catalog.objects import (
    ANALYST_ROLE_OID,
    BOOTSTRAP_ROLE_OID,
    CATALOG_NAMESPACE_OID,
    DATABASE_OID,
    OWNER_NAME,
    PUBLIC_NAMESPACE_OID,
    VERSION_STRING,
    ShadowTable,
)
from dpproxy.wire.catalog.pg_types import TYPE_NAMES, duck_type, parse_pg_array
from dpproxy.wire.catalog.structure import (
    EQUALITY_OPERATORS,
    NO_NUMBERED_STRUCTURE,
    NumberedStructure,
    constraint_definition,
)
from dpproxy.wire.router import QUOTED_KEYWORDS, Token, quote_identifier, split_statements, tokenize


@dataclass(frozen=True)
class Lookups:
    """OIDs and names of everything in the shadow, as the reg* types read and print them."""

    relations: Mapping[int, str]  # oid → regclass text
    relation_namespace: Mapping[int, int]
    relation_keys: Mapping[str, int]  # 'name' (on the search path) and 'schema.name' → oid
    types: Mapping[
        int, tuple[int, str, str]
    ]  # oid → (namespace, format_type(oid, NULL), format_type(oid, -1))
    type_keys: Mapping[str, int]  # every name ::regtype reads → oid
    namespaces: Mapping[int, str]
    procs: Mapping[int, str]  # oid → regproc text, for the built-in functions the catalog refers to
    proc_keys: Mapping[str, int]
    roles: Mapping[int, str]  # built-in roles; the analyst is ANALYST_ROLE_OID, named per session
    descriptions: tuple[tuple[int, int, int, str], ...]  # (objoid, classoid, objsubid, text)


def make_lookups(
    data: PgData, tables: Sequence[ShadowTable], structure: NumberedStructure = NO_NUMBERED_STRUCTURE
) -> Lookups:
    namespace_ids = {name: oid for oid, name in data.namespaces.items()}

    def display(schema: str, name: str) -> str:
        on_path = schema in ("pg_catalog", "public")
        return quote_identifier(name) if on_path else f"{quote_identifier(schema)}.{quote_identifier(name)}"

    entries = (
        [(r.schema, r.name, r.oid) for r in data.relations]
        + [("public", t.name, t.oid) for t in tables]
        + [("public", i.name, i.oid) for i in structure.indexes]
    )
    relations = {oid: display(schema, name) for schema, name, oid in entries}
    relation_keys = {f"{schema}.{name}": oid for schema, name, oid in entries}
    # An unqualified name finds pg_catalog first, then public: PostgreSQL's implicit search path.
    for schema in ("public", "pg_catalog"):
        relation_keys.update({name: oid for s, name, oid in entries if s == schema})

    types: dict[int, tuple[int, str, str]] = {}
    ranked: dict[str, tuple[int, int]] = {}

    def name_type(key: str, oid: int, rank: int) -> None:
        key = key.lower()
        if key not in ranked or ranked[key][1] > rank:
            ranked[key] = (oid, rank)

    for oid, row in data.types.items():
        fmt_null, fmt_default = data.format_type.get(oid, (row.name, row.name))
        types[oid] = (row.namespace, fmt_null, fmt_default)
        if row.namespace in (CATALOG_NAMESPACE_OID, PUBLIC_NAMESPACE_OID):
            name_type(row.name, oid, 0)
            name_type(fmt_default, oid, 1)
            name_type(fmt_null, oid, 1)
        name_type(f"{data.namespaces.get(row.namespace, '')}.{row.name}", oid, 2)
    for name, oid in TYPE_NAMES.items():
        if not name.startswith("__"):
            name_type(name, oid, 1)
    for table in tables:
        types[table.rowtype_oid] = (PUBLIC_NAMESPACE_OID, table.name, table.name)
        types[table.arraytype_oid] = (PUBLIC_NAMESPACE_OID, table.name + "[]", table.name + "[]")
        name_type(table.name, table.rowtype_oid, 0)
        name_type(f"public.{table.name}", table.rowtype_oid, 2)
    for key, (oid, _) in list(ranked.items()):
        if array := data.array_of(oid) if oid in data.types else None:
            name_type(key + "[]", array, 3)

    columns, rows = data.tables["pg_roles"]
    roles = {row[columns.index("oid")]: row[columns.index("rolname")] for row in rows}
    columns, rows = data.tables["pg_proc"]
    at = {c: i for i, c in enumerate(columns)}
    procs: dict[int, str] = {}
    proc_keys: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: r[at["oid"]]):
        oid, name, namespace = row[at["oid"]], row[at["proname"]], row[at["pronamespace"]]
        schema = data.namespaces.get(namespace, "")
        procs[oid] = display(schema, name)
        proc_keys.setdefault(f"{schema}.{name}", oid)
        if namespace in (CATALOG_NAMESPACE_OID, PUBLIC_NAMESPACE_OID):
            proc_keys.setdefault(name, oid)
    return Lookups(
        relations=relations,
        relation_namespace={oid: namespace_ids[schema] for schema, _, oid in entries},
        relation_keys=relation_keys,
        types=types,
        type_keys={k: oid for k, (oid, _) in ranked.items()},
        namespaces=dict(data.namespaces),
        procs=procs,
        proc_keys=proc_keys,
        roles=roles,
        descriptions=data.descriptions,
    )


# Catalog tables holding PostgreSQL's built-in rows (pg15.json); every other relation starts empty.
_STATIC = (
    "pg_type",
    "pg_namespace",
    "pg_am",
    "pg_collation",
    "pg_language",
    "pg_tablespace",
    "pg_range",
    "pg_opclass",
    "pg_extension",
    "pg_proc",
)


def build_database(
    conn: duckdb.DuckDBPyConnection,
    data: PgData,
    tables: Sequence[ShadowTable],
    lookups: Lookups,
    structure: NumberedStructure = NO_NUMBERED_STRUCTURE,
) -> None:
    conn.execute("CREATE SCHEMA public")
    conn.execute("CREATE SCHEMA pg_information_schema")
    for table in tables:
        columns = ", ".join(f"{_quote(n)} {duck_type(t, data)}" for n, t in table.columns) or "__none INTEGER"
        conn.execute(f"CREATE TABLE public.{_quote(table.name)} ({columns})")
    by_name = {(r.schema, r.name): r for r in data.relations}
    # The relations computed from the session or from other relations rather than stored: a view
    # each (data/views.sql), over a stored table of the same columns (__base_<name>) where it reads one.
    early, late = view_statements(data, by_name)
    for relation in data.relations:
        columns = ", ".join(f"{_quote(c.name)} {duck_type(c.type_oid, data)}" for c in relation.columns)
        computed = (relation.schema, relation.name) in early or (relation.schema, relation.name) in late
        conn.execute(f"CREATE TABLE {_base(relation) if computed else _target(relation)} ({columns})")
    _load_static(conn, data, tables, by_name, structure)
    _load_structure(conn, data, by_name, structure)
    _load_lookups(conn, data, lookups, structure)
    conn.execute(_INIT_PRIVS)
    # Views and macros refer to each other: the views over stored tables, the macros, then the
    # views that call macros.
    for statement in (*early.values(), *macro_statements(), *late.values()):
        conn.execute(statement)


# pg_init_privs: the built-in objects' privileges are their initial ones, as in a fresh PostgreSQL
# (pg_dump dumps a catalog object's ACL only where it differs from these).
_INIT_PRIVS = """
INSERT INTO main.pg_init_privs (objoid, classoid, objsubid, privtype, initprivs)
SELECT oid, 1259, 0, 'i', relacl FROM main.__base_pg_class WHERE relacl IS NOT NULL AND relnamespace <> 2200
UNION ALL SELECT oid, 2615, 0, 'i', nspacl FROM main.pg_namespace WHERE nspacl IS NOT NULL
UNION ALL SELECT oid, 1255, 0, 'i', proacl FROM main.pg_proc WHERE proacl IS NOT NULL
"""


def _target(relation: PgRelation) -> str:
    schema = "main" if relation.schema == "pg_catalog" else "pg_information_schema"
    return f"{schema}.{_quote(relation.name)}"


def _base(relation: PgRelation) -> str:
    """The stored table behind a computed relation."""
    schema = "main" if relation.schema == "pg_catalog" else "pg_information_schema"
    return f"{schema}.{_quote('__base_' + relation.name)}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _insert(
    conn: duckdb.DuckDBPyConnection, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    if not rows:
        return
    names = ", ".join(_quote(c) for c in columns)
    # Column lists unnested side by side: one statement, and DuckDB converts the Python lists
    # natively (executemany costs a statement per row, literal VALUES a parse per value).
    unnests = ", ".join(f"unnest(${i + 1})" for i in range(len(columns)))
    conn.execute(
        f"INSERT INTO {table} ({names}) SELECT {unnests}",
        [[row[i] for row in rows] for i in range(len(columns))],
    )


def _load_static(
    conn: duckdb.DuckDBPyConnection,
    data: PgData,
    tables: Sequence[ShadowTable],
    by_name: Mapping[tuple[str, str], PgRelation],
    structure: NumberedStructure,
) -> None:
    """PostgreSQL's built-in rows, and pg_class / pg_type / pg_attribute rows for the exposed tables
    and their indexes."""
    for name in _STATIC:
        columns, rows = data.tables[name]
        relation = by_name[("pg_catalog", name)]
        types = {c.name: c.type_oid for c in relation.columns}
        cleaned = [
            [_stored(value, types[c], data) for c, value in zip(columns, row, strict=True)] for row in rows
        ]
        if name == "pg_type":
            cleaned += _exposed_type_rows(columns, rows, tables)
        _insert(conn, _target(relation), columns, cleaned)

    # pg_roles: the built-in roles; the view adds the session's analyst. The owner of the exposed
    # tables and of the catalog is an ordinary role that cannot log in: no one connects as it, and
    # \du must not show a superuser that does not exist.
    columns, rows = data.tables["pg_roles"]
    ordinary = dict.fromkeys(
        ("rolsuper", "rolcreaterole", "rolcreatedb", "rolcanlogin", "rolreplication", "rolbypassrls"), False
    )
    rows = [
        [
            ordinary.get(c, v) if row[columns.index("oid")] == BOOTSTRAP_ROLE_OID else v
            for c, v in zip(columns, row, strict=True)
        ]
        for row in rows
    ]
    _insert(conn, _base(by_name[("pg_catalog", "pg_roles")]), columns, rows)

    # pg_class: the catalog relations and the exposed tables, all with an empty table's statistics.
    columns, rows = data.tables["pg_class"]
    empty = {"reltuples": -1.0, "relpages": 0, "relallvisible": 0, "reloptions": None, "relpartbound": None}
    class_rows = [[empty.get(c, v) for c, v in zip(columns, row, strict=True)] for row in rows]
    template = dict(zip(columns, rows[0], strict=True))
    indexed = {i.table.oid for i in structure.indexes}
    # PostgreSQL enforces a foreign key with triggers on both tables (psql's \d reads this flag
    # before it lists "Foreign-key constraints" and "Referenced by").
    triggered = {c.table.oid for c in structure.constraints if c.kind == "f"} | {
        c.referenced.oid for c in structure.constraints if c.kind == "f" and c.referenced is not None
    }
    for table in tables:
        values = {
            **template,
            **empty,
            "oid": table.oid,
            "relname": table.name,
            "relnamespace": PUBLIC_NAMESPACE_OID,
            "reltype": table.rowtype_oid,
            "reloftype": 0,
            "relowner": BOOTSTRAP_ROLE_OID,
            "relam": 2,  # heap
            "relfilenode": table.oid,
            "reltablespace": 0,
            "reltoastrelid": 0,
            "relhasindex": table.oid in indexed,
            "relisshared": False,
            "relpersistence": "p",
            "relkind": "r",
            "relnatts": len(table.columns),
            "relchecks": 0,
            "relhasrules": False,
            "relhastriggers": table.oid in triggered,
            "relhassubclass": False,
            "relrowsecurity": False,
            "relforcerowsecurity": False,
            "relispopulated": True,
            "relreplident": "d",
            "relispartition": False,
            "relrewrite": 0,
            "relfrozenxid": 0,
            "relminmxid": 1,
            "relacl": None,
        }
        class_rows.append([values[c] for c in columns])
    for index in structure.indexes:
        values = {
            **template,
            **empty,
            "oid": index.oid,
            "relname": index.name,
            "relnamespace": PUBLIC_NAMESPACE_OID,
            "reltype": 0,
            "reloftype": 0,
            "relowner": BOOTSTRAP_ROLE_OID,
            "relam": index.method,
            "relfilenode": index.oid,
            "reltablespace": 0,
            "reltuples": 0.0,
            "reltoastrelid": 0,
            "relhasindex": False,
            "relisshared": False,
            "relpersistence": "p",
            "relkind": "i",
            "relnatts": len(index.attnums),
            "relchecks": 0,
            "relhasrules": False,
            "relhastriggers": False,
            "relhassubclass": False,
            "relrowsecurity": False,
            "relforcerowsecurity": False,
            "relispopulated": True,
            "relreplident": "n",
            "relispartition": False,
            "relrewrite": 0,
            "relfrozenxid": 0,
            "relminmxid": 0,
            "relacl": None,
        }
        class_rows.append([values[c] for c in columns])
    _insert(conn, _base(by_name[("pg_catalog", "pg_class")]), columns, class_rows)

    # pg_attribute: the columns of every catalog relation and of the exposed tables.
    relation = by_name[("pg_catalog", "pg_attribute")]
    att_columns = [c.name for c in relation.columns]

    def attribute(relid: int, attnum: int, column: PgColumn) -> list[Any]:
        row = data.types.get(column.type_oid)
        values = {
            "attrelid": relid,
            "attname": column.name,
            "atttypid": column.type_oid,
            "attstattarget": -1,
            "attlen": row.length if row else -1,
            "attnum": attnum,
            "attndims": 1 if row and row.category == "A" else 0,
            "attcacheoff": -1,
            "atttypmod": column.typmod,
            "attbyval": row.byval if row else False,
            "attalign": row.align if row else "i",
            "attstorage": row.storage if row else "p",
            "attcompression": "",
            "attnotnull": column.notnull,
            "atthasdef": False,
            "atthasmissing": False,
            "attidentity": "",
            "attgenerated": "",
            "attisdropped": False,
            "attislocal": True,
            "attinhcount": 0,
            "attcollation": column.collation,
        }
        return [values.get(c) for c in att_columns]

    att_rows = [attribute(r.oid, i + 1, c) for r in data.relations for i, c in enumerate(r.columns)]
    for table in tables:
        for i, (name, type_oid) in enumerate(table.columns):
            row = data.types.get(type_oid)
            notnull = (table.oid, i + 1) in structure.not_null
            typmod = structure.typmods.get((table.oid, i + 1), -1)
            att_rows.append(
                attribute(
                    table.oid, i + 1, PgColumn(name, type_oid, typmod, notnull, row.collation if row else 0)
                )
            )
    for index in structure.indexes:
        # An index's columns, named and typed as the table's it indexes.
        for i, attnum in enumerate(index.attnums):
            name, type_oid = index.table.columns[attnum - 1]
            row = data.types.get(type_oid)
            typmod = structure.typmods.get((index.table.oid, attnum), -1)
            att_rows.append(
                attribute(
                    index.oid, i + 1, PgColumn(name, type_oid, typmod, False, row.collation if row else 0)
                )
            )
    _insert(conn, _target(relation), att_columns, att_rows)


def _load_structure(
    conn: duckdb.DuckDBPyConnection,
    data: PgData,
    by_name: Mapping[tuple[str, str], PgRelation],
    structure: NumberedStructure,
) -> None:
    """pg_index and pg_constraint rows for the exposed tables' indexes and keys (structure.py)."""
    opclass_columns, opclass_rows = data.tables["pg_opclass"]
    at = {c: i for i, c in enumerate(opclass_columns)}
    default_opclass = {
        (row[at["opcmethod"]], row[at["opcintype"]]): row[at["oid"]]
        for row in opclass_rows
        if row[at["opcdefault"]]
    }

    def opclass(method: int, type_oid: int) -> int:
        # varchar and bpchar compare with text's operator class, as in PostgreSQL.
        key = 25 if type_oid in (1043, 1042) else type_oid
        return default_opclass.get((method, key), 0)

    relation = by_name[("pg_catalog", "pg_index")]
    index_columns = [c.name for c in relation.columns]
    index_rows = []
    for index in structure.indexes:
        types = [index.table.columns[n - 1][1] for n in index.attnums]
        collations = [data.types[t].collation if t in data.types else 0 for t in types]
        values = {
            "indexrelid": index.oid,
            "indrelid": index.table.oid,
            "indnatts": len(index.attnums),
            "indnkeyatts": index.key_count,
            "indisunique": index.unique,
            "indnullsnotdistinct": False,
            "indisprimary": index.primary,
            "indisexclusion": False,
            "indimmediate": True,
            "indisclustered": False,
            "indisvalid": True,
            "indcheckxmin": False,
            "indisready": True,
            "indislive": True,
            "indisreplident": False,
            "indkey": list(index.attnums),
            "indcollation": collations[: index.key_count],
            "indclass": [opclass(index.method, t) for t in types[: index.key_count]],
            "indoption": list(index.options),
            "indexprs": None,
            "indpred": None,
        }
        index_rows.append([values[c] for c in index_columns])
    _insert(conn, _target(relation), index_columns, index_rows)

    relation = by_name[("pg_catalog", "pg_constraint")]
    constraint_columns = [c.name for c in relation.columns]
    constraint_rows = []
    for constraint in structure.constraints:
        live = constraint.live
        foreign = constraint.kind == "f"
        operators = [_equality(constraint.table.columns[n - 1][1]) for n in constraint.attnums]
        values = {
            "oid": constraint.oid,
            "conname": constraint.name,
            "connamespace": PUBLIC_NAMESPACE_OID,
            "contype": constraint.kind,
            "condeferrable": live.deferrable,
            "condeferred": live.deferred,
            "convalidated": True,
            "conrelid": constraint.table.oid,
            "contypid": 0,
            "conindid": constraint.index_oid,
            "conparentid": 0,
            "confrelid": constraint.referenced.oid if foreign and constraint.referenced else 0,
            "confupdtype": live.update_rule if foreign else " ",
            "confdeltype": live.delete_rule if foreign else " ",
            "confmatchtype": live.match if foreign else " ",
            "conislocal": True,
            "coninhcount": 0,
            "connoinherit": True,
            "conkey": list(constraint.attnums),
            "confkey": list(constraint.referenced_attnums) if foreign else None,
            "conpfeqop": operators if foreign and all(operators) else None,
            "conppeqop": operators if foreign and all(operators) else None,
            "conffeqop": operators if foreign and all(operators) else None,
            "confdelsetcols": None,
            "conexclop": None,
            "conbin": None,
        }
        constraint_rows.append([values[c] for c in constraint_columns])
    _insert(conn, _target(relation), constraint_columns, constraint_rows)


def _equality(type_oid: int) -> int:
    return EQUALITY_OPERATORS.get(type_oid, 0)


def _stored(value: Any, oid: int, data: PgData) -> Any:
    """A dumped value as the shadow stores it."""
    if value is None:
        return None
    if oid in (22, 30):
        return [int(v) for v in value.split()] if isinstance(value, str) else value
    if oid in (194, 2277):
        return None  # expression trees and statistics' value arrays: nothing of them is shown
    if isinstance(value, str) and data.element(oid) is not None:
        return parse_pg_array(value)
    return value


def _exposed_type_rows(
    columns: Sequence[str], rows: list[list[Any]], tables: Sequence[ShadowTable]
) -> list[list[Any]]:
    """Each exposed table's row type and array type, modelled on pg_class's own (OID 83)."""
    at = {c: i for i, c in enumerate(columns)}
    by_oid = {row[at["oid"]]: row for row in rows}
    composite = dict(zip(columns, by_oid[83], strict=True))
    array = dict(zip(columns, by_oid[composite["typarray"]], strict=True))
    out = []
    for table in tables:
        common = {
            "typnamespace": PUBLIC_NAMESPACE_OID,
            "typowner": BOOTSTRAP_ROLE_OID,
            "typacl": None,
            "typdefaultbin": None,
        }
        row = {
            **composite,
            **common,
            "oid": table.rowtype_oid,
            "typname": table.name,
            "typrelid": table.oid,
            "typarray": table.arraytype_oid,
        }
        out.append([row[c] for c in columns])
        row = {
            **array,
            **common,
            "oid": table.arraytype_oid,
            "typname": "_" + table.name,
            "typelem": table.rowtype_oid,
        }
        out.append([row[c] for c in columns])
    return out


def _load_lookups(
    conn: duckdb.DuckDBPyConnection, data: PgData, lookups: Lookups, structure: NumberedStructure
) -> None:
    """The tables behind the macros. Their columns are __-prefixed: see data/macros.sql."""
    tables = {
        "__condef": (
            "__oid UINTEGER, __text VARCHAR, __qualified VARCHAR",
            [
                [c.oid, c.definition, constraint_definition(c.live, qualified=True)]
                for c in structure.constraints
            ],
        ),
        # pg_get_indexdef(oid, n): the whole definition for n = 0, else the nth column's name.
        "__idxdef": (
            "__oid UINTEGER, __n INTEGER, __text VARCHAR",
            [[i.oid, 0, i.definition] for i in structure.indexes]
            + [
                [i.oid, k + 1, quote_identifier(i.table.columns[n - 1][0])]
                for i in structure.indexes
                for k, n in enumerate(i.attnums)
            ],
        ),
        "__rel": (
            "__oid UINTEGER, __nsp UINTEGER, __display VARCHAR",
            [[o, lookups.relation_namespace[o], d] for o, d in lookups.relations.items()],
        ),
        "__relkey": ("__key VARCHAR, __oid UINTEGER", list(map(list, lookups.relation_keys.items()))),
        "__typ": (
            "__oid UINTEGER, __nsp UINTEGER, __fmt_null VARCHAR, __fmt_default VARCHAR",
            [[o, *t] for o, t in lookups.types.items()],
        ),
        "__typkey": ("__key VARCHAR, __oid UINTEGER", list(map(list, lookups.type_keys.items()))),
        "__nsp": ("__oid UINTEGER, __name VARCHAR", list(map(list, lookups.namespaces.items()))),
        "__role": ("__oid UINTEGER, __name VARCHAR", list(map(list, lookups.roles.items()))),
        "__proc": ("__oid UINTEGER, __display VARCHAR", list(map(list, lookups.procs.items()))),
        "__prockey": ("__key VARCHAR, __oid UINTEGER", list(map(list, lookups.proc_keys.items()))),
        "__desc": (
            "__objoid UINTEGER, __classoid UINTEGER, __objsubid INTEGER, __text VARCHAR",
            list(map(list, lookups.descriptions)),
        ),
        "__settings": (
            "name VARCHAR, unit VARCHAR, category VARCHAR, short_desc VARCHAR, extra_desc VARCHAR, "
            "context VARCHAR, vartype VARCHAR, min_val VARCHAR, max_val VARCHAR, enumvals VARCHAR[], "
            "boot_val VARCHAR",
            [[*s[:9], parse_pg_array(s[9]) if isinstance(s[9], str) else s[9], s[10]] for s in data.settings],
        ),
        "__keywords": (
            "word VARCHAR, catcode VARCHAR, barelabel BOOLEAN, catdesc VARCHAR, baredesc VARCHAR",
            list(map(list, data.keywords)),
        ),
    }
    for name, (definition, rows) in tables.items():
        conn.execute(f"CREATE TABLE main.{name} ({definition})")
        _insert(conn, f"main.{name}", [c.split()[0] for c in definition.split(", ")], rows)
    _insert(
        conn,
        "main.pg_description",
        ["objoid", "classoid", "objsubid", "description"],
        list(map(list, lookups.descriptions)),
    )


@functools.cache
def macro_statements() -> tuple[str, ...]:
    template = string.Template((DATA_DIR / "macros.sql").read_text(encoding="utf-8"))
    text = template.safe_substitute(
        version=VERSION_STRING,
        analyst_role_oid=ANALYST_ROLE_OID,
        quoted_keywords=", ".join(f"'{w}'" for w in sorted(QUOTED_KEYWORDS)),
    )
    return tuple(split_statements(text))


def sql_string(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return sql_string(str(value))


def view_statements(
    data: PgData, by_name: Mapping[tuple[str, str], PgRelation]
) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    """The computed relations (data/views.sql), each with exactly PostgreSQL's columns in its order,
    by (schema, name): (views over stored tables only, views that call macros), in the file's order."""
    template = string.Template((DATA_DIR / "views.sql").read_text(encoding="utf-8"))
    text = template.substitute(
        owner=OWNER_NAME,
        analyst_role_oid=ANALYST_ROLE_OID,
        bootstrap_role_oid=BOOTSTRAP_ROLE_OID,
        database_oid=DATABASE_OID,
        public_namespace_oid=PUBLIC_NAMESPACE_OID,
        dumped_database=", ".join(f"{_sql_literal(v)} AS {_quote(k)}" for k, v in data.database.items()),
    )
    early, marker, late = text.partition("\n-- @macros\n")
    if not marker:
        raise ValueError("views.sql: the line `-- @macros` is missing")
    views: tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]] = ({}, {})
    for part, section in zip(views, (early, late), strict=True):
        for statement in split_statements(section):
            key, view = _view(statement, data, by_name)
            if key in views[0] or key in views[1]:
                raise ValueError(f"views.sql: {key[0]}.{key[1]} is defined twice")
            part[key] = view
    return views


def _view(
    statement: str, data: PgData, by_name: Mapping[tuple[str, str], PgRelation]
) -> tuple[tuple[str, str], str]:
    """`CREATE VIEW schema.name AS SELECT <expression> AS <column>, … <rest>` as the view DuckDB
    gets: every column of the relation, in order, cast to the shadow's type (NULL when not named)."""
    tokens = tokenize(statement)
    head = [t.value for t in tokens[:7]]
    if len(head) < 7 or head[:2] != ["create", "view"] or head[3] != "." or head[5:] != ["as", "select"]:
        raise ValueError(f"views.sql: not CREATE VIEW schema.name AS SELECT …: {statement[:80]!r}")
    relation = by_name.get((head[2], head[4]))
    if relation is None:
        raise ValueError(f"views.sql: {head[2]}.{head[4]} is not a relation of PostgreSQL's catalog")
    columns = {c.name for c in relation.columns}
    # The SELECT list: items split at commas outside parentheses and brackets, up to FROM or WHERE.
    items: list[list[Token]] = [[]]
    rest = ""
    depth = 0
    for token in tokens[7:]:
        if depth == 0 and token.is_word("from", "where"):
            rest = statement[token.start :]
            break
        if token.text in ("(", "["):
            depth += 1
        elif token.text in (")", "]"):
            depth -= 1
        elif depth == 0 and token.text == ",":
            items.append([])
            continue
        items[-1].append(token)
    values: dict[str, str] = {}
    for item in items:
        if not item:
            continue
        if len(item) == 3 and item[1].text == "." and item[2].text == "*":
            values.update({c.name: f"{item[0].text}.{_quote(c.name)}" for c in relation.columns})
            continue
        if len(item) < 3 or not item[-2].is_word("as") or item[-1].value not in columns:
            raise ValueError(
                f"views.sql: {head[2]}.{head[4]}: each item is `<expression> AS <one of its columns>`, "
                f"not {statement[item[0].start : item[-1].end]!r}"
            )
        values[item[-1].value] = statement[item[0].start : item[-2].start].strip()
    listed = ", ".join(
        f"CAST({values.get(c.name, 'NULL')} AS {duck_type(c.type_oid, data)}) AS {_quote(c.name)}"
        for c in relation.columns
    )
    return (head[2], head[4]), f"CREATE VIEW {_target(relation)} AS SELECT {listed} {rest}"
