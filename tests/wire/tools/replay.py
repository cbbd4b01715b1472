"""Replaying a BI tool's SQL sequence against dpproxy and reading back what the tool would show.

A sequence is a list of Steps (a name, how the tool sends it, the SQL and its parameters). The JVM
tools' sequences run in one `java ToolReplay` process through pgjdbc (one JVM start per tool and
backend: starting a JVM costs seconds); the others run through psycopg in the protocol mode the
tool's own driver uses. Either way each step becomes a Result: the columns (name, PostgreSQL type
name), the rows as text, the notices and the SQLSTATE and message of an error, so the tests assert
what a user of the tool would see.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.wire.test_clients import ALICE, ALICE_PASSWORD, PGJDBC_JAR, SUBPROCESS_TIMEOUT, Served

ERROR_MULTIPLE = 5  # how many stated 95% errors a DP answer may be from the truth (p < 1e-6)


@dataclass(frozen=True)
class Step:
    name: str
    kind: str  # "query", "prepared" or "meta" (a DatabaseMetaData call)
    args: tuple[str, ...]


def query(name: str, sql: str) -> Step:
    return Step(name, "query", (sql,))


def prepared(name: str, sql: str, *params: str) -> Step:
    """A PreparedStatement; parameters are `s:text`, `i:int`, `l:long` or `b:bool`."""
    return Step(name, "prepared", (sql, *params))


def meta(name: str, method: str, *args: str) -> Step:
    """A DatabaseMetaData call; `-` passes null."""
    return Step(name, "meta", (method, *args))


@dataclass
class Result:
    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[tuple[str | None, ...]] = field(default_factory=list)
    rowcount: int = 0
    notices: list[str] = field(default_factory=list)
    error: tuple[str, str] | None = None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]

    @property
    def types(self) -> list[str]:
        return [type_name for _, type_name in self.columns]

    def ok(self) -> Result:
        assert self.error is None, f"refused: {self.error}"
        return self

    def column(self, name: str) -> list[str | None]:
        """A column's values, by name (pgjdbc's DatabaseMetaData labels are upper case)."""
        index = [n.lower() for n in self.names].index(name.lower())
        return [row[index] for row in self.rows]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _unescape(value: str) -> str | None:
    if value == "\\N":
        return None
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), value)


def run_jvm(served: Served, classes: Path, steps: list[Step], **url_options: str) -> dict[str, Result]:
    """All steps in one pgjdbc session (one JVM), as the tool's connection pool would send them."""
    java = shutil.which("java")
    assert java is not None
    options = {"sslmode": "disable", **url_options}
    url = f"jdbc:postgresql://127.0.0.1:{served.port}/demo?" + "&".join(
        f"{k}={v}" for k, v in options.items()
    )
    stdin = "".join("\t".join([_escape(s.name), s.kind, *map(_escape, s.args)]) + "\n" for s in steps)
    classpath = f"{classes}{os.pathsep}{PGJDBC_JAR}"
    done = subprocess.run(
        [java, "-Dfile.encoding=UTF-8", "-cp", classpath, "ToolReplay", url, ALICE, ALICE_PASSWORD],
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    results: dict[str, Result] = {}
    current = Result()
    finished = False
    for line in done.stdout.splitlines():
        key, *values = line.split("\t")
        fields = [_unescape(v) for v in values]
        if key == "step":
            current = results[fields[0] or ""] = Result()
        elif key == "column":
            current.columns.append((fields[0] or "", fields[1] or ""))
        elif key == "row":
            current.rows.append(tuple(fields))
        elif key == "rows":
            current.rowcount = int(fields[0] or 0)
        elif key == "notice":
            current.notices.append(fields[0] or "")
        elif key == "error":
            current.error = (fields[0] or "", fields[1] or "")
        elif key == "done":
            finished = True
    assert finished and list(results) == [s.name for s in steps], done.stdout[-2000:]
    return results


def run_psycopg(conn: psycopg.Connection, sql: str, params: object = None, *, simple: bool = False) -> Result:
    """One statement through psycopg: the extended protocol (as Go's pgx and lib/pq send a query
    with or without parameters), or with simple=True the simple query protocol with parameters
    merged client-side (as psycopg2, Superset's driver, does). Values come back as text."""
    result = Result()
    handler = lambda diag: result.notices.append(diag.message_primary or "")  # noqa: E731
    conn.add_notice_handler(handler)
    try:
        cursor = psycopg.ClientCursor(conn) if simple else conn.cursor()
        cursor.execute(sql, params)  # type: ignore[arg-type]
        if cursor.description is not None:
            registry = conn.adapters.types
            result.columns = [
                (d.name, getattr(registry.get(d.type_code), "name", str(d.type_code)))
                for d in cursor.description
            ]
            rows = cursor.fetchall()
            result.rows = [tuple(None if v is None else _text(v) for v in row) for row in rows]
            result.rowcount = len(rows)
    except psycopg.Error as exc:
        result.error = (exc.sqlstate or "", str(exc.diag.message_primary or exc))
    finally:
        conn.remove_notice_handler(handler)
    return result


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


def psycopg_connect(served: Served, **kwargs: object) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=served.port,
        user=ALICE,
        password=ALICE_PASSWORD,
        dbname="demo",
        sslmode="disable",
        autocommit=True,
        **kwargs,  # type: ignore[arg-type]
    )


# --- what a user sees ------------------------------------------------------------------------------


def error95(notices: list[str], column: str) -> float:
    """The ± 95% error dpproxy's NOTICE states for one released column."""
    for notice in reversed(notices):
        match = re.search(rf"95% error: (?:.*, )?{re.escape(column)} ±([0-9.,e+-]+)", notice)
        if match:
            return float(match[1].replace(",", ""))
    raise AssertionError(f"no NOTICE gives an error for {column!r}: {notices!r}")


def assert_close(value: str | None, truth: float, result: Result, column: str) -> None:
    """A DP answer (text) within ERROR_MULTIPLE stated errors of the truth."""
    assert value is not None, f"{column} is NULL"
    bound = ERROR_MULTIPLE * error95(result.notices, column)
    assert abs(float(value) - truth) <= bound, f"{column}={value} is more than {bound} from the true {truth}"


def assert_refused(result: Result, sqlstate: str, *fragments: str) -> None:
    assert result.error is not None, f"not refused: {result.columns} {result.rows[:3]}"
    assert result.error[0] == sqlstate, result.error
    for fragment in fragments:
        assert fragment in result.error[1], result.error


def assert_empty_probe(result: Result, names: list[str]) -> None:
    """A zero-row probe: the right columns, no rows, no NOTICE (nothing was charged)."""
    result.ok()
    assert result.names == names
    assert result.rowcount == 0 and result.rows == []
    assert not [n for n in result.notices if "spent" in n], result.notices


def charged_epsilon(result: Result) -> float:
    """The ε a step's NOTICE says it spent (0 without a NOTICE)."""
    found = [re.search(r"spent ε=([0-9.e+-]+)", n) for n in result.notices]
    return sum(float(m[1]) for m in found if m)
