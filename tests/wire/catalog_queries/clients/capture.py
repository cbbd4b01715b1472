"""Capture the SQL real clients send, for the shadow catalog's replay tests (captured.json).

Start a throwaway PostgreSQL 15 whose bootstrap superuser is `dpproxy`, with log_statement=all and
the default log_line_prefix, create the demo tables there (see ../build_fixtures.py, DEMO_DDL:
owned by dpproxy, SELECT granted to a login role `alice`, database `demo`), then:

    javac -cp /usr/share/java/postgresql.jar tests/wire/catalog_queries/clients/Meta.java
    (cd /some/dir && npm install pg)   # node-postgres, for cap.js
    .venv/bin/python tests/wire/catalog_queries/clients/capture.py --log /path/to/postgres.log --port 5432 \
        --node-modules /some/dir/node_modules > tests/wire/catalog_queries/captured.json

Each client action runs against the server; the statements the server logged meanwhile (simple
queries, and extended-protocol executions with their parameters) are attributed to it. Clients
that are not installed are skipped with a message on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \w+ \[(\d+)\] (\w+):  (.*)$")

PSQL_COMMANDS = (
    *[
        r"\dt",
        r"\dt+",
        r"\d",
        r"\dn",
        r"\l",
        r"\du",
        r"\dv",
        r"\di",
        r"\ds",
        r"\df",
        r"\dT",
        r"\conninfo",
        r"\x",
        r"\d+",
    ],
    r"\d patients",
    r"\d+ patients",
    r"\d zip_info",
    r"\dt public.*",
    r"\d nosuchtable",
    "SELECT version()",
)
JDBC_STEPS = tuple(
    [
        "tables",
        "tables_null",
        "columns",
        "columns_all",
        "schemas",
        "catalogs",
        "tabletypes",
        "typeinfo",
        "pk",
        "imported",
        "exported",
        "index",
        "functions",
        "procedures",
        "udts",
        "privs",
        "prepared",
        "rsmeta",
    ]
)


def parse_params(text: str) -> list[str | None]:
    """`$1 = 'x', $2 = NULL` as PostgreSQL logs an execution's parameters."""
    params: list[str | None] = []
    i = 0
    while i < len(text):
        match = re.match(r"\$(\d+) = ", text[i:])
        if match is None:
            raise ValueError(f"unexpected parameter text: {text[i:]!r}")
        i += match.end()
        if text.startswith("NULL", i):
            params.append(None)
            i += 4
        else:
            i += 1  # the opening quote
            value = []
            while not (text[i] == "'" and text[i + 1 : i + 2] != "'"):
                value.append(text[i])
                i += 2 if text[i] == "'" else 1
            params.append("".join(value))
            i += 1
        if text.startswith(", ", i):
            i += 2
    return params


def read_entries(log: Path, start: int) -> list[dict[str, object]]:
    with log.open(encoding="utf-8", errors="replace") as f:
        f.seek(start)
        text = f.read()
    entries: list[list[str]] = []
    for line in text.split("\n"):
        match = ENTRY.match(line)
        if match:
            entries.append([match[2], match[3]])
        elif entries:
            entries[-1][1] += "\n" + line
    out: list[dict[str, object]] = []
    for level, message in entries:
        message = message.rstrip("\n")
        if level == "LOG" and message.startswith("statement: "):
            out.append({"protocol": "simple", "sql": message.removeprefix("statement: ")})
        elif level == "LOG" and (match := re.match(r"execute ([^:]*): (.*)", message, re.S)):
            out.append({"protocol": "extended", "statement": match[1], "sql": match[2], "params": []})
        elif level == "DETAIL" and message.startswith("parameters: ") and out:
            out[-1]["params"] = parse_params(message.removeprefix("parameters: "))
        elif level == "ERROR" and out:
            out[-1]["error"] = message
    return out


def actions(args: argparse.Namespace) -> list[tuple[str, str, Callable[[], object]]]:
    dsn = f"postgresql://alice@{args.host}:{args.port}/demo"

    def psql(command: str) -> None:
        subprocess.run(
            ["psql", "-X", "-h", args.host, "-p", str(args.port), "-U", "alice", "demo", "-c", command],
            capture_output=True,
            check=False,
        )

    def psycopg_client() -> None:
        import psycopg
        from psycopg.types import TypeInfo
        from psycopg.types.range import RangeInfo

        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT version()").fetchall()
            conn.execute(
                "SELECT current_schema(), current_database(), current_user, session_user, pg_backend_pid()"
            ).fetchall()
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", [30]).fetchall()
            conn.execute("SELECT COUNT(*) FROM patients WHERE age > %s", [30], prepare=True).fetchall()
            with conn.cursor(binary=True) as cur:
                cur.execute("SELECT 1::int4 AS a, 2.5::numeric AS b, 'x'::text AS c, DATE '2024-01-02' AS d")
                cur.fetchall()
            TypeInfo.fetch(conn, "int4")
            TypeInfo.fetch(conn, "hstore")
            RangeInfo.fetch(conn, "int4range")
            conn.execute("SELECT to_regtype('integer'), to_regclass('patients')").fetchall()

    def asyncpg_client() -> None:
        import asyncpg

        async def run() -> None:
            conn = await asyncpg.connect(dsn)
            await conn.fetch("SELECT version()")
            await conn.fetch(
                "SELECT $1::int4 AS i, $2::int8 AS b, $3::numeric AS n, $4::text AS t, $5::date AS d",
                1,
                2,
                3,
                "x",
                datetime.date(2024, 1, 2),
            )
            await conn.fetch("SELECT COUNT(*) FROM patients WHERE age > $1", 30)
            await conn.fetch("SELECT typname FROM pg_type WHERE oid = $1", 23)
            await conn.set_type_codec("json", encoder=str, decoder=str, schema="pg_catalog")
            await conn.set_type_codec("jsonb", encoder=str, decoder=str, schema="pg_catalog", format="text")
            await conn.fetch(
                "SELECT c.oid, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
            )
            await conn.fetch("SELECT '1 2'::int2vector AS v, 'patients'::regclass AS r")
            await conn.fetch("SELECT NULL::int4range AS r")
            await conn.close()

        asyncio.run(run())

    def pg8000_client() -> None:
        import pg8000.dbapi
        import pg8000.native

        conn = pg8000.native.Connection("alice", host=args.host, port=args.port, database="demo")
        conn.run("SELECT version()")
        conn.run("SELECT COUNT(*) FROM patients WHERE age > :a", a=30)
        conn.run("SELECT current_schema()")
        conn.close()
        dbapi = pg8000.dbapi.connect("alice", host=args.host, port=args.port, database="demo")
        cursor = dbapi.cursor()
        cursor.execute("SELECT version()")
        cursor.fetchall()
        dbapi.rollback()
        dbapi.close()

    def sqlalchemy_client(driver: str) -> None:
        import sqlalchemy as sa

        engine = sa.create_engine(f"postgresql+{driver}://alice@{args.host}:{args.port}/demo")
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1")).fetchall()
        inspector = sa.inspect(engine)
        inspector.get_schema_names()
        inspector.get_table_names()
        inspector.get_view_names()
        inspector.get_columns("patients")
        inspector.has_table("patients")
        inspector.has_table("nosuch")
        inspector.get_pk_constraint("patients")
        inspector.get_foreign_keys("visits")
        inspector.get_indexes("patients")
        inspector.get_unique_constraints("patients")
        inspector.get_check_constraints("patients")
        inspector.get_table_comment("patients")
        inspector.get_multi_columns()
        engine.dispose()

    def jdbc(step: str) -> None:
        url = f"jdbc:postgresql://{args.host}:{args.port}/demo"
        classpath = f"{args.jdbc_jar}:{HERE}"
        subprocess.run(["java", "-cp", classpath, "Meta", url, step], check=True, capture_output=True)

    def node_client() -> None:
        env = {**os.environ, "NODE_PATH": str(args.node_modules)}
        subprocess.run(["node", str(HERE / "cap.js"), str(args.port)], check=True, env=env)

    found: list[tuple[str, str, Callable[[], object]]] = []
    found += [("psql", command, lambda command=command: psql(command)) for command in PSQL_COMMANDS]
    found += [("psycopg", "connect+queries", psycopg_client), ("asyncpg", "connect+fetch", asyncpg_client)]
    found += [("pg8000", "connect+queries", pg8000_client)]
    found += [("sqlalchemy", d, lambda d=d: sqlalchemy_client(d)) for d in ("psycopg", "pg8000")]
    found += [("pgjdbc", step, lambda step=step: jdbc(step)) for step in JDBC_STEPS]
    found.append(("node-postgres", "connect+queries", node_client))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log", type=Path, required=True, help="the server's log file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--jdbc-jar", default="/usr/share/java/postgresql.jar")
    parser.add_argument("--node-modules", type=Path, default=Path("node_modules"))
    args = parser.parse_args()
    captured: list[dict[str, object]] = []
    for client, name, run in actions(args):
        start = args.log.stat().st_size
        try:
            run()
        except Exception as exc:  # a client that is not installed, or that failed: say so, go on
            print(f"{client} {name}: {exc}", file=sys.stderr)
        time.sleep(0.3)  # let the server flush its log
        captured += [{**entry, "client": client, "action": name} for entry in read_entries(args.log, start)]
    json.dump(captured, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
