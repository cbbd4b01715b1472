"""dbt against dpproxy: the real dbt-core 1.11 with dbt-postgres (scripts/test.sh installs them into
.dbt/venv; dbt's pins conflict with the test extras), run as its users run it, on both backends.

A dbt project over the demo's tables as dbt *sources*, with what dbt sends for each command
(recorded from dbt-postgres 1.11's macros, dbt/include/postgres/macros/ and dbt-adapters'
global_project):

  - `dbt source freshness`: `select max(visit_date::timestamp) as max_loaded_at, now() as
    snapshotted_at from "demo"."public"."visits"` (a cast between date and timestamp of a column
    with a declared range: MIN/MAX of dates);
  - `dbt test`: a generic test is `select count(*) as failures, count(*) >= … from (<test query>)
    dbt_internal_test`, its query a CTE over `GROUP BY` (accepted_values) or a WHERE (not_null):
    post-processing over post-processing of one private aggregate. A private count of zero rows is a
    noisy number near 0, so the tests carry a threshold the noise does not cross (README, Known
    limits);
  - `dbt show --inline`: the model's SQL wrapped in `select * from (…) as model_limit_subq limit 5`;
  - `dbt docs generate`: the catalog query over pg_class, pg_attribute and information_schema;
  - `dbt run` of a table model: `create table … as (…)` — refused, read-only (42501).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpproxy import demo
from tests.wire.test_clients import ALICE, ALICE_PASSWORD, SUBPROCESS_TIMEOUT, Served, Truth, serving

EPSILON = 0.5  # the demo policy's per-query default
ROOT = Path(__file__).resolve().parents[3]
DBT = Path(os.environ.get("DPPROXY_DBT", ROOT / ".dbt" / "venv" / "bin" / "dbt"))

DEPARTMENTS = sorted(demo.DEPARTMENTS)  # the demo policy's public values of visits.department

SOURCES = """
version: 2
sources:
  - name: clinic
    database: demo
    schema: public
    tables:
      - name: visits
        loaded_at_field: "visit_date::timestamp"
        freshness:
          error_after: {count: 100000, period: day}
        columns:
          - name: department
            tests:
              - accepted_values:
                  arguments: {values: {departments}}
                  config: {error_if: ">50", warn_if: ">50"}
      - name: patients
        columns:
          - name: diagnosis
            tests:
              - not_null:
                  config: {error_if: ">50", warn_if: ">50"}
"""

BY_DEPARTMENT = """{{ config(materialized='ephemeral') }}
select department, count(*) as n from {{ source('clinic', 'visits') }} group by department
"""

MATERIALIZED = """{{ config(materialized='table') }}
select sex, count(*) as n from {{ source('clinic', 'patients') }} group by sex
"""


def _project(directory: Path, served: Served) -> Path:
    """A dbt project and its profile, pointing at `served`."""
    (directory / "models").mkdir(parents=True, exist_ok=True)
    (directory / "dbt_project.yml").write_text(
        yaml.safe_dump({"name": "clinic", "version": "1.0", "profile": "clinic", "config-version": 2})
    )
    profile = {
        "clinic": {
            "target": "proxy",
            "outputs": {
                "proxy": {
                    "type": "postgres",
                    "host": "127.0.0.1",
                    "port": served.port,
                    "user": ALICE,
                    "password": ALICE_PASSWORD,
                    "dbname": "demo",
                    "schema": "public",
                    "threads": 1,
                    "sslmode": "disable",
                }
            },
        }
    }
    (directory / "profiles.yml").write_text(yaml.safe_dump(profile))
    (directory / "models" / "sources.yml").write_text(
        SOURCES.replace("{departments}", json.dumps(DEPARTMENTS))
    )
    (directory / "models" / "by_department.sql").write_text(BY_DEPARTMENT)
    (directory / "models" / "by_sex.sql").write_text(MATERIALIZED)
    return directory


# One Python process runs every command through dbt's programmatic entry point (dbtRunner, the one
# its CLI calls), so that dbt's start-up (~4 s here) is paid once per backend, not per command.
DRIVER = """
import json, sys
from dbt.cli.main import dbtRunner
runner = dbtRunner()
for arguments in json.loads(sys.argv[1]):
    print("\\n=== dbt " + " ".join(arguments), flush=True)
    result = runner.invoke(arguments + sys.argv[2:])
    print("\\n=== success " + json.dumps(bool(result.success)), flush=True)
"""

COMMANDS = {
    "freshness": ["source", "freshness"],
    "test": ["test"],
    "show": ["show", "--select", "by_department", "--limit", "20", "--output", "json"],
    "docs": ["docs", "generate"],
    "run": ["run", "--select", "by_sex"],
}


@dataclass(frozen=True)
class Ran:
    """One dbt command's output and whether dbt called it a success."""

    output: str
    success: bool


@dataclass(frozen=True)
class Project:
    served: Served
    directory: Path
    ran: dict[str, Ran]


def _run_dbt(project: Path, served: Served) -> dict[str, Ran]:
    """Every command of COMMANDS in one dbt process, in order."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(project),
        "LC_ALL": "C.UTF-8",
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",  # no network here, and none wanted
        "DBT_VERSION_CHECK": "false",
        "DBT_USE_COLORS": "false",
    }
    python = DBT.parent / "python"
    arguments = ["--project-dir", str(project), "--profiles-dir", str(project)]
    result = subprocess.run(
        [str(python), "-c", DRIVER, json.dumps(list(COMMANDS.values())), *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=SUBPROCESS_TIMEOUT,
    )
    parts = result.stdout.split("\n=== dbt ")[1:]
    assert len(parts) == len(COMMANDS), result.stdout + result.stderr
    ran = {}
    for name, part in zip(COMMANDS, parts, strict=True):
        output, _, success = part.rpartition("\n=== success ")
        ran[name] = Ran(output, json.loads(success.strip()))
    return ran


def _visit_dates_declared(policy: dict[str, Any]) -> None:
    """What a data owner adds for freshness checks: the range of visits.visit_date (the demo's
    visits fall in it; the range is public, the dates are not)."""
    policy["tables"]["visits"]["columns"]["visit_date"].update({"lower": "2000-01-01", "upper": "2030-12-31"})


@pytest.fixture(params=["duckdb", "postgres"], scope="module")
def project(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    demo_duckdb: Path,
    tools_truth: Truth,
) -> Iterator[Project]:
    """A dbt project over the demo served on one backend, the policy declaring visit_date's range,
    and what each of COMMANDS gave."""
    if not DBT.exists():
        message = f"dbt was not found at {DBT}; scripts/test.sh installs it (scripts/lib.sh, ensure_dbt)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    directory = tmp_path_factory.mktemp(f"dbt-{request.param}")
    if request.param == "duckdb":
        backend = directory / "demo.duckdb"  # a copy: demo_pg_dsn holds the shared file open
        shutil.copyfile(demo_duckdb, backend)
        address = str(backend)
    else:
        address = request.getfixturevalue("demo_pg_dsn")
    with serving(address, request.param, directory, tools_truth, _visit_dates_declared) as served:
        project = _project(directory / "project", served)
        yield Project(served, project, _run_dbt(project, served))


def test_dbt_source_freshness_reads_a_noisy_max_of_a_date(project: Project) -> None:
    ran = project.ran["freshness"]
    assert ran.success, ran.output
    assert "PASS freshness of clinic.visits" in ran.output
    sources = json.loads((project.directory / "target" / "sources.json").read_text())
    (visits,) = sources["results"]
    assert visits["status"] == "pass"
    assert visits["max_loaded_at"].startswith("20")  # a date of the declared range, noisy


def test_dbt_test_runs_generic_tests_over_released_rows(project: Project) -> None:
    ran = project.ran["test"]
    assert ran.success, ran.output
    assert "Done. PASS=2 WARN=0 ERROR=0 SKIP=0" in ran.output


def test_dbt_show_answers_an_ephemeral_model_from_released_rows(project: Project) -> None:
    ran = project.ran["show"]
    assert ran.success, ran.output
    # dbt prints the JSON preview after its log lines: {"node": …, "show": [rows]}.
    shown, _ = json.JSONDecoder().raw_decode(ran.output[ran.output.index('{\n  "node"') :])
    rows = {row["department"]: row["n"] for row in shown["show"]}
    # The department's values are public (the policy's public_values): every one, zero-filled.
    assert sorted(rows) == DEPARTMENTS
    assert all(isinstance(n, int) for n in rows.values())


def test_dbt_docs_generate_reads_the_exposed_columns(project: Project) -> None:
    ran = project.ran["docs"]
    assert ran.success, ran.output
    catalog = json.loads((project.directory / "target" / "catalog.json").read_text())
    patients = catalog["sources"]["source.clinic.clinic.patients"]
    columns = {name: column["type"] for name, column in patients["columns"].items()}
    assert columns["income"] == "numeric(12,2)" and columns["patient_id"] == "integer"
    assert set(columns) == {"patient_id", "age", "sex", "income", "zip", "diagnosis", "smoker", "enrolled"}


def test_dbt_run_of_a_table_model_is_refused_read_only(project: Project) -> None:
    ran = project.ran["run"]
    assert not ran.success
    assert "dpproxy is read-only" in ran.output, ran.output


def test_dbt_spends_only_on_the_private_queries(project: Project) -> None:
    """The freshness MAX, the two tests' counts and the model's count are charged; the catalog,
    docs and the refused CREATE cost nothing: four statements at the policy's default ε."""
    assert project.served.spent() == pytest.approx(4 * EPSILON)
