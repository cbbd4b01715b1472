"""The shadow catalog itself: an embedded, locked-down, in-memory DuckDB answering catalog queries.

It holds only what the policy exposes: empty tables named as the policy names them (schema
`public`) and a PostgreSQL 15 catalog (pg_catalog, information_schema) describing them (build.py).
Each query is translated (translator.py), run on a cursor given the session's identity and
settings, and its results given PostgreSQL's shape: reg* OIDs as names, numerics without DuckDB's
padding, rows as record text.

It must never touch the data backend or the real database, never hold a row of an exposed table,
and never show DuckDB's internals: its errors become PostgreSQL's (42883, 42P01, 42703, 42704,
0A000).
"""

from __future__ import annotations

import datetime
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import duckdb
import sqlglot
from sqlglot.errors import ParseError

from dpproxy import watchdog
from dpproxy.backends.duckdb import CursorPool, InterruptGuard
from dpproxy.errors import (
    DPProxyError,
    InvalidParameter,
    InvalidText,
    NotSupported,
    QueryCanceled,
    SyntaxProblem,
    UndefinedColumn,
    UndefinedFunction,
    UndefinedObject,
    UndefinedTable,
    lookup,
)
from dpproxy.sql.positions import syntax_problem
from dpproxy.wire.catalog.build import build_database, make_lookups, sql_string
from dpproxy.wire.catalog.builtin import PgColumn, load_pg_data
from dpproxy.wire.catalog.interface import CatalogResult, SessionInfo, ShadowCatalog
from dpproxy.wire.catalog.objects import (
    ANALYST_ROLE_OID,
    FIRST_TABLE_OID,
    TABLE_OID_STRIDE,
    shadow_tables,
)
from dpproxy.wire.catalog.pg_types import RECORD, compatible, parse_pg_array, pg_oid_of_duck
from dpproxy.wire.catalog.refusals import REFUSED_PER_ROW, refused_per_row
from dpproxy.wire.catalog.structure import NO_STRUCTURE, ExposedStructure, number_structure
from dpproxy.wire.catalog.translator import Translation, Translator
from dpproxy.wire.catalog.typer import TypedColumn, TypedRelation
from dpproxy.wire.router import quote_identifier
from dpproxy.wire.settings import DEFAULTS
from dpproxy.wire.types import WireColumn

if TYPE_CHECKING:
    from dpproxy.engine import ExposedTable

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
    is the translation (translator.py).
    """

    def __init__(
        self,
        exposed: Sequence[ExposedTable],
        *,
        structure: ExposedStructure = NO_STRUCTURE,
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
    ) -> None:
        self.data = load_pg_data()
        self.tables = shadow_tables(exposed)
        # The exposed tables' keys and indexes (structure.py), numbered after the tables.
        self.structure = number_structure(
            structure, self.tables, FIRST_TABLE_OID + TABLE_OID_STRIDE * len(self.tables)
        )
        self.lookups = make_lookups(self.data, self.tables, self.structure)
        self._reg_names: dict[int, Mapping[int, str]] = {
            24: self.lookups.procs,
            2205: self.lookups.relations,
            2206: {oid: formats[1] for oid, formats in self.lookups.types.items()},
            4089: {oid: quote_identifier(n) for oid, n in self.lookups.namespaces.items()},
        }
        self._translator = Translator(self.data, self._relation_index())
        self._statement_timeout_s = statement_timeout_s
        self._cache: OrderedDict[str, Translation] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache
        self._started = datetime.datetime.now(datetime.UTC).isoformat()
        conn = duckdb.connect(":memory:", config=dict(_LOCKDOWN))
        try:
            build_database(conn, self.data, self.tables, self.lookups, self.structure)
            conn.execute("SET GLOBAL lock_configuration = true")
        except BaseException:
            conn.close()
            raise
        # Each cursor carries the key of the session whose variables it holds ([None]: none yet).
        self._cursors: CursorPool[list[tuple[object, ...] | None]] = CursorPool(
            conn, lambda: [None], lambda: NotSupported("the shadow catalog is closed")
        )

    # -- public API ----------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[object], session: SessionInfo) -> CatalogResult:
        translation = self.translation(sql)
        try:
            names, types, rows = self._run(translation, self._coerce(translation, params), session)
        except SyntaxProblem as error:
            raise _placed(error, sql) from None
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
        try:
            names, types, _ = self._run(translation, [None] * translation.param_count, session, describe=True)
        except SyntaxProblem as error:
            raise _placed(error, sql) from None
        return oids, self._columns(translation, names, types)

    def close(self) -> None:
        self._cursors.close()

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

    def _relation_index(self) -> dict[tuple[str, str], TypedRelation]:
        """Every relation's columns with their PostgreSQL types, for the typer."""
        relations: dict[tuple[str, str], TypedRelation] = {}
        for relation in self.data.relations:
            columns = tuple(
                TypedColumn(c.name, self.data.base_type(c.type_oid), relation.oid, i + 1, self._typmod(c))
                for i, c in enumerate(relation.columns)
            )
            relations[(relation.schema, relation.name)] = TypedRelation(relation.oid, columns)
        for table in self.tables:
            typmods = self.structure.typmods
            columns = tuple(
                TypedColumn(n, t, table.oid, i + 1, typmods.get((table.oid, i + 1), -1))
                for i, (n, t) in enumerate(table.columns)
            )
            relations[("public", table.name)] = TypedRelation(table.oid, columns)
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
        cursor, applied = self._cursors.checkout()
        guard = InterruptGuard(cursor)
        timer: watchdog.Deadline | None = None
        try:
            key = _session_key(session)
            if applied[0] != key:
                applied[0] = None  # until all of the session's variables are set
                cursor.execute(_session_sql(session, self._started))
                applied[0] = key
            statements = cursor.extract_statements(translation.sql)
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise NotSupported("the catalog answers one SELECT statement at a time")
            timer = watchdog.after(self._statement_timeout_s, guard.interrupt)
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
            guard.finish()
            if timer is not None:
                timer.cancel()
            self._cursors.checkin(cursor, applied)
        return [d[0] for d in description], [str(d[1]) for d in description], rows

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
                if out.type_oid is not None and compatible(out.type_oid, duck, self.data):
                    oid, table_oid, column_number, modifier = (
                        out.type_oid,
                        out.table_oid,
                        out.column_number,
                        out.type_modifier,
                    )
            if oid is None:
                oid = pg_oid_of_duck(duck, self.data)
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
        element = self.data.element(oid) if oid not in (22, 30) else None
        if element is not None and element in self._reg_names:  # regtype[] …: each OID's name
            names = self._reg_names[element]
            return lambda v: [None if e is None else RegValue(names.get(e, str(e)), e) for e in v]
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
    settings = dict(DEFAULTS)  # every setting's default, by lower-case name
    settings["session_authorization"] = session.user
    settings["application_name"] = session.application_name
    settings.update({name.lower(): str(value) for name, value in session.settings.items()})
    entries = ", ".join(f"{sql_string(k)}: {sql_string(v)}" for k, v in sorted(settings.items()))
    return (
        f"SET VARIABLE dp_user = {sql_string(session.user)}; "
        f"SET VARIABLE dp_database = {sql_string(session.database)}; "
        f"SET VARIABLE dp_pid = {int(session.backend_pid)}; "
        f"SET VARIABLE dp_settings = MAP {{{entries}}}; "
        f"SET VARIABLE dp_started = CAST({sql_string(started)} AS TIMESTAMPTZ);"
    )


def _placed(error: SyntaxProblem, sql: str) -> SyntaxProblem:
    """A syntax error DuckDB found in the translation, placed in the statement the client sent where
    sqlglot finds one there too (the translation's text is not the client's)."""
    if error.position is not None:
        return error
    try:
        sqlglot.parse(sql, read="postgres")
    except ParseError as exc:
        placed = syntax_problem(exc, sql)
        if placed.position is not None:
            return placed
    except Exception:  # sqlglot raises several error types; DuckDB's own message stands then
        pass
    near = re.search(r'at or near "(.*)"', error.message)
    if near and near.group(1) not in sql:  # a word of the translation, not of the client's text
        return SyntaxProblem("syntax error in catalog query", hint=error.hint)
    return error


_DUCK_MESSAGE = re.compile(r"^(?:[A-Za-z ]+ Error|Error): (.*)", re.S)


def _translate_error(exc: duckdb.Error) -> DPProxyError:
    """A PostgreSQL-like error for what DuckDB refused, without DuckDB's internals."""
    text = str(exc)
    refused = re.search(r"dpproxy:refused:(\w+)", text)  # a function refused for each row (refusals.py)
    if refused and refused.group(1) in REFUSED_PER_ROW:
        return refused_per_row(refused.group(1))
    mine = re.search(r"dpproxy:(\w{5}):(.*?)(?:\n|$)", text)  # raised by a macro with error()
    if mine:
        return lookup(mine.group(1), NotSupported)(mine.group(2).strip())
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
        near = re.search(r'syntax error at (or near "[^"\n]*"|end of input)', message)
        return SyntaxProblem(f"syntax error at {near.group(1)}" if near else "syntax error in catalog query")
    if isinstance(exc, duckdb.ConversionException):
        return InvalidText("invalid input syntax in catalog query")
    return NotSupported(
        "this catalog query is not supported by dpproxy's shadow catalog",
        hint="catalog queries run against a copy of the catalog that holds only the exposed tables",
    )
