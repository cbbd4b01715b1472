"""Regenerate pg15.json, the static part of the shadow catalog, from a PostgreSQL 15 server.

    python -m dpproxy.wire.catalog.dump_pg15 postgresql://postgres@127.0.0.1:5432/postgres

Run it against a freshly initialised cluster (initdb -E UTF8 --locale=C, no extensions, no user
objects): everything dumped is PostgreSQL's own built-in catalog content (type OIDs, catalog
relation definitions, access methods, collations, setting descriptions), nothing of any user's data.
Statistics and sizes are not dumped; the shadow catalog reports empty tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg

OUT = Path(__file__).with_name("data") / "pg15.json"

# Settings a client may read (current_setting, pg_settings, SHOW): descriptions and boot values.
SETTINGS = (
    "application_name",
    "array_nulls",
    "backslash_quote",
    "block_size",
    "bytea_output",
    "client_encoding",
    "client_min_messages",
    "DateStyle",
    "default_text_search_config",
    "default_transaction_deferrable",
    "default_transaction_isolation",
    "default_transaction_read_only",
    "escape_string_warning",
    "extra_float_digits",
    "idle_in_transaction_session_timeout",
    "integer_datetimes",
    "IntervalStyle",
    "is_superuser",
    "jit",
    "lc_collate",
    "lc_ctype",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "lock_timeout",
    "max_connections",
    "max_function_args",
    "max_identifier_length",
    "max_index_keys",
    "row_security",
    "search_path",
    "server_encoding",
    "server_version",
    "server_version_num",
    "standard_conforming_strings",
    "statement_timeout",
    "TimeZone",
    "timezone_abbreviations",
    "transaction_deferrable",
    "transaction_isolation",
    "transaction_read_only",
    "xmloption",
    "ssl",
    "datestyle",
)

# Catalog tables whose built-in rows the shadow holds (everything else starts empty): the rows to
# keep and their order. pg_proc keeps only the functions pg_type, pg_range and pg_am refer to.
STATIC_TABLES = {
    "pg_type": "WHERE oid < 16384 ORDER BY oid",
    "pg_namespace": "WHERE nspname IN ('pg_catalog', 'pg_toast', 'public', 'information_schema') "
    "ORDER BY oid",
    "pg_am": "ORDER BY oid",
    "pg_collation": "WHERE collname IN ('default', 'C', 'POSIX', 'ucs_basic') ORDER BY oid",
    "pg_language": "ORDER BY oid",
    "pg_tablespace": "ORDER BY oid",
    "pg_range": "ORDER BY rngtypid",
    "pg_opclass": "ORDER BY oid",
    "pg_extension": "WHERE extname = 'plpgsql'",
    "pg_roles": "WHERE oid < 16384 ORDER BY oid",
    "pg_class": "WHERE relkind IN ('r', 'v', 'm', 'p', 'f') AND "
    "relnamespace IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace) ORDER BY oid",
    "pg_proc": """WHERE oid IN (
        SELECT unnest(ARRAY[typinput, typoutput, typreceive, typsend, typmodin, typmodout, typanalyze,
                            typsubscript])::oid FROM pg_catalog.pg_type
        UNION SELECT unnest(ARRAY[rngcanonical, rngsubdiff])::oid FROM pg_catalog.pg_range
        UNION SELECT amhandler::oid FROM pg_catalog.pg_am) ORDER BY oid""",
}

# How a column of each type is dumped: reg* as OIDs, ACLs as text, expression trees not at all.
COLUMN_DUMP = {
    "regproc": "{c}::oid::bigint",
    "regprocedure": "{c}::oid::bigint",
    "aclitem[]": "{c}::text[]",
    "pg_node_tree": "NULL",
    "xid": "{c}::text::bigint",
}

RELATIONS = """
SELECT n.nspname, c.relname, c.oid, c.relkind, c.reltype,
       json_agg(json_build_array(a.attname, a.atttypid::int, a.atttypmod, a.attnotnull, a.attcollation::int)
                ORDER BY a.attnum)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname IN ('pg_catalog', 'information_schema') AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
GROUP BY 1, 2, 3, 4, 5
ORDER BY c.oid
"""


def _value(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def dump(dsn: str) -> dict[str, object]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()[0]
        if not version.startswith("15"):
            raise SystemExit(f"need PostgreSQL 15, got server_version_num {version}")
        relations = [
            {"schema": s, "name": n, "oid": o, "relkind": k, "reltype": t, "columns": cols}
            for s, n, o, k, t, cols in conn.execute(RELATIONS).fetchall()
        ]
        tables = {}
        for name, where in STATIC_TABLES.items():
            attributes = conn.execute(
                "SELECT attname, format_type(atttypid, NULL) FROM pg_catalog.pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                [f"pg_catalog.{name}"],
            ).fetchall()
            select = ", ".join(
                COLUMN_DUMP.get(typ, "{c}").format(c=f'"{column}"') + f' AS "{column}"'
                for column, typ in attributes
            )
            cur = conn.execute(f"SELECT {select} FROM pg_catalog.{name} {where}")
            columns = [d.name for d in cur.description]
            rows = [[_value(v) for v in row] for row in cur.fetchall()]
            tables[name] = {"columns": columns, "rows": rows}
        formats = {
            str(oid): [a, b]
            for oid, a, b in conn.execute(
                "SELECT oid, format_type(oid, NULL), format_type(oid, -1) FROM pg_catalog.pg_type "
                "WHERE oid < 16384 ORDER BY oid"
            ).fetchall()
        }
        cur = conn.execute(
            "SELECT name, unit, category, short_desc, extra_desc, context, vartype, min_val, max_val, "
            "enumvals, boot_val FROM pg_catalog.pg_settings WHERE name = ANY(%s) ORDER BY name",
            [list(SETTINGS)],
        )
        settings = [[_value(v) for v in row] for row in cur.fetchall()]
        keywords = [
            list(row)
            for row in conn.execute(
                "SELECT word, catcode, barelabel, catdesc, baredesc FROM pg_catalog.pg_get_keywords() "
                "ORDER BY word"
            ).fetchall()
        ]
        descriptions = [
            [int(a), int(b), int(c), d]
            for a, b, c, d in conn.execute(
                "SELECT objoid, classoid, objsubid, description FROM pg_catalog.pg_description "
                "WHERE classoid = 'pg_catalog.pg_namespace'::regclass "
                "AND objoid IN (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname IN "
                "('pg_catalog', 'pg_toast', 'public', 'information_schema')) ORDER BY objoid"
            ).fetchall()
        ]
        cur = conn.execute("SELECT * FROM pg_catalog.pg_database WHERE datname = current_database()")
        database = dict(
            zip([d.name for d in cur.description], [_value(v) for v in cur.fetchone()], strict=True)
        )
    return {
        "source": f"PostgreSQL {version}, dumped by dpproxy/wire/catalog/dump_pg15.py",
        "relations": relations,
        "tables": tables,
        "format_type": formats,
        "settings": settings,
        "keywords": keywords,
        "descriptions": descriptions,
        "database": database,
    }


def _render(data: dict[str, object]) -> str:
    """JSON with one relation, row or entry per line, so that a regenerated file diffs well."""

    def compact(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def lines(items: list[str], indent: str) -> str:
        return "[\n" + ",\n".join(indent + item for item in items) + "\n" + indent[:-1] + "]"

    parts = [f'"source":{compact(data["source"])}']
    parts.append('"relations":' + lines([compact(r) for r in data["relations"]], "  "))  # type: ignore[union-attr]
    tables = []
    for name, table in data["tables"].items():  # type: ignore[union-attr]
        rows = lines([compact(row) for row in table["rows"]], "    ")
        tables.append(f' "{name}":{{"columns":{compact(table["columns"])},\n  "rows":{rows}}}')
    parts.append('"tables":{\n' + ",\n".join(tables) + "}")
    formats = [f"{compact(k)}:{compact(v)}" for k, v in data["format_type"].items()]  # type: ignore[union-attr]
    parts.append('"format_type":{\n' + ",\n".join(" " + f for f in formats) + "}")
    parts.append('"settings":' + lines([compact(s) for s in data["settings"]], "  "))  # type: ignore[union-attr]
    parts.append('"keywords":' + lines([compact(k) for k in data["keywords"]], "  "))  # type: ignore[union-attr]
    parts.append('"descriptions":' + compact(data["descriptions"]))
    parts.append(f'"database":{compact(data["database"])}')
    text = "{" + ",\n".join(parts) + "}\n"
    assert json.loads(text) == json.loads(compact(data))
    return text


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    data = dump(sys.argv[1])
    OUT.write_text(_render(data))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
