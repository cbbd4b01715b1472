"""The shadow catalog: catalog and table-free queries answered without the data (DESIGN §6).

Clients browse a database before they query it: psql's \\dt and \\d, drivers' type lookups,
SQLAlchemy's Inspector, JDBC's DatabaseMetaData, BI tools' schema sync. dpproxy answers them here,
from an embedded, locked-down, in-memory DuckDB that holds only what the policy exposes: empty
tables named as the policy names them (schema `public`) and a PostgreSQL 15 catalog
(pg_catalog, information_schema) describing them. It holds no row of any exposed table, so no
statistic (reltuples, pg_stats, sizes) can describe real data, and no object outside the policy:
another table, schema, database or analyst of the real server does not exist here.

This module owns that database, the translation of PostgreSQL catalog SQL into SQL DuckDB runs,
and the PostgreSQL shape of the results. DuckDB's parser reads PostgreSQL's grammar; what its
binder lacks is added as macros (catalog_data/macros.sql) and lookup tables, and what it cannot
bind is rewritten on the sqlglot tree: OPERATOR(pg_catalog.~), COLLATE "default", ::regclass and
the other reg* types (OIDs inside, names outside), int2vector, array literals, format(), scalar
functions in FROM. Every result column gets the name and type OID PostgreSQL would send (name,
oid, "char", regtype …), inferred over the catalog's column types, since DuckDB's own result types
cannot tell name from text. SQL sqlglot cannot parse still runs, typed by DuckDB alone.

It must never touch the data backend or the real database, never hold a row of an exposed table,
and never show DuckDB's internals: its functions are refused and its errors become PostgreSQL's
(42883, 42P01, 42703, 42704, 0A000). Nor may it answer as if it had done what it cannot do: a
function that would act (change a setting, sleep, draw a random number, signal a backend, take a
lock, write) is refused by name with what to do instead, never answered with a made-up value.

The static half of the catalog (built-in types and functions, catalog relations and their
columns, collations, access methods, settings' descriptions) is PostgreSQL 15's own, dumped once
into catalog_data/pg15.json by catalog_data/dump_pg15.py; the rest comes from
`engine.exposed_tables()`.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import string
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import sqlglot
from sqlglot import exp

from dpproxy.errors import (
    DPProxyError,
    InvalidParameter,
    InvalidText,
    NotSupported,
    PolicyViolation,
    QueryCanceled,
    SyntaxProblem,
    UndefinedColumn,
    UndefinedFunction,
    UndefinedObject,
    UndefinedParameter,
    UndefinedTable,
)
from dpproxy.wire.router import (
    MAX_PARAMETERS,
    QUOTED_KEYWORDS,
    LexError,
    Token,
    TokenKind,
    quote_identifier,
    split_statements,
    tokenize,
)
from dpproxy.wire.types import WireColumn, wire_type

if TYPE_CHECKING:
    from dpproxy.engine import Engine, ExposedTable


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

SERVER_VERSION = "15.0 (dpproxy 0.1)"
VERSION_STRING = "PostgreSQL 15.0 (dpproxy 0.1) on x86_64-pc-linux-gnu, compiled by dpproxy"


@dataclass(frozen=True)
class SessionInfo:
    """What the catalog needs to know of the session asking."""

    user: str  # the analyst: current_user, session_user, the one login role in pg_roles
    database: str  # current_database(), the one row of pg_database
    application_name: str = ""
    backend_pid: int = 0
    settings: Mapping[str, str] = field(default_factory=dict)  # for current_setting(), pg_settings


@dataclass(frozen=True)
class CatalogResult:
    columns: tuple[WireColumn, ...]
    rows: list[tuple[Any, ...]]
    tag: str  # CommandComplete, e.g. "SELECT 3"


class ShadowCatalog(ABC):
    """Answers catalog and table-free queries. Thread-safe: called from worker threads."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[object], session: SessionInfo) -> CatalogResult:
        """Run one SELECT. `params` are Python values as decoded (str for text, lists for arrays);
        text the query needs as another type is converted as PostgreSQL would."""

    @abstractmethod
    def describe(
        self, sql: str, param_oids: Sequence[int], session: SessionInfo
    ) -> tuple[list[int], list[WireColumn]]:
        """(parameter type OIDs, result columns) of a statement, without running it.

        A parameter the client sent with OID 0 gets the type PostgreSQL would infer from its
        context, or text when nothing says otherwise."""

    @abstractmethod
    def close(self) -> None: ...


def open_catalog(engine: Engine) -> ShadowCatalog:
    """The shadow catalog of an engine's policy: its exposed tables' structure, never their data."""
    return DuckDBShadowCatalog(engine.exposed_tables())


# Values of the settings a client may read with current_setting() or from pg_settings (SHOW is
# answered by the session). Names as PostgreSQL spells them; lookups ignore case. The session's
# own settings (SessionInfo.settings) take precedence.
DEFAULT_SETTINGS: Mapping[str, str] = {
    "application_name": "",
    "array_nulls": "on",
    "backslash_quote": "safe_encoding",
    "block_size": "8192",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
    "client_min_messages": "notice",
    "DateStyle": "ISO, MDY",
    "default_table_access_method": "heap",  # SQLAlchemy's table reflection reads it
    "default_tablespace": "",
    "default_text_search_config": "pg_catalog.simple",
    "default_transaction_deferrable": "off",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
    "escape_string_warning": "on",
    "extra_float_digits": "1",
    "idle_in_transaction_session_timeout": "0",
    "integer_datetimes": "on",
    "IntervalStyle": "postgres",
    "is_superuser": "off",
    "jit": "on",
    "lc_collate": "C",
    "lc_ctype": "C",
    "lc_messages": "C",
    "lc_monetary": "C",
    "lc_numeric": "C",
    "lc_time": "C",
    "lock_timeout": "0",
    "max_connections": "100",
    "max_function_args": "100",
    "max_identifier_length": "63",
    "max_index_keys": "32",
    "password_encryption": "scram-sha-256",
    "row_security": "on",
    "search_path": '"$user", public',
    "server_encoding": "UTF8",
    "server_version": SERVER_VERSION,
    "server_version_num": "150000",
    "ssl": "off",
    "standard_conforming_strings": "on",
    "statement_timeout": "0",
    "temp_tablespaces": "",
    "TimeZone": "UTC",
    "timezone_abbreviations": "Default",
    "transaction_deferrable": "off",
    "transaction_isolation": "read committed",
    "transaction_read_only": "off",
    "work_mem": "4MB",
    "xmloption": "content",
}


# ---------------------------------------------------------------------------------------------
# What the shadow holds beyond PostgreSQL's built-in catalog
# ---------------------------------------------------------------------------------------------

BOOTSTRAP_ROLE_OID = 10  # "dpproxy": owns the database, the catalog and the exposed tables
OWNER_NAME = "dpproxy"
ANALYST_ROLE_OID = 16384  # the session's analyst, granted SELECT on the exposed tables only
DATABASE_OID = 16385
FIRST_TABLE_OID = 16386
TABLE_OID_STRIDE = 5  # relation, its array type, its row type: a fresh PostgreSQL's spacing
CATALOG_NAMESPACE_OID = 11
PUBLIC_NAMESPACE_OID = 2200


@dataclass(frozen=True)
class ShadowTable:
    """An exposed table as the shadow shows it, with the OIDs it was given."""

    name: str
    oid: int
    rowtype_oid: int
    arraytype_oid: int
    columns: tuple[tuple[str, int], ...]  # (column, pg_type OID)


def shadow_tables(exposed: Iterable[ExposedTable]) -> tuple[ShadowTable, ...]:
    """OIDs for the exposed tables in policy order: 16386, 16391, … as in a fresh PostgreSQL."""
    tables = []
    for i, table in enumerate(exposed):
        oid = FIRST_TABLE_OID + TABLE_OID_STRIDE * i
        columns = tuple((name, wire_type(pg_type).oid) for name, pg_type in table.columns)
        tables.append(ShadowTable(table.name, oid, oid + 2, oid + 1, columns))
    return tuple(tables)


# ---------------------------------------------------------------------------------------------
# PostgreSQL 15's built-in catalog (catalog_data/pg15.json)
# ---------------------------------------------------------------------------------------------

DATA_DIR = Path(__file__).with_name("catalog_data")


@dataclass(frozen=True)
class PgColumn:
    name: str
    type_oid: int
    typmod: int
    notnull: bool
    collation: int


@dataclass(frozen=True)
class PgRelation:
    schema: str
    name: str
    oid: int
    relkind: str
    reltype: int
    columns: tuple[PgColumn, ...]


@dataclass(frozen=True)
class PgTypeRow:
    oid: int
    name: str
    namespace: int
    length: int
    byval: bool
    typtype: str
    category: str
    elem: int
    array: int
    basetype: int
    typmod: int
    align: str
    storage: str
    collation: int


@dataclass(frozen=True)
class PgData:
    relations: tuple[PgRelation, ...]
    tables: Mapping[str, tuple[tuple[str, ...], list[list[Any]]]]  # name → (columns, rows)
    types: Mapping[int, PgTypeRow]
    format_type: Mapping[int, tuple[str, str]]  # oid → (format_type(oid, NULL), format_type(oid, -1))
    settings: tuple[tuple[Any, ...], ...]
    keywords: tuple[tuple[Any, ...], ...]
    descriptions: tuple[tuple[int, int, int, str], ...]
    database: Mapping[str, Any]
    namespaces: Mapping[int, str]

    def base_type(self, oid: int) -> int:
        """The type a domain stands for (RowDescription sends base types); other types unchanged."""
        for _ in range(10):
            row = self.types.get(oid)
            if row is None or row.typtype != "d":
                break
            oid = row.basetype
        return oid

    def element(self, oid: int) -> int | None:
        """The element type of an array type (int2vector and oidvector included), else None."""
        if oid in (22, 30):
            return {22: 21, 30: 26}[oid]
        row = self.types.get(oid)
        if row is None or row.elem == 0 or row.length != -1:
            return None
        return row.elem

    def array_of(self, oid: int) -> int | None:
        row = self.types.get(oid)
        return row.array if row is not None and row.array else None


@functools.cache
def load_pg_data() -> PgData:
    raw = json.loads((DATA_DIR / "pg15.json").read_text(encoding="utf-8"))
    relations = tuple(
        PgRelation(
            r["schema"],
            r["name"],
            r["oid"],
            r["relkind"],
            r["reltype"],
            tuple(PgColumn(*c) for c in r["columns"]),
        )
        for r in raw["relations"]
    )
    tables = {name: (tuple(t["columns"]), t["rows"]) for name, t in raw["tables"].items()}
    columns, rows = tables["pg_type"]
    at = {c: i for i, c in enumerate(columns)}
    types = {
        row[at["oid"]]: PgTypeRow(
            oid=row[at["oid"]],
            name=row[at["typname"]],
            namespace=row[at["typnamespace"]],
            length=row[at["typlen"]],
            byval=row[at["typbyval"]],
            typtype=row[at["typtype"]],
            category=row[at["typcategory"]],
            elem=row[at["typelem"]],
            array=row[at["typarray"]],
            basetype=row[at["typbasetype"]],
            typmod=row[at["typtypmod"]],
            align=row[at["typalign"]],
            storage=row[at["typstorage"]],
            collation=row[at["typcollation"]],
        )
        for row in rows
    }
    columns, rows = tables["pg_namespace"]
    namespaces = {row[columns.index("oid")]: row[columns.index("nspname")] for row in rows}
    return PgData(
        relations=relations,
        tables=tables,
        types=types,
        format_type={int(k): (v[0], v[1]) for k, v in raw["format_type"].items()},
        settings=tuple(tuple(s) for s in raw["settings"]),
        keywords=tuple(tuple(k) for k in raw["keywords"]),
        descriptions=tuple((d[0], d[1], d[2], d[3]) for d in raw["descriptions"]),
        database=raw["database"],
        namespaces=namespaces,
    )


@functools.cache
def _macro_statements() -> tuple[str, ...]:
    template = string.Template((DATA_DIR / "macros.sql").read_text(encoding="utf-8"))
    text = template.safe_substitute(
        version=VERSION_STRING,
        analyst_role_oid=ANALYST_ROLE_OID,
        quoted_keywords=", ".join(f"'{w}'" for w in sorted(QUOTED_KEYWORDS)),
    )
    return tuple(split_statements(text))


# ---------------------------------------------------------------------------------------------
# PostgreSQL types inside DuckDB
# ---------------------------------------------------------------------------------------------

UNKNOWN = 705  # an untyped literal; text once it reaches the output
RECORD = 2249
# reg* values are OIDs inside the shadow (they compare with oid columns, as in PostgreSQL) and
# names on the way out. __to_<name>(x) and __<name>_out(oid) are the macros that convert them.
REG_TYPES = {
    24: "regproc",
    2202: "regprocedure",
    2205: "regclass",
    2206: "regtype",
    4089: "regnamespace",
    4096: "regrole",
}
OID_LIKE = frozenset({26, 28, 29, 5069, *REG_TYPES, 2203, 2204, 3734, 3769, 4191})
INTEGER_TYPES = frozenset({20, 21, 23})
TEXT_TYPES = frozenset({18, 19, 25, 1042, 1043})

_DUCK_TYPES = {
    16: "BOOLEAN",
    17: "BLOB",
    20: "BIGINT",
    21: "SMALLINT",
    22: "SMALLINT[]",
    23: "INTEGER",
    30: "UINTEGER[]",
    114: "JSON",
    700: "FLOAT",
    701: "DOUBLE",
    1082: "DATE",
    1083: "TIME",
    1114: "TIMESTAMP",
    1184: "TIMESTAMPTZ",
    1186: "INTERVAL",
    1266: "TIMETZ",
    # numeric without a typmod: DuckDB needs a fixed scale; the padding zeros are trimmed on output.
    1700: "DECIMAL(38, 10)",
    2950: "UUID",
    3802: "JSON",
    5069: "UBIGINT",
}


def duck_type(oid: int, data: PgData) -> str:
    """The DuckDB type a value of this PostgreSQL type is kept as in the shadow."""
    if oid in _DUCK_TYPES:
        return _DUCK_TYPES[oid]
    if oid in OID_LIKE:
        return "UINTEGER"
    row = data.types.get(oid)
    if row is None:
        return "VARCHAR"
    if row.typtype == "d":
        return duck_type(row.basetype, data)
    element = data.element(oid)
    if element is not None:
        inner = duck_type(element, data)
        return "VARCHAR[]" if inner.endswith("]") else inner + "[]"
    return "VARCHAR"


# DuckDB result types → PostgreSQL, for columns whose type the query itself did not tell.
_FROM_DUCK = {
    "BOOLEAN": 16,
    "TINYINT": 21,
    "SMALLINT": 21,
    "INTEGER": 23,
    "BIGINT": 20,
    "HUGEINT": 1700,
    "UTINYINT": 21,
    "USMALLINT": 23,
    "UINTEGER": 26,
    "UBIGINT": 1700,
    "UHUGEINT": 1700,
    "FLOAT": 700,
    "DOUBLE": 701,
    "VARCHAR": 25,
    "JSON": 114,
    "BLOB": 17,
    "DATE": 1082,
    "TIME": 1083,
    "TIMESTAMP": 1114,
    "TIMESTAMP_S": 1114,
    "TIMESTAMP_MS": 1114,
    "TIMESTAMP_NS": 1114,
    "TIMESTAMP WITH TIME ZONE": 1184,
    "TIME WITH TIME ZONE": 1266,
    "INTERVAL": 1186,
    "UUID": 2950,
    "NULL": 25,
}
_INTEGER_DUCK = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT"}
)


def _pg_oid_of_duck(duck: str, data: PgData) -> int:
    text = duck.upper().strip('"')
    if text.endswith("[]"):
        element = _pg_oid_of_duck(text[:-2], data)
        return data.array_of(element) or 1009
    if text.startswith("DECIMAL"):
        return 1700
    if text.startswith("STRUCT"):
        return RECORD
    return _FROM_DUCK.get(text, 25)


def _compatible(pg_oid: int, duck: str, data: PgData) -> bool:
    """Whether DuckDB values of type `duck` can be sent as PostgreSQL type `pg_oid`."""
    text = duck.upper().strip('"')
    expected = duck_type(pg_oid, data).upper()
    expected = {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE", "TIMETZ": "TIME WITH TIME ZONE"}.get(
        expected, expected
    )
    if text in ("NULL", expected) or (expected.startswith("DECIMAL") and text.startswith("DECIMAL")):
        return True
    if text.endswith("[]"):
        element = data.element(pg_oid)
        return element is not None and _compatible(element, text[:-2], data)
    if pg_oid in OID_LIKE or pg_oid in INTEGER_TYPES:
        return text in _INTEGER_DUCK
    if pg_oid == 1700:
        return text in _INTEGER_DUCK
    if pg_oid in (700, 701):
        return text in ("FLOAT", "DOUBLE")
    if pg_oid == 1114:
        return text.startswith("TIMESTAMP") and "ZONE" not in text
    return False


# Type names as PostgreSQL's grammar reads them (aliases included) → OID.
_TYPE_NAMES = {
    "int": 23,
    "integer": 23,
    "int4": 23,
    "smallint": 21,
    "int2": 21,
    "bigint": 20,
    "int8": 20,
    "real": 700,
    "float4": 700,
    "float": 701,
    "double precision": 701,
    "double": 701,
    "float8": 701,
    "decimal": 1700,
    "numeric": 1700,
    "text": 25,
    "varchar": 1043,
    "character varying": 1043,
    "char": 1042,
    "character": 1042,
    "bpchar": 1042,
    "boolean": 16,
    "bool": 16,
    "date": 1082,
    "timestamp": 1114,
    "timestamp without time zone": 1114,
    "timestamptz": 1184,
    "timestamp with time zone": 1184,
    "time": 1083,
    "time without time zone": 1083,
    "timetz": 1266,
    "time with time zone": 1266,
    "interval": 1186,
    "json": 114,
    "jsonb": 3802,
    "uuid": 2950,
    "bytea": 17,
    "name": 19,
    '"char"': 18,
    "oid": 26,
    "__pg_oid": 26,  # what the token pass turns `oid[]` into, which sqlglot cannot parse
}


@functools.cache
def _type_names_by_typname() -> dict[str, int]:
    return {row.name: oid for oid, row in sorted(load_pg_data().types.items(), reverse=True)}


def _type_oid_from_name(text: str, data: PgData) -> int | None:
    """OID of a type as sqlglot renders it in PostgreSQL syntax ('DECIMAL(10, 2)', 'INT[]', 'REGCLASS')."""
    name = text.strip().lower()
    if name.endswith("[]"):
        element = _type_oid_from_name(name[:-2], data)
        return data.array_of(element) if element is not None else None
    name = re.sub(r"\s*\(.*\)\s*", " ", name).strip().removeprefix("pg_catalog.")
    if name.startswith("information_schema."):
        name = name.split(".", 1)[1]
    if name in _TYPE_NAMES:
        return _TYPE_NAMES[name]
    return _type_names_by_typname().get(name.strip('"'))


# ---------------------------------------------------------------------------------------------
# Functions: what they return and take, and what PostgreSQL names their result columns
# ---------------------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return text.split()


_RETURNS: dict[str, int] = {
    **dict.fromkeys(
        _names(
            """version format_type pg_get_expr pg_get_constraintdef pg_get_indexdef pg_get_viewdef
            pg_get_triggerdef pg_get_functiondef pg_get_function_arguments pg_get_function_result
            pg_get_function_identity_arguments pg_get_statisticsobjdef_columns pg_get_partkeydef
            pg_get_ruledef pg_get_serial_sequence obj_description col_description shobj_description
            current_setting pg_size_pretty array_to_string quote_ident quote_literal
            quote_nullable string_agg listagg upper lower btrim ltrim rtrim trim substr substring replace
            concat concat_ws left right lpad rpad initcap repeat reverse split_part regexp_replace
            translate md5 to_char format pg_tablespace_location textcat chr encode host text"""
        ),
        25,
    ),
    **dict.fromkeys(
        _names(
            """current_database current_schema current_user session_user current_role user
            current_catalog pg_get_userbyid pg_encoding_to_char pg_client_encoding getdatabaseencoding"""
        ),
        19,
    ),
    **dict.fromkeys(
        _names(
            """pg_table_is_visible pg_type_is_visible pg_function_is_visible pg_collation_is_visible
            pg_opclass_is_visible pg_operator_is_visible pg_conversion_is_visible pg_opfamily_is_visible
            pg_ts_config_is_visible pg_ts_dict_is_visible pg_ts_parser_is_visible pg_ts_template_is_visible
            pg_statistics_obj_is_visible has_table_privilege has_schema_privilege has_database_privilege
            has_column_privilege has_any_column_privilege has_function_privilege has_sequence_privilege
            has_type_privilege has_language_privilege has_tablespace_privilege
            has_foreign_data_wrapper_privilege has_server_privilege pg_has_role pg_is_in_recovery
            pg_relation_is_publishable pg_is_other_temp_schema pg_jit_available row_security_active
            bool_and bool_or every regexp_like starts_with"""
        ),
        16,
    ),
    **dict.fromkeys(
        _names(
            """pg_backend_pid array_upper array_lower array_length cardinality array_ndims
            generate_subscripts length char_length character_length octet_length position strpos
            inet_server_port inet_client_port pg_char_to_encoding pg_encoding_max_length ascii"""
        ),
        23,
    ),
    **dict.fromkeys(
        _names(
            """pg_table_size pg_relation_size pg_total_relation_size pg_indexes_size pg_database_size
            count row_number rank dense_rank ntile pg_stat_get_numscans
            pg_stat_get_tuples_returned pg_stat_get_tuples_fetched pg_stat_get_tuples_inserted
            pg_stat_get_tuples_updated pg_stat_get_tuples_deleted pg_stat_get_tuples_hot_updated
            pg_stat_get_live_tuples pg_stat_get_dead_tuples pg_stat_get_blocks_fetched pg_stat_get_blocks_hit
            pg_stat_get_mod_since_analyze pg_stat_get_ins_since_vacuum pg_stat_get_vacuum_count
            pg_stat_get_analyze_count pg_stat_get_autovacuum_count pg_stat_get_autoanalyze_count"""
        ),
        20,
    ),
    **dict.fromkeys(_names("json_build_object json_object json_agg to_json row_to_json array_to_json"), 114),
    **dict.fromkeys(_names("jsonb_build_object jsonb_agg to_jsonb"), 3802),
    **dict.fromkeys(
        _names(
            """now statement_timestamp transaction_timestamp clock_timestamp pg_postmaster_start_time
            pg_conf_load_time pg_stat_get_last_vacuum_time pg_stat_get_last_autovacuum_time
            pg_stat_get_last_analyze_time pg_stat_get_last_autoanalyze_time"""
        ),
        1184,
    ),
    **dict.fromkeys(_names("regexp_match regexp_split_to_array string_to_array"), 1009),
    **dict.fromkeys(_names("inet_server_addr inet_client_addr"), 869),
    "current_schemas": 1003,
    "to_regtype": 2206,
    "pg_typeof": 2206,
    "to_regclass": 2205,
    "to_regproc": 24,
    "to_regprocedure": 2202,
    "to_regnamespace": 4089,
    "to_regrole": 4096,
    "pg_my_temp_schema": 26,
    **{f"__to_{name}": oid for oid, name in REG_TYPES.items()},
}

# Argument types, for parameters standing as a function's argument ($n with no type of its own).
_ARGUMENTS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        _names("to_regtype to_regclass to_regproc to_regnamespace to_regrole to_regprocedure"), (25,)
    ),
    **dict.fromkeys(_names("quote_ident quote_literal upper lower length"), (25,)),
    **dict.fromkeys(_names("pg_table_size pg_relation_size pg_total_relation_size"), (2205,)),
    **dict.fromkeys(_names("array_upper array_lower array_length"), (2277, 23)),
    **dict.fromkeys(_names("pg_table_is_visible pg_type_is_visible pg_get_userbyid"), (26,)),
    "current_setting": (25, 16),
    "format_type": (26, 23),
    "pg_get_expr": (194, 26, 16),
    "pg_get_constraintdef": (26, 16),
    "pg_get_indexdef": (26, 23, 16),
    "pg_get_viewdef": (26, 16),
    "obj_description": (26, 19),
    "col_description": (26, 23),
    "shobj_description": (26, 19),
    "pg_encoding_to_char": (23,),
    "generate_subscripts": (2277, 23),
    "generate_series": (23, 23, 23),
    "pg_size_pretty": (20,),
    "has_table_privilege": (25, 25, 25),
    "has_schema_privilege": (25, 25, 25),
    "pg_get_serial_sequence": (25, 25),
    "current_schemas": (16,),
    "array_to_string": (2277, 25, 25),
}

# sqlglot's classes for functions → the name PostgreSQL gives them (return types, column names).
_FUNCTION_NAMES: dict[type[exp.Expression], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Max: "max",
    exp.Min: "min",
    exp.ArrayAgg: "array_agg",
    exp.GroupConcat: "string_agg",
    exp.Coalesce: "coalesce",
    exp.Nullif: "nullif",
    exp.Greatest: "greatest",
    exp.Least: "least",
    exp.Upper: "upper",
    exp.Lower: "lower",
    exp.Length: "length",
    exp.Substring: "substring",
    exp.Trim: "btrim",
    exp.Concat: "concat",
    exp.ConcatWs: "concat_ws",
    exp.RowNumber: "row_number",
    exp.Unnest: "unnest",
    exp.CurrentUser: "current_user",
    exp.SessionUser: "session_user",
    exp.CurrentSchema: "current_schema",
    exp.CurrentCatalog: "current_catalog",
    exp.CurrentVersion: "version",
    exp.CurrentTimestamp: "now",
    exp.CurrentDate: "current_date",
    exp.ExplodingGenerateSeries: "generate_series",
    exp.GenerateSeries: "generate_series",
    exp.LogicalAnd: "bool_and",
    exp.LogicalOr: "bool_or",
    exp.ArrayToString: "array_to_string",
    exp.Round: "round",
    exp.Abs: "abs",
    exp.Left: "left",
    exp.Right: "right",
    exp.StrPosition: "strpos",
    exp.RegexpReplace: "regexp_replace",
    exp.Replace: "replace",
    exp.Pad: "lpad",
    exp.Initcap: "initcap",
    exp.JSONObject: "json_build_object",
    exp.ToChar: "to_char",
    exp.SplitPart: "split_part",
    exp.ArraySize: "array_length",
    exp.StringToArray: "string_to_array",
    exp.Format: "format",
}

# Functions PostgreSQL reads as relations in FROM (the others are one-row relations there).
_TABLE_FUNCTIONS = frozenset(
    _names(
        """generate_series unnest generate_subscripts pg_get_keywords __pg_expandarray json_each
        json_each_text jsonb_each jsonb_each_text regexp_matches json_array_elements jsonb_array_elements
        pg_options_to_table aclexplode"""
    )
)

_PREDICATES = (
    exp.Predicate,
    exp.Connector,
    exp.Not,
    exp.Exists,
    exp.In,
    exp.Between,
    exp.Is,
    exp.Any,
    exp.All,
    exp.RegexpLike,
    exp.RegexpILike,
    exp.Like,
    exp.ILike,
    exp.SimilarTo,
)


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    for cls in type(node).__mro__:
        if cls in _FUNCTION_NAMES:
            return _FUNCTION_NAMES[cls]
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def _is_table_function(node: exp.Expression) -> bool:
    if isinstance(node, (exp.Unnest, exp.ExplodingGenerateSeries, exp.GenerateSeries)):
        return True
    return (_function_name(node) or "") in _TABLE_FUNCTIONS


def _arguments(node: exp.Expression) -> list[exp.Expression]:
    return list(node.expressions) if isinstance(node, exp.Anonymous) else list(node.iter_expressions())


def _ident(node: exp.Expression | None) -> str:
    """An identifier as PostgreSQL folds it: unquoted to lower case."""
    if isinstance(node, exp.Identifier):
        return node.this if node.quoted else node.this.lower()
    return node.name.lower() if node is not None else ""


def _param_index(node: exp.Parameter) -> int:
    value = node.this
    return int(value.this if isinstance(value, exp.Literal) else str(value))


# ---------------------------------------------------------------------------------------------
# Typing a query: PostgreSQL's names and types of its outputs and parameters
# ---------------------------------------------------------------------------------------------


@dataclass
class _Col:
    name: str
    oid: int | None
    table_oid: int = 0  # RowDescription's origin of a column read unchanged from a catalog relation
    attnum: int = 0
    typmod: int = -1


@dataclass(frozen=True)
class _Rel:
    oid: int
    columns: tuple[_Col, ...]


class _Scope:
    """The relations a SELECT reads, by alias, and the scope around it (correlated subqueries)."""

    def __init__(self, parent: _Scope | None = None) -> None:
        self.parent = parent
        self.sources: list[tuple[str, list[_Col]]] = []

    def resolve(self, table: str | None, name: str) -> _Col | None:
        scope: _Scope | None = self
        while scope is not None:
            for alias, columns in scope.sources:
                if table is not None and alias != table:
                    continue
                for column in columns:
                    if column.name == name:
                        return column
                if table is not None:
                    return None  # a relation's name used as a row value: not typed here
            scope = scope.parent
        return None

    def relation_oid(self, table: str | None) -> int:
        """The pg_class OID of the relation `table` names (or of the only one, when None); 0 when
        it is not one relation of the catalog or of the policy."""
        if table is None:
            if len(self.sources) != 1:
                return 0
            columns: list[_Col] | None = self.sources[0][1]
        else:
            columns = self.source(table)
        oids = {c.table_oid for c in columns or ()}
        return oids.pop() if len(oids) == 1 else 0

    def source(self, table: str) -> list[_Col] | None:
        scope: _Scope | None = self
        while scope is not None:
            for alias, columns in scope.sources:
                if alias == table:
                    return columns
            scope = scope.parent
        return None


class _Typer:
    """Types every expression it visits (node.meta["pg_type"]) and infers parameter types."""

    def __init__(self, relations: Mapping[tuple[str, str], _Rel], data: PgData) -> None:
        self.relations = relations
        self.data = data
        self.params: dict[int, int] = {}
        self.ctes: Mapping[str, list[_Col]] = {}  # the CTEs visible where the typer is

    def relation(self, schema: str | None, name: str) -> _Rel | None:
        if schema in ("pg_information_schema", "information_schema"):
            return self.relations.get(("information_schema", name))
        if schema is not None:
            return self.relations.get((schema, name))
        return self.relations.get(("pg_catalog", name)) or self.relations.get(("public", name))

    # -- queries -------------------------------------------------------------------------------

    def query(self, node: exp.Expression, outer: _Scope | None, ctes: Mapping[str, list[_Col]]) -> list[_Col]:
        """The output columns of a query."""
        if isinstance(node, (exp.Subquery, exp.Paren)):
            return self.query(node.this, outer, ctes)
        ctes = self.with_clause(node, outer, ctes)
        enclosing, self.ctes = self.ctes, ctes
        try:
            return self._query(node, outer, ctes)
        finally:
            self.ctes = enclosing

    def _query(
        self, node: exp.Expression, outer: _Scope | None, ctes: Mapping[str, list[_Col]]
    ) -> list[_Col]:
        if isinstance(node, exp.SetOperation):
            left = self.query(node.left, outer, ctes)
            right = self.query(node.right, outer, ctes)
            merged = []
            for i, column in enumerate(left):
                oid = column.oid
                other = right[i].oid if i < len(right) else None
                if oid in (None, UNKNOWN) and other not in (None, UNKNOWN):
                    oid = other
                merged.append(_Col(column.name, oid))
            return merged
        if isinstance(node, exp.Values):
            first = node.expressions[0] if node.expressions else None
            items = first.expressions if isinstance(first, exp.Tuple) else []
            return [_Col(f"column{i + 1}", self.type(e, _Scope(outer))) for i, e in enumerate(items)]
        if not isinstance(node, exp.Select):
            return []
        scope = _Scope(outer)
        from_ = node.args.get("from_") or node.args.get("from")
        if from_ is not None:
            self.add_source(from_.this, scope, ctes)
        for join in node.args.get("joins") or []:
            self.add_source(join.this, scope, ctes)
        columns: list[_Col] = []
        for projection in node.expressions:
            if isinstance(projection, exp.Star):
                for _, cols in scope.sources:
                    columns.extend(_Col(c.name, c.oid, c.table_oid, c.attnum, c.typmod) for c in cols)
            elif isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
                cols = scope.source(_ident(projection.args.get("table"))) or []
                columns.extend(_Col(c.name, c.oid, c.table_oid, c.attnum, c.typmod) for c in cols)
            else:
                oid = self.type(projection, scope)
                origin = self.origin(projection, scope) or _Col("", None)
                columns.append(
                    _Col(self.column_name(projection), oid, origin.table_oid, origin.attnum, origin.typmod)
                )
        # Type the rest of the SELECT too: rewrites (casts of reg* values, array literals) and
        # parameter inference rely on it.
        for key in ("where", "having", "qualify"):
            clause = node.args.get(key)
            if clause is not None:
                self.type(clause.this, scope)
        for join in node.args.get("joins") or []:
            if join.args.get("on") is not None:
                self.type(join.args["on"], scope)
        for key in ("group", "order"):
            clause = node.args.get(key)
            for item in clause.expressions if clause is not None else []:
                self.type(item.this if isinstance(item, exp.Ordered) else item, scope)
        for param in node.find_all(exp.Parameter):
            if param.find_ancestor(exp.Select) is node:
                self.param_context(param, scope)
        return columns

    def with_clause(
        self, node: exp.Expression, outer: _Scope | None, ctes: Mapping[str, list[_Col]]
    ) -> Mapping[str, list[_Col]]:
        with_ = node.args.get("with_") or node.args.get("with")
        if with_ is None:
            return ctes
        known = dict(ctes)
        for cte in with_.expressions:
            alias = cte.args.get("alias")
            name = _ident(alias.this) if alias is not None else cte.alias_or_name
            names = [_ident(c) for c in alias.columns] if alias is not None and alias.columns else None
            body = cte.this
            if names:
                # A recursive CTE refers to itself: its names first, its types from the first branch.
                known[name] = [_Col(n, None) for n in names]
                if isinstance(body, exp.SetOperation):
                    body = body.left
            columns = self.query(body, outer, known)
            if names:
                columns = [_Col(n, columns[i].oid if i < len(columns) else None) for i, n in enumerate(names)]
            known[name] = columns
        return known

    def add_source(self, source: exp.Expression, scope: _Scope, ctes: Mapping[str, list[_Col]]) -> None:
        alias_node = source.args.get("alias")
        alias = _ident(alias_node.this) if isinstance(alias_node, exp.TableAlias) and alias_node.this else ""
        renames = [_ident(c) for c in alias_node.columns] if isinstance(alias_node, exp.TableAlias) else []
        if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
            name = _ident(source.this)
            schema = _ident(source.args.get("db")) if source.args.get("db") else None
            if schema is None and name in ctes:
                columns = [_Col(c.name, c.oid) for c in ctes[name]]
            else:
                relation = self.relation(schema, name)
                columns = [
                    _Col(c.name, c.oid, c.table_oid, c.attnum, c.typmod)
                    for c in (relation.columns if relation else ())
                ]
            alias = alias or name
        elif isinstance(source, exp.Table):
            columns = self.function_columns(source.this, scope, alias)
        elif isinstance(source, exp.Unnest):
            columns = self.function_columns(source, scope, alias)
        elif isinstance(source, exp.Subquery) and _is_join_group(source):
            self.add_source(source.this, scope, ctes)
            for join in source.args.get("joins") or []:
                self.add_source(join.this, scope, ctes)
            return
        elif isinstance(source, exp.Subquery):
            columns = self.query(source.this, scope, ctes)
        elif isinstance(source, exp.Lateral):
            self.add_source(source.this, scope, ctes)
            return
        else:
            columns = []
        for i, rename in enumerate(renames[: len(columns)]):
            columns[i] = _Col(rename, columns[i].oid)
        scope.sources.append((alias, columns))
        for join in source.args.get("joins") or [] if isinstance(source, exp.Table) else []:
            self.add_source(join.this, scope, ctes)

    def function_columns(self, function: exp.Expression, scope: _Scope, alias: str) -> list[_Col]:
        name = _function_name(function) or ""
        args = _arguments(function)
        if name == "generate_series":
            start = self.type(function.args.get("start") or (args[0] if args else None), scope)
            return [_Col(alias or name, start if start in INTEGER_TYPES else 23)]
        if name == "unnest" and args:
            return [_Col(alias or name, self.element(self.type(args[0], scope)))]
        if name == "__pg_expandarray" and args:
            return [_Col("x", self.element(self.type(args[0], scope))), _Col("n", 23)]
        if name == "pg_get_keywords":
            return [
                _Col(n, o)
                for n, o in (
                    ("word", 25),
                    ("catcode", 18),
                    ("barelabel", 16),
                    ("catdesc", 25),
                    ("baredesc", 25),
                )
            ]
        for arg in args:
            self.type(arg, scope)
        return [_Col(alias or name, _RETURNS.get(name))]

    # -- column names --------------------------------------------------------------------------

    def column_name(self, node: exp.Expression) -> str:
        """PostgreSQL's FigureColname: an alias, a column's or function's name, or ?column?."""
        if isinstance(node, exp.Alias):
            return _ident(node.args.get("alias"))
        name, _ = self._figure(node)
        return name or "?column?"

    def _figure(self, node: exp.Expression) -> tuple[str | None, int]:
        """(name, strength): 2 for a column or function name, 1 for a type name or "case"."""
        if isinstance(node, exp.Column):
            return _ident(node.this), 2
        if isinstance(node, exp.Dot):
            return _ident(node.expression), 2
        if isinstance(node, (exp.Paren, exp.Bracket, exp.Window, exp.Filter)):
            return self._figure(node.this)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            name, strength = self._figure(node.this)
            if strength > 1:
                return name, strength
            row = self.data.types.get(node.meta.get("pg_type", -1))
            return (row.name if row is not None else node.to.sql("postgres").lower()), 1
        if isinstance(node, exp.Subquery):
            inner = node.this
            if isinstance(inner, exp.Select) and inner.expressions:
                return self.column_name(inner.expressions[0]), 2
            return None, 0
        if isinstance(node, exp.Array):
            return "array", 2
        if isinstance(node, exp.Exists):
            return "exists", 2
        if isinstance(node, exp.Case):
            default = node.args.get("default")
            if default is not None:
                name, strength = self._figure(default)
                if strength > 1:
                    return name, strength
            return "case", 1
        name = _function_name(node)
        if name is not None and not isinstance(node, (exp.Binary, exp.Unary)):
            return name.removeprefix("__"), 2
        return None, 0

    # -- types ---------------------------------------------------------------------------------

    def element(self, oid: int | None) -> int | None:
        return self.data.element(oid) if oid is not None else None

    def origin(self, node: exp.Expression, scope: _Scope) -> _Col | None:
        if isinstance(node, exp.Alias):
            node = node.this
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            table = _ident(node.args.get("table")) if node.args.get("table") else None
            column = scope.resolve(table, _ident(node.this))
            if column is not None and column.table_oid:
                return column
        return None

    def type(self, node: exp.Expression | None, scope: _Scope) -> int | None:
        if node is None:
            return None
        oid = self._type(node, scope)
        if oid is not None:
            node.meta["pg_type"] = oid
        return oid

    def _type(self, node: exp.Expression, scope: _Scope) -> int | None:
        if isinstance(node, (exp.Alias, exp.Paren, exp.Window, exp.Filter, exp.Neg)):
            return self.type(node.this, scope)
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                return None
            table = _ident(node.args.get("table")) if node.args.get("table") else None
            name = _ident(node.this)
            column = scope.resolve(table, name)
            if column is not None:
                return self.data.base_type(column.oid) if column.oid is not None else None
            if table is None and name in ("user", "current_role", "current_user", "session_user"):
                return 19
            if name == "tableoid":
                # The system column (psql's \dd, \dL join pg_description on it): the OID of
                # the relation the row is in, which the rewrite puts in as a constant.
                relation_oid = scope.relation_oid(table)
                if relation_oid:
                    node.meta["tableoid"] = relation_oid
                    return 26
            return None
        if isinstance(node, (exp.Cast, exp.TryCast)):
            self.type(node.this, scope)
            oid = _type_oid_from_name(node.to.sql("postgres"), self.data)
            return self.data.base_type(oid) if oid is not None else None
        if isinstance(node, exp.Literal):
            if node.is_string:
                return UNKNOWN
            if re.fullmatch(r"\d+", node.this):
                value = int(node.this)
                return 23 if value < 2**31 else 20 if value < 2**63 else 1700
            return 1700
        if isinstance(node, (exp.RawString, exp.UnicodeString, exp.National, exp.HexString, exp.Null)):
            return UNKNOWN
        if isinstance(node, exp.Boolean):
            return 16
        if isinstance(node, exp.Parameter):
            return self.params.get(_param_index(node)) or UNKNOWN
        if isinstance(node, exp.DPipe):
            sides = (self.type(node.this, scope), self.type(node.expression, scope))
            arrays = [
                s for s in sides if s is not None and s not in (22, 30) and self.data.element(s) is not None
            ]
            return arrays[0] if arrays else 25
        if isinstance(node, _PREDICATES):
            for child in node.iter_expressions():
                self.type(child, scope)
            return 16
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.BitwiseAnd, exp.BitwiseOr)):
            return _arithmetic(self.type(node.this, scope), self.type(node.expression, scope))
        if isinstance(node, exp.Case):
            self.type(node.this, scope)
            for branch in node.args.get("ifs") or []:
                self.type(branch.this, scope)
            results = [branch.args.get("true") for branch in node.args.get("ifs") or []]
            return self.first_known([*results, node.args.get("default")], scope)
        if isinstance(node, exp.If):
            return self.first_known([node.args.get("true"), node.args.get("false")], scope)
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            return self.first_known([node.this, *node.expressions], scope)
        if isinstance(node, exp.Nullif):
            self.type(node.expression, scope)
            return self.first_known([node.this], scope)
        if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
            columns = self.query(node, scope, self.ctes)
            return columns[0].oid if columns else None
        if isinstance(node, exp.Array):
            items = node.expressions
            if len(items) == 1 and isinstance(items[0], (exp.Select, exp.Subquery, exp.SetOperation)):
                columns = self.query(items[0], scope, self.ctes)
                element = columns[0].oid if columns else None
            else:
                element = self.first_known(items, scope)
            return self.data.array_of(25 if element == UNKNOWN else element) if element is not None else None
        if isinstance(node, exp.Bracket):
            base = self.type(node.this, scope)
            for item in node.expressions:
                self.type(item, scope)
            slicing = bool(node.expressions) and isinstance(node.expressions[0], exp.Slice)
            return base if slicing else self.element(base)
        if isinstance(node, exp.Dot):
            inner = node.this.this if isinstance(node.this, exp.Paren) else node.this
            if _function_name(inner) == "__pg_expandarray":
                args = _arguments(inner)
                field_name = _ident(node.expression)
                return 23 if field_name == "n" else self.element(self.type(args[0] if args else None, scope))
            return None
        if isinstance(node, exp.Count):
            for child in node.iter_expressions():
                self.type(child, scope)
            return 20
        if isinstance(node, (exp.Max, exp.Min, exp.Abs, exp.Round)):
            return self.type(node.this, scope)
        if isinstance(node, exp.Sum):
            arg = self.type(node.this, scope)
            return 20 if arg in (21, 23) else 701 if arg in (700, 701) else 1700 if arg is not None else None
        if isinstance(node, exp.Avg):
            arg = self.type(node.this, scope)
            return 701 if arg in (700, 701) else 1700 if arg is not None else None
        if isinstance(node, exp.ArrayAgg):
            target = node.this.this if isinstance(node.this, exp.Order) else node.this
            arg = self.type(target, scope)
            return self.data.array_of(25 if arg == UNKNOWN else arg) if arg is not None else None
        if isinstance(node, exp.Unnest):
            return self.element(self.type(node.expressions[0], scope)) if node.expressions else None
        if isinstance(node, (exp.ExplodingGenerateSeries, exp.GenerateSeries)):
            start = self.type(node.args.get("start"), scope)
            self.type(node.args.get("end"), scope)
            return start if start in INTEGER_TYPES else 23
        name = _function_name(node)
        if name is None:
            return None
        args = _arguments(node)
        for arg in args:
            self.type(arg, scope)
        if name == "unnest" and args:
            return self.element(args[0].meta.get("pg_type"))
        return _RETURNS.get(name)

    def first_known(self, nodes: Sequence[exp.Expression | None], scope: _Scope) -> int | None:
        """PostgreSQL's select_common_type, simply: the first typed branch; text if all are literals."""
        result: int | None = None
        for node in nodes:
            oid = self.type(node, scope)
            if result is None and oid not in (None, UNKNOWN):
                result = oid
        if result is None and any(n is not None for n in nodes):
            return 25
        return result

    # -- parameters ----------------------------------------------------------------------------

    def param_context(self, param: exp.Parameter, scope: _Scope) -> None:
        """The type PostgreSQL infers for an untyped parameter from where it stands."""
        index = _param_index(param)
        if index in self.params:
            return
        node: exp.Expression = param
        parent = node.parent
        while isinstance(parent, exp.Paren):
            node, parent = parent, parent.parent
        oid: int | None = None
        if isinstance(parent, (exp.Cast, exp.TryCast)):
            oid = _type_oid_from_name(parent.to.sql("postgres"), self.data)
        elif isinstance(parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ)):
            other = parent.expression if parent.this is node else parent.this
            oid = None if isinstance(other, (exp.Any, exp.All)) else self.type(other, scope)
        elif isinstance(parent, exp.In):
            oid = self.type(parent.this, scope)
        elif isinstance(parent, (exp.Limit, exp.Offset)):
            oid = 20
        elif isinstance(parent, (exp.Like, exp.ILike, exp.DPipe, exp.RegexpLike, exp.RegexpILike)):
            oid = 25
        elif isinstance(parent, (exp.Any, exp.All)):
            comparison = parent.parent
            if isinstance(comparison, exp.Binary):
                element = self.type(comparison.this, scope)
                oid = self.data.array_of(element) if element is not None else None
        elif isinstance(parent, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
            oid = self.type(parent.expression if parent.this is node else parent.this, scope)
        elif isinstance(parent, exp.Func):
            args = _arguments(parent)
            types = _ARGUMENTS.get(_function_name(parent) or "", ())
            if node in args and args.index(node) < len(types):
                oid = types[args.index(node)]
        if oid not in (None, UNKNOWN):
            self.params[index] = oid  # type: ignore[assignment]


def _arithmetic(left: int | None, right: int | None) -> int | None:
    known = [t for t in (left, right) if t not in (None, UNKNOWN)]
    if not known:
        return None
    if any(t in (700, 701) for t in known):
        return 701
    if 1700 in known:
        return 1700
    ranks = {21: 0, 23: 1, 20: 2}
    if all(t in ranks for t in known):
        return max(known, key=lambda t: ranks[t])  # type: ignore[index]
    return known[0]


def _is_join_group(node: exp.Subquery) -> bool:
    """((a JOIN b ON …) JOIN c ON …): parentheses around joins rather than a subquery."""
    inner = node.this
    return isinstance(inner, exp.Table) or (isinstance(inner, exp.Subquery) and _is_join_group(inner))


# ---------------------------------------------------------------------------------------------
# Translation: PostgreSQL catalog SQL → SQL DuckDB runs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputColumn:
    name: str
    type_oid: int | None  # None: from DuckDB's result type
    table_oid: int = 0
    column_number: int = 0
    type_modifier: int = -1


@dataclass(frozen=True)
class Translation:
    sql: str  # what DuckDB runs
    columns: tuple[OutputColumn, ...] | None  # None when the query was not understood (DuckDB types)
    param_types: tuple[int, ...]  # inferred PostgreSQL types of $1, $2, … (0: not inferred)
    param_count: int


# Keywords a client may use as a column label after AS; none of them names a type, so quoting
# them cannot change a CAST.
_RESERVED_LABELS = frozenset(
    _names(
        """select insert update delete table from where group order having limit offset union all with into
        references grant check column constraint create default desc asc distinct do else end except for
        foreign full join left right natural only or and primary some then to unique using when window both
        case fetch in is like ilike user analyse analyze array current_user session_user returning
        symmetric tablesample trailing leading variadic verbose lateral"""
    )
)

# DuckDB's own functions, which reach its machinery rather than PostgreSQL's catalog.
_INTERNAL_FUNCTIONS = re.compile(
    r"\b(duckdb_\w+|pragma_\w+|read_\w+|glob|query|query_table|sniff_csv|parquet_\w+|iceberg_\w+|"
    r"delta_scan|json_execute_serialized_sql|which_secret|getvariable|enable_\w+|load_\w+|install_\w+|"
    r"summarize|checkpoint|test_\w+|repeat_row|range|getenv|icu_\w+|arrow_scan\w*|seq_scan|python_\w+|"
    # …and those that act (sleep, log, raise) or draw random numbers, under names PostgreSQL lacks.
    r"sleep_ms|write_log|error|rand|uuid|uuidv4|uuidv7|current_connection_id|current_query_id|"
    r"current_transaction_id|stats|vector_type)\s*\(",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Refusal:
    """Why the shadow refuses a PostgreSQL function that would act, and what to do instead."""

    error: type[DPProxyError]
    reason: str
    hint: str

    def exception(self, name: str) -> DPProxyError:
        if self.error is PolicyViolation:  # PostgreSQL's words for a function the role may not call
            return self.error(f"permission denied for function {name}: {self.reason}", hint=self.hint)
        return self.error(f"{name}() is not supported: {self.reason}", hint=self.hint)


def _refusals(names: str, error: type[DPProxyError], reason: str, hint: str) -> dict[str, _Refusal]:
    return dict.fromkeys(_names(names), _Refusal(error, reason, hint))


_ONLY_QUERIES = "dpproxy answers SELECT queries on the exposed tables and catalog queries"

# PostgreSQL functions that do something rather than describe the catalog. A shadow that answered
# them would answer as if it had done it (a setting changed, a sleep slept, a random number drawn,
# a lock taken) while it did nothing. dpproxy does none of these for analysts' SQL, so each is
# refused by name, with what works instead, even where PostgreSQL 15 would merely not know it.
_REFUSED_FUNCTIONS: Mapping[str, _Refusal] = {
    **_refusals(
        "set_config",
        NotSupported,
        "dpproxy runs set_config only in a SELECT of set_config and current_setting calls alone, "
        "with constants or parameters as arguments",
        "send it on its own, e.g. SELECT set_config('dpproxy.epsilon', '0.1', false), "
        "or use SET dpproxy.epsilon = 0.1 (SET LOCAL for is_local = true)",
    ),
    **_refusals(
        "pg_sleep pg_sleep_for pg_sleep_until",
        NotSupported,
        "dpproxy does not offer timing functions",
        "wait in the client instead",
    ),
    **_refusals(
        "random setseed gen_random_uuid",
        NotSupported,
        "dpproxy draws no randomness for analysts' SQL",
        "dpproxy adds the privacy noise to answers itself; draw other random numbers in the client",
    ),
    **_refusals(
        "pg_cancel_backend",
        NotSupported,
        "a dpproxy session cannot signal other sessions",
        "cancel your own running query with your client's cancel request (Ctrl-C in psql)",
    ),
    **_refusals(
        "pg_terminate_backend",
        NotSupported,
        "a dpproxy session cannot signal other sessions",
        "close the connection you want to end",
    ),
    **_refusals(
        """txid_current txid_current_if_assigned txid_current_snapshot pg_current_xact_id
        pg_current_xact_id_if_assigned pg_current_snapshot pg_export_snapshot""",
        NotSupported,
        "dpproxy is read-only and assigns no transaction IDs",
        "BEGIN, COMMIT and ROLLBACK work as usual; dpproxy answers each query on its own",
    ),
    **_refusals(
        "nextval currval setval lastval",
        NotSupported,
        "dpproxy is read-only and has no sequences",
        _ONLY_QUERIES,
    ),
    **_refusals(
        """pg_advisory_lock pg_advisory_lock_shared pg_advisory_unlock pg_advisory_unlock_shared
        pg_advisory_unlock_all pg_advisory_xact_lock pg_advisory_xact_lock_shared pg_try_advisory_lock
        pg_try_advisory_lock_shared pg_try_advisory_xact_lock pg_try_advisory_xact_lock_shared""",
        NotSupported,
        "dpproxy is read-only and takes no locks",
        _ONLY_QUERIES,
    ),
    **_refusals("pg_notify", NotSupported, "dpproxy has no LISTEN/NOTIFY", _ONLY_QUERIES),
    **_refusals(
        """lo_create lo_creat lo_import lo_export lo_unlink lo_open lo_close lo_get lo_put lo_from_bytea
        loread lowrite lo_lseek lo_lseek64 lo_tell lo_tell64 lo_truncate lo_truncate64""",
        NotSupported,
        "dpproxy has no large objects",
        _ONLY_QUERIES,
    ),
    **_refusals(
        "current_query",
        NotSupported,
        "the catalog runs a translation of the query, so the text it has is not the one you sent",
        "your client has the text of the query it sent",
    ),
    **_refusals(
        """pg_reload_conf pg_rotate_logfile pg_read_file pg_read_binary_file pg_ls_dir pg_stat_file
        pg_ls_logdir pg_ls_waldir pg_ls_tmpdir pg_ls_archive_statusdir pg_switch_wal pg_promote
        pg_create_restore_point pg_backup_start pg_backup_stop pg_stat_reset pg_stat_reset_shared
        pg_stat_reset_single_table_counters pg_stat_reset_single_function_counters pg_stat_reset_slru
        pg_log_backend_memory_contexts""",
        PolicyViolation,
        "a dpproxy analyst cannot reach the server's files, configuration, logs or statistics",
        _ONLY_QUERIES + "; the operator runs the server",
    ),
}


def _normalise_tokens(sql: str) -> str:
    """Rewrite, token by token, what neither sqlglot nor DuckDB reads; keep the rest as written.

    OPERATOR(pg_catalog.~) → ~. COLLATE x → dropped (the shadow compares bytewise, as "C" does).
    pg_catalog.x → x (the shadow's catalog relations and functions are unqualified).
    information_schema.x → pg_information_schema.x, or __x( for its functions (_pg_expandarray).
    ::oid[] → ::__pg_oid[] (sqlglot cannot parse it). AS select → AS "select".
    """
    tokens = tokenize(sql)
    out: list[str] = []
    last = 0

    def replace(start: int, text: str, resume: int) -> None:
        nonlocal last
        out.append(sql[last:start])
        out.append(text)
        last = resume

    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        after = tokens[i + 2] if i + 2 < len(tokens) else None
        if token.is_word("operator") and nxt is not None and nxt.text == "(":
            close = next((j for j in range(i + 2, len(tokens)) if tokens[j].text == ")"), None)
            if close is not None:
                replace(token.start, " " + tokens[close - 1].text + " ", tokens[close].end)
                i = close + 1
                continue
        if token.is_word("collate") and nxt is not None:
            j = i + 1
            while j + 2 < len(tokens) and tokens[j + 1].text == ".":
                j += 2
            replace(token.start, " ", tokens[j].end)
            i = j + 1
            continue
        if _is_name(token, "pg_catalog") and nxt is not None and nxt.text == "." and after is not None:
            replace(token.start, "", after.start)
            i += 2
            continue
        if (
            _is_name(token, "information_schema")
            and nxt is not None
            and nxt.text == "."
            and after is not None
        ):
            call = i + 3 < len(tokens) and tokens[i + 3].text == "("
            if call:
                replace(token.start, "__" + after.value.lstrip("_"), after.end)
                i += 3
            else:
                replace(token.start, "pg_information_schema.", after.start)
                i += 2
            continue
        previous = tokens[i - 1] if i else None
        if (
            token.kind is TokenKind.IDENT
            and token.value in _RESERVED_LABELS
            and previous is not None
            and previous.is_word("as")
            and not (nxt is not None and nxt.text in ("(", "."))
        ):
            replace(token.start, f'"{token.value}"', token.end)
            i += 1
            continue
        if (
            token.is_word("oid")
            and previous is not None
            and (previous.text == "::" or previous.is_word("as"))
            and nxt is not None
            and nxt.text == "["
        ):
            replace(token.start, "__pg_oid", token.end)
        i += 1
    out.append(sql[last:])
    return "".join(out)


def _is_name(token: Token, name: str) -> bool:
    return token.kind in (TokenKind.IDENT, TokenKind.QUOTED) and token.value == name


def _refuse_internals(sql: str) -> None:
    """DuckDB's own table functions are not PostgreSQL's: asking for one gets 42883. A PostgreSQL
    function that would act gets its refusal (_REFUSED_FUNCTIONS) before DuckDB sees the query,
    whether or not DuckDB has a function of that name."""
    tokens = tokenize(sql)
    # DuckDB finds a function whatever the case of its name, quoted or not: so must this.
    scrubbed = " ".join(
        "''" if t.kind is TokenKind.STRING else t.value if t.kind is TokenKind.QUOTED else t.text
        for t in tokens
    )
    match = _INTERNAL_FUNCTIONS.search(scrubbed)
    if match:
        raise UndefinedFunction(
            f"function {match.group(1).lower()} does not exist",
            hint="the catalog answers PostgreSQL's catalog queries (pg_catalog, information_schema)",
        )
    for i, token in enumerate(tokens[:-1]):
        if token.kind not in (TokenKind.IDENT, TokenKind.QUOTED) or tokens[i + 1].text != "(":
            continue
        refusal = _REFUSED_FUNCTIONS.get(token.value.lower())
        if refusal is not None and not (i and tokens[i - 1].is_word("as")):  # not FROM f() AS random(x)
            raise refusal.exception(token.value.lower())


def _parameter_count(sql: str) -> int:
    """The highest $n of a query ($n inside a string is text, not a parameter).

    Describe sizes the parameter list by it: `SELECT $100000000` would have the shadow build a list
    of 10⁸ types and values for one Parse. No Bind can carry more than MAX_PARAMETERS values, so a
    higher number is refused, as the router refuses it before a statement reaches the catalog.
    """
    count = max((int(t.text[1:]) for t in tokenize(sql) if t.kind is TokenKind.PARAM), default=0)
    if count > MAX_PARAMETERS:
        raise UndefinedParameter(
            f"there is no parameter ${count}", hint=f"a statement takes at most {MAX_PARAMETERS} parameters"
        )
    return count


def parse_pg_array(text: str) -> list[str | None]:
    """A one-dimensional PostgreSQL array literal ('{a,"b c",NULL}') as a list of str and None."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise InvalidText(f'malformed array literal: "{text}"', hint="write arrays as {a,b,c}")
    body = body[1:-1]
    items: list[str | None] = []
    i, n = 0, len(body)
    while body.strip() and i <= n:
        while i < n and body[i].isspace():
            i += 1
        if i < n and body[i] == '"':
            i += 1
            value = []
            while i < n and body[i] != '"':
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(body[i])
                i += 1
            items.append("".join(value))
            i += 1
        else:
            start = i
            while i < n and body[i] != ",":
                i += 1
            raw = body[start:i].strip()
            if raw.startswith("{"):
                raise NotSupported("multidimensional arrays are not supported by the shadow catalog")
            items.append(None if raw.upper() == "NULL" else raw)
        while i < n and body[i] != ",":
            i += 1
        i += 1
    return items


def _pg_format(template: str, args: list[exp.Expression]) -> exp.Expression:
    """PostgreSQL's format() with a constant template, as a concat() DuckDB runs.

    %s is the argument as text (NULL → ''), %I a quoted identifier, %L a quoted literal (NULL →
    NULL), %% a percent sign; %n$ picks the nth argument."""
    parts: list[exp.Expression] = []
    position = 0
    for piece in re.split(r"(%(?:\d+\$)?[sIL%])", template):
        match = re.fullmatch(r"%(?:(\d+)\$)?([sIL%])", piece)
        if match is None:
            if piece:
                parts.append(exp.Literal.string(piece))
            continue
        if match.group(2) == "%":
            parts.append(exp.Literal.string("%"))
            continue
        index = int(match.group(1)) - 1 if match.group(1) else position
        position = index + 1
        if index >= len(args):
            raise InvalidParameter("too few arguments for format()")
        arg = exp.Cast(this=args[index].copy(), to=exp.DataType.build("VARCHAR"))
        function = {"I": "quote_ident", "L": "quote_nullable"}.get(match.group(2))
        parts.append(exp.Anonymous(this=function, expressions=[arg]) if function else arg)
    return exp.Anonymous(this="concat", expressions=parts or [exp.Literal.string("")])


# SQL keywords sqlglot reads as functions of its own: the shadow's macros answer them.
_SESSION_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.CurrentCatalog: "current_database",
    exp.SessionUser: "session_user",
    exp.CurrentUser: "current_user",
    exp.CurrentSchema: "current_schema",
}


class _Translator:
    def __init__(self, data: PgData, relations: Mapping[tuple[str, str], _Rel]) -> None:
        self.data = data
        self.relations = relations

    def translate(self, sql: str) -> Translation:
        try:
            normalised = _normalise_tokens(sql)
        except LexError as exc:
            raise SyntaxProblem(str(exc)) from None
        _refuse_internals(normalised)
        _parameter_count(normalised)  # refuses a $n no client could bind before anything is sized by it
        try:
            trees = sqlglot.parse(normalised, read="postgres")
        except Exception:  # sqlglot raises several error types on what it cannot parse
            trees = []
        if len(trees) != 1 or not isinstance(trees[0], (exp.Query, exp.Values)):
            return self.untyped(normalised)
        tree = trees[0]
        typer = _Typer(self.relations, self.data)
        try:
            columns = typer.query(tree, None, {})
            rewritten = self.rewrite(tree, typer).sql(dialect="duckdb")
        except DPProxyError:
            raise
        except Exception:  # a construct the typer or a rewrite does not know: let DuckDB try
            return self.untyped(normalised)
        count = max((_param_index(p) for p in tree.find_all(exp.Parameter)), default=0)
        outputs = tuple(
            OutputColumn(c.name, 25 if c.oid == UNKNOWN else c.oid, c.table_oid, c.attnum, c.typmod)
            for c in columns
        )
        params = tuple(typer.params.get(i, 0) for i in range(1, count + 1))
        return Translation(rewritten, outputs or None, params, count)

    def untyped(self, normalised: str) -> Translation:
        """SQL sqlglot cannot parse: DuckDB runs the normalised text, and types its results."""
        text = re.sub(
            r"('(?:[^']|'')*'|\b[\w.]+)\s*::\s*(regclass|regtype|regnamespace|regrole|regproc)\b",
            lambda m: f"__to_{m.group(2).lower()}({m.group(1)})",
            normalised,
            flags=re.IGNORECASE,
        )
        text = re.sub(r"::\s*__pg_oid\s*\[\s*\]", "::UINTEGER[]", text)
        text = re.sub(r"::\s*oid\b", "::UINTEGER", text, flags=re.IGNORECASE)
        count = _parameter_count(text)
        return Translation(text, None, (0,) * count, count)

    # -- rewrites ------------------------------------------------------------------------------

    def rewrite(self, tree: exp.Expression, typer: _Typer) -> exp.Expression:
        """The tree with every construct DuckDB reads differently from PostgreSQL replaced."""

        def bottom_up(node: exp.Expression) -> exp.Expression:
            # Children first, so that a cast sees its operand rewritten already; the PostgreSQL
            # type the typer gave a node moves to whatever replaces it.
            for child in list(node.iter_expressions()):
                new = bottom_up(child)
                if new is not child:
                    child.replace(new)
            new = self.visit(node, typer)
            if new is not node and "pg_type" in node.meta:
                new.meta.setdefault("pg_type", node.meta["pg_type"])
            return new

        return bottom_up(tree.copy())

    def visit(self, node: exp.Expression, typer: _Typer) -> exp.Expression:
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self.cast(node)
        if isinstance(node, (exp.EQ, exp.NEQ)):
            # array_column = '{0}': PostgreSQL reads the literal as an array.
            for side, other in ((node.this, node.expression), (node.expression, node.this)):
                oid = side.meta.get("pg_type")
                literal = isinstance(other, exp.Literal) and other.is_string and other.this.startswith("{")
                if literal and oid and self.data.element(oid) is not None:
                    other.replace(self.array_literal(other.this, oid))
            return node
        if isinstance(node, exp.Column) and "tableoid" in node.meta:
            return exp.Cast(
                this=exp.Literal.number(node.meta["tableoid"]),
                to=exp.DataType.build("UINTEGER", dialect="duckdb"),
            )
        bare = isinstance(node, exp.Column) and not node.args.get("table")
        if bare and node.meta.get("pg_type") == 19 and _ident(node.this) in ("user", "current_role"):
            return exp.Anonymous(this="current_user", expressions=[])
        if type(node) in _SESSION_FUNCTIONS:
            return exp.Anonymous(this=_SESSION_FUNCTIONS[type(node)], expressions=[])
        if isinstance(node, exp.JSONObject):
            args: list[exp.Expression] = []
            for pair in node.expressions:
                args += [pair.this, pair.expression] if isinstance(pair, exp.JSONKeyValue) else [pair]
            return exp.Anonymous(this="json_object", expressions=args)
        if isinstance(node, exp.Anonymous) and str(node.this).lower() == "json_build_object":
            return exp.Anonymous(this="json_object", expressions=node.expressions)
        if isinstance(node, exp.DPipe):
            oid = node.meta.get("pg_type")
            if oid is not None and oid not in (22, 30) and self.data.element(oid) is not None:
                # PostgreSQL's array || treats a NULL array as empty; DuckDB's gives NULL.
                sides = [
                    exp.Coalesce(this=side, expressions=[exp.Array(expressions=[])])
                    for side in (node.this, node.expression)
                ]
                return exp.Anonymous(this="list_concat", expressions=sides)
            return node
        if isinstance(node, exp.Div) and {
            node.this.meta.get("pg_type"),
            node.expression.meta.get("pg_type"),
        } <= (INTEGER_TYPES):
            # PostgreSQL divides integers exactly as integers (7/2 = 3); DuckDB's / would give 3.5.
            return exp.IntDiv(this=node.this, expression=node.expression)
        if isinstance(node, exp.Format) and isinstance(node.this, exp.Literal) and node.this.is_string:
            return _pg_format(node.this.this, list(node.expressions))
        if (
            isinstance(node, exp.Table)
            and isinstance(node.this, exp.Func)
            and not _is_table_function(node.this)
        ):
            # PostgreSQL reads a scalar function in FROM as a one-row relation whose one column is
            # named after the alias; DuckDB has only table functions there.
            alias_node = node.args.get("alias")
            name = (
                _ident(alias_node.this)
                if alias_node is not None and alias_node.this
                else (_function_name(node.this) or "f")
            )
            select = exp.select(exp.alias_(node.this.copy(), name, quoted=True))
            return exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)))
        if isinstance(node, exp.Parameter):
            oid = typer.params.get(_param_index(node))
            if oid and not isinstance(node.parent, (exp.Cast, exp.TryCast)):
                # A parameter PostgreSQL would type: DuckDB converts the client's value to it.
                return exp.Cast(
                    this=node.copy(), to=exp.DataType.build(duck_type(oid, self.data), dialect="duckdb")
                )
        return node

    def array_literal(self, text: str, array_oid: int) -> exp.Expression:
        element = self.data.element(array_oid) or 25
        values = [exp.Null() if v is None else exp.Literal.string(v) for v in parse_pg_array(text)]
        duck = duck_type(element, self.data)
        return exp.Cast(
            this=exp.Array(expressions=values), to=exp.DataType.build(duck + "[]", dialect="duckdb")
        )

    def cast(self, node: exp.Cast | exp.TryCast) -> exp.Expression:
        data = self.data
        target = node.meta.get("pg_type") or _type_oid_from_name(node.to.sql("postgres"), data)
        inner = node.this
        inner_type = inner.meta.get("pg_type")
        if inner_type is None and isinstance(inner, exp.Anonymous):
            inner_type = _RETURNS.get(str(inner.this).lower())
        if target is None:
            return exp.Cast(this=inner, to=exp.DataType.build("VARCHAR"))
        if target in REG_TYPES:
            if inner_type in OID_LIKE or inner_type in INTEGER_TYPES:
                # Already an OID: no lookup, and no nested macro (DuckDB would expand it again and again).
                return exp.Cast(this=inner, to=exp.DataType.build("UINTEGER", dialect="duckdb"))
            return exp.Anonymous(this=f"__to_{REG_TYPES[target]}", expressions=[inner])
        if target in TEXT_TYPES and inner_type in REG_TYPES:
            return exp.Anonymous(this=f"__{REG_TYPES[inner_type]}_out", expressions=[inner])
        if target in TEXT_TYPES and inner_type in (22, 30):
            return exp.Anonymous(this="__vector_out", expressions=[inner])
        if target in TEXT_TYPES and inner_type is not None and data.element(inner_type) is not None:
            return exp.Anonymous(this="__array_out", expressions=[inner])
        if target == 18:  # "char": the first character
            text = exp.Cast(this=inner, to=exp.DataType.build("VARCHAR"))
            return exp.Anonymous(this="left", expressions=[text, exp.Literal.number(1)])
        literal = isinstance(inner, exp.Literal) and inner.is_string
        if target in (22, 30) and literal:  # '1 2'::int2vector
            values = [exp.Literal.number(v) for v in inner.this.split()]
            element = "SMALLINT[]" if target == 22 else "UINTEGER[]"
            return exp.Cast(
                this=exp.Array(expressions=values), to=exp.DataType.build(element, dialect="duckdb")
            )
        if literal and target not in (22, 30) and data.element(target) is not None:
            return self.array_literal(inner.this, target)
        if target == 1700:
            to = node.to if node.to.expressions else exp.DataType.build("DECIMAL(38, 10)")
            return exp.Cast(this=inner, to=to)
        duck = duck_type(target, data)
        return exp.Cast(this=inner, to=exp.DataType.build(duck, dialect="duckdb"))


# ---------------------------------------------------------------------------------------------
# The DuckDB shadow catalog
# ---------------------------------------------------------------------------------------------

# The backend's lock-down (dpproxy/backends/duckdb.py), plus: no temp directory (DuckDB lets SQL
# read its temp directory even without external access, and the shadow never needs to spill), and
# bounded memory and threads (a catalog query is small; a huge one must not starve the proxy).
_LOCKDOWN: dict[str, object] = {
    "enable_external_access": False,
    "python_enable_replacements": False,
    "python_scan_all_frames": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "temp_directory": "",
    "memory_limit": "512MB",
    "threads": 1,
}

STATEMENT_TIMEOUT_S = 10.0
_CACHE_SIZE = 512  # translations kept, by SQL text


class DuckDBShadowCatalog(ShadowCatalog):
    """The shadow catalog on an embedded, in-memory DuckDB, the same for every data backend.

    DuckDB rather than a shadow database inside a PostgreSQL: the demo and the DuckDB backend have
    no PostgreSQL to put one in, one implementation answers identically whatever the backend, and a
    shadow that lives in the proxy's process cannot reach the real server by construction. The price
    is the translation above.
    """

    def __init__(
        self, exposed: Sequence[ExposedTable], *, statement_timeout_s: float = STATEMENT_TIMEOUT_S
    ) -> None:
        self.data = load_pg_data()
        self.tables = shadow_tables(exposed)
        self.lookups = make_lookups(self.data, self.tables)
        self._reg_names: dict[int, Mapping[int, str]] = {
            24: self.lookups.procs,
            2205: self.lookups.relations,
            2206: {oid: formats[1] for oid, formats in self.lookups.types.items()},
            4089: {oid: quote_identifier(n) for oid, n in self.lookups.namespaces.items()},
        }
        self._translator = _Translator(self.data, self._relation_index())
        self._statement_timeout_s = statement_timeout_s
        self._cache: OrderedDict[str, Translation] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache, the idle cursors and _closed
        self._idle: list[tuple[duckdb.DuckDBPyConnection, list[tuple[object, ...] | None]]] = []
        self._closed = False
        self._started = datetime.datetime.now(datetime.UTC).isoformat()
        self._conn = duckdb.connect(":memory:", config=dict(_LOCKDOWN))
        try:
            _build(self._conn, self.data, self.tables, self.lookups)
            self._conn.execute("SET GLOBAL lock_configuration = true")
        except BaseException:
            self._conn.close()
            raise

    # -- public API ----------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[object], session: SessionInfo) -> CatalogResult:
        translation = self.translation(sql)
        names, types, rows = self._run(translation, self._coerce(translation, params), session)
        columns = self._columns(translation, names, types)
        rows = self._convert(columns, rows, session)
        return CatalogResult(tuple(columns), rows, f"SELECT {len(rows)}")

    def describe(
        self, sql: str, param_oids: Sequence[int], session: SessionInfo
    ) -> tuple[list[int], list[WireColumn]]:
        translation = self.translation(sql)
        oids = []
        for i in range(max(translation.param_count, len(param_oids))):
            given = param_oids[i] if i < len(param_oids) else 0
            inferred = translation.param_types[i] if i < len(translation.param_types) else 0
            oids.append(given or inferred or 25)
        names, types, _ = self._run(translation, [None] * translation.param_count, session, describe=True)
        return oids, self._columns(translation, names, types)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
        for cursor, _ in idle:
            cursor.close()
        self._conn.close()

    def translation(self, sql: str) -> Translation:
        """The statement's translation, cached: clients send the same catalog queries again and again."""
        with self._lock:
            cached = self._cache.get(sql)
            if cached is not None:
                self._cache.move_to_end(sql)
                return cached
        translation = self._translator.translate(sql)
        with self._lock:
            self._cache[sql] = translation
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return translation

    # -- running -------------------------------------------------------------------------------

    def _relation_index(self) -> dict[tuple[str, str], _Rel]:
        """Every relation's columns with their PostgreSQL types, for the typer."""
        relations: dict[tuple[str, str], _Rel] = {}
        for relation in self.data.relations:
            columns = tuple(
                _Col(c.name, self.data.base_type(c.type_oid), relation.oid, i + 1, self._typmod(c))
                for i, c in enumerate(relation.columns)
            )
            relations[(relation.schema, relation.name)] = _Rel(relation.oid, columns)
        for table in self.tables:
            columns = tuple(_Col(n, t, table.oid, i + 1) for i, (n, t) in enumerate(table.columns))
            relations[("public", table.name)] = _Rel(table.oid, columns)
        return relations

    def _typmod(self, column: PgColumn) -> int:
        """A column's typmod as RowDescription sends it: its domain's when it has none of its own."""
        if column.typmod != -1:
            return column.typmod
        row = self.data.types.get(column.type_oid)
        return row.typmod if row is not None and row.typtype == "d" else -1

    def _coerce(self, translation: Translation, params: Sequence[object]) -> list[object]:
        """Parameter values as DuckDB takes them: PostgreSQL array text becomes a list."""
        if len(params) != translation.param_count:
            raise InvalidParameter(
                f"the statement takes {translation.param_count} parameter(s), {len(params)} were given"
            )
        values: list[object] = []
        for i, value in enumerate(params):
            oid = translation.param_types[i]
            if isinstance(value, str) and oid in (22, 30):
                value = [int(v) for v in value.split()]
            elif isinstance(value, str) and oid and self.data.element(oid) is not None:
                value = parse_pg_array(value)
            elif isinstance(value, (bytes, bytearray, memoryview)):
                value = bytes(value).decode("utf-8", "replace")
            values.append(value)
        return values

    def _run(
        self,
        translation: Translation,
        values: Sequence[object],
        session: SessionInfo,
        *,
        describe: bool = False,
    ) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        """(column names, DuckDB column types, rows); `describe` binds the query without running it."""
        cursor, applied = self._checkout()
        finished = threading.Event()
        interrupt_lock = threading.Lock()

        def interrupt() -> None:
            # The lock and the flag keep a late timer from interrupting the cursor's next query.
            with interrupt_lock:
                if not finished.is_set():
                    cursor.interrupt()

        timer = threading.Timer(self._statement_timeout_s, interrupt)
        timer.daemon = True
        try:
            key = _session_key(session)
            if applied[0] != key:
                applied[0] = None  # until all of the session's variables are set
                cursor.execute(_session_sql(session, self._started))
                applied[0] = key
            statements = cursor.extract_statements(translation.sql)
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise NotSupported("the catalog answers one SELECT statement at a time")
            timer.start()
            if describe:
                described = cursor.execute("DESCRIBE " + translation.sql, list(values)).fetchall()
                return [d[0] for d in described], [str(d[1]) for d in described], []
            result = cursor.execute(statements[0], list(values)) if values else cursor.execute(statements[0])
            description = result.description or []
            rows = result.fetchall()
        except duckdb.InterruptException:
            raise QueryCanceled("canceling statement due to statement timeout") from None
        except duckdb.Error as exc:
            raise _translate_error(exc) from None
        finally:
            with interrupt_lock:
                finished.set()
            timer.cancel()
            self._checkin(cursor, applied)
        return [d[0] for d in description], [str(d[1]) for d in description], rows

    def _checkout(self) -> tuple[duckdb.DuckDBPyConnection, list[tuple[object, ...] | None]]:
        """A cursor of its own for this call (DuckDB connections are not shared between threads),
        with the key of the session whose variables it holds."""
        with self._lock:
            if self._closed:
                raise NotSupported("the shadow catalog is closed")
            if self._idle:
                return self._idle.pop()
            return self._conn.cursor(), [None]

    def _checkin(self, cursor: duckdb.DuckDBPyConnection, applied: list[tuple[object, ...] | None]) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append((cursor, applied))
                return
        cursor.close()

    # -- results -------------------------------------------------------------------------------

    def _columns(self, translation: Translation, names: list[str], types: list[str]) -> list[WireColumn]:
        planned = (
            translation.columns if translation.columns and len(translation.columns) == len(names) else None
        )
        columns = []
        for i, (name, duck) in enumerate(zip(names, types, strict=True)):
            oid, table_oid, column_number, modifier = None, 0, 0, -1
            if planned is not None:
                out = planned[i]
                name = out.name
                if out.type_oid is not None and _compatible(out.type_oid, duck, self.data):
                    oid, table_oid, column_number, modifier = (
                        out.type_oid,
                        out.table_oid,
                        out.column_number,
                        out.type_modifier,
                    )
            if oid is None:
                oid = _pg_oid_of_duck(duck, self.data)
            row = self.data.types.get(oid)
            columns.append(
                WireColumn(name, oid, row.length if row else -1, modifier, table_oid, column_number)
            )
        return columns

    def _convert(
        self, columns: list[WireColumn], rows: list[tuple[Any, ...]], session: SessionInfo
    ) -> list[tuple]:
        converters = [self._converter(c.type_oid, session) for c in columns]
        if not any(converters):
            return rows
        return [
            tuple(v if c is None or v is None else c(v) for c, v in zip(converters, row, strict=True))
            for row in rows
        ]

    def _converter(self, oid: int, session: SessionInfo) -> Callable[[Any], Any] | None:
        """How a value of this column leaves the shadow: reg* OIDs as names ("-" for 0) …"""
        names: Mapping[int, str] | None = self._reg_names.get(oid)
        if oid == 4096:
            names = {**self.lookups.roles, ANALYST_ROLE_OID: session.user}
        if names is not None:
            return lambda v: RegValue("-" if v == 0 else names.get(v, str(v)), v)
        if oid == RECORD:
            return _record_text
        if oid in (114, 3802):
            return lambda v: v if isinstance(v, str) else json.dumps(v)
        if oid == 1700:
            return _trim_numeric
        return None


class RegValue(str):
    """A reg* value (regclass, regtype, regproc …): its text form, which is what PostgreSQL's text
    output sends, carrying its OID for the binary format (a uint32): int(value) is the OID."""

    oid: int

    def __new__(cls, text: str, oid: int) -> RegValue:
        value = super().__new__(cls, text)
        value.oid = oid
        return value

    def __int__(self) -> int:
        return self.oid


def _trim_numeric(value: Any) -> Any:
    """An unconstrained numeric as PostgreSQL prints it, without DuckDB's padding zeros."""
    if not isinstance(value, Decimal) or not value.is_finite():
        return value
    return value.quantize(Decimal(1)) if value == value.to_integral_value() else value.normalize()


def _record_text(value: Any) -> str:
    """A row value (DuckDB STRUCT) in PostgreSQL's record text form: (a,"b c",)."""
    parts = []
    for item in value.values() if isinstance(value, dict) else value:
        if item is None:
            parts.append("")
            continue
        text = ("t" if item else "f") if isinstance(item, bool) else str(item)
        parts.append(f'"{text}"' if text == "" or re.search(r'[,()"\s\\]', text) else text)
    return "(" + ",".join(parts) + ")"


def _session_key(session: SessionInfo) -> tuple[object, ...]:
    """A snapshot of what _session_sql sets (the settings mapping may be a live view)."""
    settings = tuple(sorted((str(k).lower(), str(v)) for k, v in session.settings.items()))
    return (session.user, session.database, session.application_name, session.backend_pid, settings)


def _session_sql(session: SessionInfo, started: str) -> str:
    """The statement that gives a cursor the session's identity and settings."""
    settings = {name.lower(): value for name, value in DEFAULT_SETTINGS.items()}
    settings["session_authorization"] = session.user
    settings["application_name"] = session.application_name
    settings.update({name.lower(): str(value) for name, value in session.settings.items()})
    entries = ", ".join(f"{_sql_string(k)}: {_sql_string(v)}" for k, v in sorted(settings.items()))
    return (
        f"SET VARIABLE dp_user = {_sql_string(session.user)}; "
        f"SET VARIABLE dp_database = {_sql_string(session.database)}; "
        f"SET VARIABLE dp_pid = {int(session.backend_pid)}; "
        f"SET VARIABLE dp_settings = MAP {{{entries}}}; "
        f"SET VARIABLE dp_started = CAST({_sql_string(started)} AS TIMESTAMPTZ);"
    )


def _sql_string(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


_DUCK_MESSAGE = re.compile(r"^(?:[A-Za-z ]+ Error|Error): (.*)", re.S)


def _translate_error(exc: duckdb.Error) -> DPProxyError:
    """A PostgreSQL-like error for what DuckDB refused, without DuckDB's internals."""
    text = str(exc)
    mine = re.search(r"dpproxy:(\w{5}):(.*?)(?:\n|$)", text)  # raised by a macro with error()
    if mine:
        cls = {
            "42P01": UndefinedTable,
            "42704": UndefinedObject,
            "22P02": InvalidText,
            "42883": UndefinedFunction,
        }.get(mine.group(1), NotSupported)
        return cls(mine.group(2).strip())
    first = text.splitlines()[0] if text else ""
    found = _DUCK_MESSAGE.match(first)
    message = found.group(1) if found else first
    if isinstance(exc, duckdb.CatalogException):
        if m := re.search(r'(?:Table|View|Table Function) with name "?([\w.]+)"? does not exist', message):
            return UndefinedTable(
                f'relation "{m.group(1)}" does not exist',
                hint="only the exposed tables and PostgreSQL's catalog exist here",
            )
        if m := re.search(r'Function with name "?([\w.]+)"? does not exist', message):
            return UndefinedFunction(
                f"function {m.group(1)} does not exist",
                hint="dpproxy's catalog has the functions PostgreSQL clients use for metadata",
            )
        if m := re.search(r'Type with name "?([\w.]+)"? does not exist', message):
            return UndefinedObject(f'type "{m.group(1)}" does not exist')
    if isinstance(exc, duckdb.BinderException):
        if m := re.search(r'Referenced column "?([\w.]+)"? not found', message):
            return UndefinedColumn(f'column "{m.group(1)}" does not exist')
        if m := re.search(r"No function matches the given name and argument types '([\w.]+)\(", message):
            return UndefinedFunction(
                f"function {m.group(1)} with these argument types does not exist",
                hint="add explicit type casts",
            )
    if isinstance(exc, duckdb.ParserException):
        return SyntaxProblem("syntax error in catalog query")
    if isinstance(exc, duckdb.ConversionException):
        return InvalidText("invalid input syntax in catalog query")
    return NotSupported(
        "this catalog query is not supported by dpproxy's shadow catalog",
        hint="catalog queries run against a copy of the catalog that holds only the exposed tables",
    )


# ---------------------------------------------------------------------------------------------
# Building the shadow database
# ---------------------------------------------------------------------------------------------


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


def make_lookups(data: PgData, tables: Sequence[ShadowTable]) -> Lookups:
    namespace_ids = {name: oid for oid, name in data.namespaces.items()}

    def display(schema: str, name: str) -> str:
        on_path = schema in ("pg_catalog", "public")
        return quote_identifier(name) if on_path else f"{quote_identifier(schema)}.{quote_identifier(name)}"

    entries = [(r.schema, r.name, r.oid) for r in data.relations] + [
        ("public", t.name, t.oid) for t in tables
    ]
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
    for name, oid in _TYPE_NAMES.items():
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


# Catalog relations computed from the session or from other relations rather than stored.
_COMPUTED = frozenset(
    {
        ("pg_catalog", "pg_class"),
        ("pg_catalog", "pg_roles"),
        ("pg_catalog", "pg_user"),
        ("pg_catalog", "pg_database"),
        ("pg_catalog", "pg_settings"),
        ("pg_catalog", "pg_tables"),
        ("pg_catalog", "pg_views"),
        ("information_schema", "information_schema_catalog_name"),
        ("information_schema", "schemata"),
        ("information_schema", "tables"),
        ("information_schema", "columns"),
        ("information_schema", "views"),
        ("information_schema", "enabled_roles"),
        ("information_schema", "applicable_roles"),
        ("information_schema", "character_sets"),
        ("information_schema", "table_privileges"),
        ("information_schema", "role_table_grants"),
    }
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


def _build(
    conn: duckdb.DuckDBPyConnection, data: PgData, tables: Sequence[ShadowTable], lookups: Lookups
) -> None:
    conn.execute("CREATE SCHEMA public")
    conn.execute("CREATE SCHEMA pg_information_schema")
    for table in tables:
        columns = ", ".join(f"{_quote(n)} {duck_type(t, data)}" for n, t in table.columns) or "__none INTEGER"
        conn.execute(f"CREATE TABLE public.{_quote(table.name)} ({columns})")
    by_name = {(r.schema, r.name): r for r in data.relations}
    for relation in data.relations:
        columns = ", ".join(f"{_quote(c.name)} {duck_type(c.type_oid, data)}" for c in relation.columns)
        computed = (relation.schema, relation.name) in _COMPUTED
        conn.execute(f"CREATE TABLE {_base(relation) if computed else _target(relation)} ({columns})")
    _load_static(conn, data, tables, by_name)
    _load_lookups(conn, data, lookups)
    # Views and macros refer to each other: the views over stored tables, the macros, then the
    # views that call macros.
    early, late = _view_statements(data, by_name)
    for statement in (*early, *_macro_statements(), *late):
        conn.execute(statement)


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
) -> None:
    """PostgreSQL's built-in rows, and pg_class / pg_type / pg_attribute rows for the exposed tables."""
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

    # pg_roles: the built-in roles; the view adds the session's analyst.
    columns, rows = data.tables["pg_roles"]
    _insert(conn, _base(by_name[("pg_catalog", "pg_roles")]), columns, rows)

    # pg_class: the catalog relations and the exposed tables, all with an empty table's statistics.
    columns, rows = data.tables["pg_class"]
    empty = {"reltuples": -1.0, "relpages": 0, "relallvisible": 0, "reloptions": None, "relpartbound": None}
    class_rows = [[empty.get(c, v) for c, v in zip(columns, row, strict=True)] for row in rows]
    template = dict(zip(columns, rows[0], strict=True))
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
            "relhasindex": False,
            "relisshared": False,
            "relpersistence": "p",
            "relkind": "r",
            "relnatts": len(table.columns),
            "relchecks": 0,
            "relhasrules": False,
            "relhastriggers": False,
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
            att_rows.append(
                attribute(table.oid, i + 1, PgColumn(name, type_oid, -1, False, row.collation if row else 0))
            )
    _insert(conn, _target(relation), att_columns, att_rows)


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


def _load_lookups(conn: duckdb.DuckDBPyConnection, data: PgData, lookups: Lookups) -> None:
    """The tables behind the macros. Their columns are __-prefixed: see catalog_data/macros.sql."""
    tables = {
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


def _view_statements(
    data: PgData, by_name: Mapping[tuple[str, str], PgRelation]
) -> tuple[list[str], list[str]]:
    """The computed relations (views), each with exactly PostgreSQL's columns in its order.

    (views over stored tables only, views that call macros)."""

    def view(schema: str, name: str, values: Mapping[str, str], source: str) -> str:
        relation = by_name[(schema, name)]
        items = ", ".join(
            f"CAST({values.get(c.name, 'NULL')} AS {duck_type(c.type_oid, data)}) AS {_quote(c.name)}"
            for c in relation.columns
        )
        return f"CREATE VIEW {_target(relation)} AS SELECT {items} {source}"

    def passthrough(schema: str, name: str, overrides: Mapping[str, str], source: str) -> str:
        values = {c.name: f"b.{_quote(c.name)}" for c in by_name[(schema, name)].columns}
        return view(schema, name, {**values, **overrides}, source)

    user, database = "getvariable('dp_user')", "getvariable('dp_database')"
    setting = "coalesce(getvariable('dp_settings')[lower(s.name)], s.boot_val)"
    relations = "FROM main.pg_class c JOIN main.pg_namespace n ON n.oid = c.relnamespace"
    grants = {
        "grantor": f"'{OWNER_NAME}'",
        "grantee": user,
        "table_catalog": database,
        "table_schema": "'public'",
        "table_name": "c.relname",
        "privilege_type": "'SELECT'",
        "is_grantable": "'NO'",
        "with_hierarchy": "'YES'",
    }
    early = [
        # The exposed tables' ACL names the session's analyst: SELECT granted by the owner.
        passthrough(
            "pg_catalog",
            "pg_class",
            {
                "relacl": f"CASE WHEN b.relnamespace = {PUBLIC_NAMESPACE_OID} THEN "
                f"['{OWNER_NAME}=arwdDxt/{OWNER_NAME}', {user} || '=r/{OWNER_NAME}'] ELSE b.relacl END"
            },
            "FROM main.__base_pg_class b",
        ),
        passthrough(
            "pg_catalog",
            "pg_roles",
            {},
            f"FROM (SELECT * FROM main.__base_pg_roles "
            f"UNION ALL SELECT {user}, false, true, false, false, true, "
            f"false, -1, '********', NULL, false, NULL, {ANALYST_ROLE_OID}::UINTEGER) b",
        ),
        view(
            "pg_catalog",
            "pg_user",
            {
                "usename": "rolname",
                "usesysid": "oid",
                "usecreatedb": "rolcreatedb",
                "usesuper": "rolsuper",
                "userepl": "rolreplication",
                "usebypassrls": "rolbypassrls",
                "passwd": "'********'",
                "valuntil": "rolvaliduntil",
                "useconfig": "rolconfig",
            },
            "FROM main.pg_roles WHERE rolcanlogin",
        ),
        view(
            "pg_catalog",
            "pg_database",
            {
                **{k: _sql_literal(v) for k, v in data.database.items()},
                "oid": str(DATABASE_OID),
                "datname": database,
                "datdba": str(BOOTSTRAP_ROLE_OID),
                "datacl": "NULL",
            },
            "",
        ),
        view(
            "pg_catalog",
            "pg_settings",
            {
                **{
                    c: f"s.{c}"
                    for c in (
                        "name",
                        "unit",
                        "category",
                        "short_desc",
                        "extra_desc",
                        "context",
                        "vartype",
                        "min_val",
                        "max_val",
                        "enumvals",
                        "boot_val",
                    )
                },
                "setting": setting,
                "reset_val": setting,
                "source": "'default'",
                "pending_restart": "false",
            },
            "FROM main.__settings s",
        ),
        view("information_schema", "information_schema_catalog_name", {"catalog_name": database}, ""),
        view("information_schema", "enabled_roles", {"role_name": user}, ""),
        view("information_schema", "applicable_roles", {}, "WHERE false"),
        view(
            "information_schema",
            "character_sets",
            {
                "character_set_name": "'UTF8'",
                "character_repertoire": "'UCS'",
                "form_of_use": "'UTF8'",
                "default_collate_catalog": database,
                "default_collate_schema": "'pg_catalog'",
                "default_collate_name": "'C'",
            },
            "",
        ),
        view(
            "information_schema",
            "table_privileges",
            grants,
            f"FROM main.pg_class c WHERE c.relnamespace = {PUBLIC_NAMESPACE_OID}",
        ),
        view(
            "information_schema",
            "role_table_grants",
            grants,
            f"FROM main.pg_class c WHERE c.relnamespace = {PUBLIC_NAMESPACE_OID}",
        ),
    ]
    late = [
        view(
            "pg_catalog",
            "pg_tables",
            {
                "schemaname": "n.nspname",
                "tablename": "c.relname",
                "tableowner": "pg_get_userbyid(c.relowner)",
                "hasindexes": "c.relhasindex",
                "hasrules": "c.relhasrules",
                "hastriggers": "c.relhastriggers",
                "rowsecurity": "c.relrowsecurity",
            },
            f"{relations} WHERE c.relkind IN ('r', 'p')",
        ),
        view(
            "pg_catalog",
            "pg_views",
            {"schemaname": "n.nspname", "viewname": "c.relname", "viewowner": "pg_get_userbyid(c.relowner)"},
            f"{relations} WHERE c.relkind = 'v'",
        ),
        view(
            "information_schema",
            "schemata",
            {
                "catalog_name": database,
                "schema_name": "n.nspname",
                "schema_owner": "pg_get_userbyid(n.nspowner)",
            },
            "FROM main.pg_namespace n WHERE n.nspname <> 'pg_toast'",
        ),
        view(
            "information_schema",
            "tables",
            {
                "table_catalog": database,
                "table_schema": "n.nspname",
                "table_name": "c.relname",
                "table_type": "CASE WHEN c.relkind IN ('r', 'p') THEN 'BASE TABLE' "
                "WHEN c.relkind = 'v' THEN 'VIEW' "
                "WHEN c.relkind = 'f' THEN 'FOREIGN' END",
                "is_insertable_into": "CASE WHEN c.relkind IN ('r', 'p') THEN 'YES' ELSE 'NO' END",
                "is_typed": "'NO'",
            },
            f"{relations} WHERE c.relkind IN ('r', 'p', 'v', 'f')",
        ),
        view(
            "information_schema",
            "views",
            {
                "table_catalog": database,
                "table_schema": "n.nspname",
                "table_name": "c.relname",
                "check_option": "'NONE'",
                **dict.fromkeys(
                    (
                        "is_updatable",
                        "is_insertable_into",
                        "is_trigger_updatable",
                        "is_trigger_deletable",
                        "is_trigger_insertable_into",
                    ),
                    "'NO'",
                ),
            },
            f"{relations} WHERE c.relkind = 'v'",
        ),
        view(
            "information_schema",
            "columns",
            _COLUMNS_VIEW,
            "FROM main.pg_attribute a JOIN main.pg_class c ON c.oid = a.attrelid "
            "JOIN main.pg_namespace n ON n.oid = c.relnamespace JOIN main.pg_type t ON t.oid = a.atttypid "
            "LEFT JOIN main.pg_type bt "
            "ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END "
            "WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'f')",
        ),
    ]
    return early, late


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return _sql_string(str(value))


# information_schema.columns as PostgreSQL's view computes it, for the types the shadow holds.
_COLUMNS_VIEW = {
    "table_catalog": "getvariable('dp_database')",
    "table_schema": "n.nspname",
    "table_name": "c.relname",
    "column_name": "a.attname",
    "ordinal_position": "a.attnum",
    "is_nullable": "CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END",
    "data_type": "CASE WHEN t.typtype = 'd' THEN CASE WHEN bt.typcategory = 'A' THEN 'ARRAY' "
    "WHEN bt.typnamespace = 11 THEN format_type(bt.oid, NULL) ELSE 'USER-DEFINED' END "
    "WHEN t.typcategory = 'A' THEN 'ARRAY' WHEN t.typnamespace = 11 THEN format_type(t.oid, NULL) "
    "ELSE 'USER-DEFINED' END",
    "character_maximum_length": "CASE WHEN bt.oid IN (1042, 1043) AND a.atttypmod > 0 "
    "THEN a.atttypmod - 4 END",
    "character_octet_length": "CASE WHEN bt.oid IN (25, 1042, 1043) THEN CASE WHEN a.atttypmod > 0 "
    "THEN (a.atttypmod - 4) * 4 ELSE 1073741824 END END",
    "numeric_precision": "CASE bt.oid WHEN 21 THEN 16 WHEN 23 THEN 32 WHEN 20 THEN 64 WHEN 700 THEN 24 "
    "WHEN 701 THEN 53 WHEN 1700 THEN CASE WHEN a.atttypmod > 0 "
    "THEN ((a.atttypmod - 4) >> 16) & 65535 END END",
    "numeric_precision_radix": "CASE WHEN bt.oid IN (21, 23, 20, 700, 701) THEN 2 "
    "WHEN bt.oid = 1700 THEN 10 END",
    "numeric_scale": "CASE WHEN bt.oid IN (21, 23, 20) THEN 0 WHEN bt.oid = 1700 AND a.atttypmod > 0 "
    "THEN (a.atttypmod - 4) & 65535 END",
    "datetime_precision": "CASE WHEN bt.oid = 1082 THEN 0 WHEN bt.oid IN (1083, 1114, 1184, 1266, 1186) "
    "THEN CASE WHEN a.atttypmod < 0 THEN 6 ELSE a.atttypmod END END",
    "collation_catalog": "CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation "
    "THEN getvariable('dp_database') END",
    "collation_schema": "CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation "
    "THEN 'pg_catalog' END",
    "collation_name": "CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN "
    "(SELECT collname FROM main.pg_collation co WHERE co.oid = a.attcollation) END",
    "domain_catalog": "CASE WHEN t.typtype = 'd' THEN getvariable('dp_database') END",
    "domain_schema": "CASE WHEN t.typtype = 'd' THEN (SELECT nspname FROM main.pg_namespace dn "
    "WHERE dn.oid = t.typnamespace) END",
    "domain_name": "CASE WHEN t.typtype = 'd' THEN t.typname END",
    "udt_catalog": "getvariable('dp_database')",
    "udt_schema": "(SELECT nspname FROM main.pg_namespace un WHERE un.oid = bt.typnamespace)",
    "udt_name": "bt.typname",
    "dtd_identifier": "CAST(a.attnum AS VARCHAR)",
    "is_self_referencing": "'NO'",
    "is_identity": "'NO'",
    "identity_cycle": "'NO'",
    "is_generated": "'NEVER'",
    "is_updatable": "CASE WHEN c.relkind IN ('r', 'p') THEN 'YES' ELSE 'NO' END",
}


__all__ = [
    "DEFAULT_SETTINGS",
    "SERVER_VERSION",
    "VERSION_STRING",
    "CatalogResult",
    "DuckDBShadowCatalog",
    "RegValue",
    "SessionInfo",
    "ShadowCatalog",
    "open_catalog",
    "parse_pg_array",
    "shadow_tables",
]
