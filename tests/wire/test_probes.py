"""Zero-row probes, SELECT DISTINCT and series limits through the wire, on both backends.

What the tools send (sources cited in tests/sql/test_probes.py and tests/test_engine.py): Tableau's
`SELECT * FROM "public"."t" WHERE (1 = 0)` and Metabase's `SELECT TRUE AS "_" FROM "public"."t"
WHERE 1 <> 1 LIMIT 0` through pgjdbc (both are JVM tools), jupysql's `SELECT * FROM t WHERE 1 = 0`
and Superset's filter dropdown and series limit through psycopg (Python tools). A probe must give
the same RowDescription to Describe (before Execute) as to Execute, no rows, and cost nothing; a
tool's `SELECT * … LIMIT 200` stays refused with 42501 and a hint towards an aggregate view.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.wire.test_clients import (
    ALICE,
    ALICE_PASSWORD,
    CLIENTS,
    PGJDBC_JAR,
    SUBPROCESS_TIMEOUT,
    Served,
    Truth,
    compile_with_pgjdbc,
    compute_truth,
    serving,
)


@pytest.fixture(scope="module")
def truth(demo_duckdb: Path, tmp_path_factory: pytest.TempPathFactory) -> Truth:
    return compute_truth(demo_duckdb, tmp_path_factory.mktemp("probes-truth"))


@pytest.fixture(scope="module")
def duck_served(
    demo_duckdb: Path, truth: Truth, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("probes-duck")
    backend = directory / "demo.duckdb"  # a copy: DuckDB will not open one file twice in a process
    shutil.copyfile(demo_duckdb, backend)
    with serving(str(backend), "duckdb", directory, truth) as served:
        yield served


@pytest.fixture(scope="module")
def pg_served(demo_pg_dsn: str, truth: Truth, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(demo_pg_dsn, "postgres", tmp_path_factory.mktemp("probes-pg"), truth) as served:
        yield served


@pytest.fixture(params=["duckdb", "postgres"])
def served(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue("duck_served" if request.param == "duckdb" else "pg_served")


PATIENTS = [
    ("patient_id", "int4"),
    ("age", "int4"),
    ("sex", "varchar"),
    ("income", "numeric"),
    ("zip", "varchar"),
    ("diagnosis", "varchar"),
    ("smoker", "bool"),
    ("enrolled", "date"),
]
OIDS = {"int4": 23, "int8": 20, "varchar": 1043, "numeric": 1700, "bool": 16, "date": 1082, "timestamp": 1114}

TABLEAU = 'SELECT * FROM "public"."patients" WHERE (1 = 0)'
METABASE = 'SELECT TRUE AS "_" FROM "public"."patients" WHERE 1 <> 1 LIMIT 0'
JUPYSQL = "SELECT * FROM patients WHERE 1 = 0"
DBEAVER = "SELECT * FROM public.patients LIMIT 200"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [(TABLEAU, PATIENTS), (METABASE, [("_", "bool")]), (JUPYSQL, PATIENTS)],
)
def test_psycopg_probe_describe_and_execute_agree_and_cost_nothing(
    served: Served, sql: str, expected: list[tuple[str, str]]
) -> None:
    before = served.spent()
    want = [(name, OIDS[t]) for name, t in expected]
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        # psycopg Describes the portal it executes (Describe before Execute alone is pgjdbc's
        # getMetaData, below; libpq's blocking calls would stall the in-process server).
        for prepare in (False, True):  # the unnamed and a named statement
            cur = conn.execute(sql, prepare=prepare)
            assert [(d.name, d.type_code) for d in cur.description or ()] == want
            assert cur.fetchall() == []
        cur = conn.cursor()
        cur.execute(sql.encode())  # simple query protocol (psql, jupysql's SQLAlchemy with psycopg2)
        assert [(d.name, d.type_code) for d in cur.description or ()] == want and cur.fetchall() == []
        assert notices == []  # no NOTICE: nothing was released or charged
    assert served.spent() == before


def test_psycopg_dbeaver_data_tab_is_refused_with_a_hint(served: Served) -> None:
    before = served.spent()
    with (
        psycopg.connect(served.dsn(), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as caught,
    ):
        conn.execute(DBEAVER)
    assert caught.value.diag.message_hint == (
        "ask for aggregates, e.g. SELECT COUNT(*) FROM patients, or one row per value of a column: "
        "SELECT sex, COUNT(*) FROM patients GROUP BY sex"
    )
    assert served.spent() == before


def test_psycopg_superset_filter_dropdown_and_series_limit(served: Served) -> None:
    # superset/models/helpers.py: values_for_column, and get_sqla_query's series limit.
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        before = served.spent()
        rows = conn.execute(
            "SELECT DISTINCT diagnosis AS column_values FROM public.patients LIMIT 10000"
        ).fetchall()
        assert rows == [("asthma",), ("cold",), ("diabetes",), ("flu",), ("healthy",), ("hypertension",)]
        assert served.spent() == before  # public values: released without noise or cost
        series = (
            "SELECT date_trunc('year', visit_date) AS __timestamp, department AS department, "
            "COUNT(*) AS count FROM public.visits JOIN (SELECT department AS department__, "
            "COUNT(*) AS mme_inner__ FROM public.visits GROUP BY department "
            "ORDER BY mme_inner__ DESC LIMIT 5) AS series_limit ON department = department__ "
            "GROUP BY date_trunc('year', visit_date), department ORDER BY count DESC LIMIT 10000"
        )
        cur = conn.execute(series)
        assert [(d.name, d.type_code) for d in cur.description or ()] == [
            ("__timestamp", OIDS["timestamp"]),
            ("department", OIDS["varchar"]),
            ("count", OIDS["int8"]),
        ]
        assert 1 <= len({row[1] for row in cur.fetchall()}) <= 5
        assert served.spent() == pytest.approx(before + 2 * 0.5)  # the top-k and the main query


@pytest.fixture(scope="session")
def probe_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_with_pgjdbc(CLIENTS / "ProbeCheck.java", tmp_path_factory.mktemp("probe-classes"))


def test_jdbc_probes_of_tableau_and_metabase(served: Served, probe_classes: Path) -> None:
    before = served.spent()
    java = shutil.which("java")
    assert java is not None
    statements = [TABLEAU, METABASE, DBEAVER]
    for threshold in (5, 1):  # pgjdbc's unnamed statements, then server-prepared ones from the first use
        url = f"jdbc:postgresql://127.0.0.1:{served.port}/demo?sslmode=disable&prepareThreshold={threshold}"
        result = subprocess.run(
            [java, "-cp", f"{probe_classes}{os.pathsep}{PGJDBC_JAR}", "ProbeCheck", url, ALICE, ALICE_PASSWORD,
             *statements],
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=SUBPROCESS_TIMEOUT,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = [line.split("\t") for line in result.stdout.splitlines()]
        assert lines[-1] == ["done"]
        patients = ",".join(f"{n} {t}" for n, t in PATIENTS)
        assert lines[:4] == [
            ["meta", "0", patients],
            ["exec", "0", patients, "0"],
            ["meta", "1", "_ bool"],
            ["exec", "1", "_ bool", "0"],
        ]
        [refused] = lines[4:-1]  # DBeaver's data tab: refused at Describe, with its hint
        assert refused[:2] == ["error", "2"] and refused[2].startswith("42501 "), refused
        assert "SELECT sex, COUNT(*) FROM patients GROUP BY sex" in refused[2]
    assert served.spent() == before
