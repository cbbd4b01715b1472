"""The `dpproxy` command line: what an operator, a data owner and an analyst type, and what they see."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpproxy.cli import main
from dpproxy.policy import load_policy
from dpproxy.scram import parse_verifier
from tests.conftest import SPARK, SparkServer

POLICY = Path(__file__).parent.parent / "policies" / "demo.yaml"


@pytest.fixture
def demo_copy(demo_duckdb: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "demo.duckdb"
    shutil.copy(demo_duckdb, copy)
    return copy


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


def test_query_prints_the_noisy_table_its_cost_and_the_budget_left(demo_copy: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.sqlite")
    code, out, _ = run(
        "query",
        "--policy",
        str(POLICY),
        "--backend",
        str(demo_copy),
        "--analyst",
        "alice",
        "--ledger",
        ledger,
        "--param",
        "40",
        "SELECT sex, COUNT(*) AS n FROM patients WHERE age > $1 GROUP BY sex ORDER BY sex",
    )
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["sex", "|", "n"]
    assert [line.split("|")[0].strip() for line in lines[2:5]] == ["F", "M", "X"]
    assert "(3 rows)" in out
    assert "this query spent ε=0.5" in out and "ε remaining 9.5 of 10" in out and "n ±" in out
    code, out, _ = run("budget", "show", "--policy", str(POLICY), "--ledger", ledger, "alice")
    assert code == 0 and out.splitlines()[2].split()[:3] == ["alice", "|", "0.5"]


def test_query_replay_epoch_repeats_are_free_until_the_operator_bumps_it(
    demo_copy: Path, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger.sqlite")
    bumped = tmp_path / "bumped.yaml"
    bumped.write_text(POLICY.read_text().replace("  data_epoch: 0\n", "  data_epoch: 1\n"))

    def query(policy: Path) -> str:
        args = ("--backend", str(demo_copy), "--analyst", "alice", "--ledger", ledger)
        code, out, _ = run("query", "--policy", str(policy), *args, "SELECT COUNT(*) FROM patients")
        assert code == 0, out
        return out

    assert "this query spent ε=0.5" in query(POLICY)
    assert "its stored answer costs nothing" in query(POLICY)
    assert "this query spent ε=0.5" in query(bumped)
    assert "its stored answer costs nothing" in query(bumped)
    code, out, _ = run("budget", "show", "--policy", str(POLICY), "--ledger", ledger, "alice")
    assert code == 0 and out.splitlines()[2].split()[:3] == ["alice", "|", "1"]


def test_query_refusals_show_the_sqlstate_and_the_hint(demo_copy: Path, tmp_path: Path) -> None:
    code, _, err = run(
        "query",
        "--policy",
        str(POLICY),
        "--backend",
        str(demo_copy),
        "--analyst",
        "alice",
        "--ledger",
        str(tmp_path / "l.sqlite"),
        "SELECT * FROM patients",
    )
    assert code == 1
    assert err.startswith("ERROR 42501: SELECT * would return raw rows")
    assert "HINT: ask for aggregates" in err


def test_explain_shows_passes_sensitivities_and_cost_without_data(tmp_path: Path) -> None:
    code, out, _ = run(
        "explain",
        "--policy",
        str(POLICY),
        "--dialect",
        "duckdb",
        "SELECT department, SUM(cost), MEDIAN(duration_minutes) FROM visits GROUP BY department",
    )
    assert code == 0, out
    for fragment in (
        "-- pass 1: selected_rows",
        "-- pass 3: per_unit",
        "ranked_groups",
        "HASH(",
        "-- row pipeline, histogram_0",
        # At the ceiling k = 5 rows per person in all (the demo's limits are ceilings).
        "sensitivity 10000000 per group, ≤ 1 group(s) per unit",
        "contribution bound k, a person's rows in the whole query: chosen among 1, 2, 4, 5",
        "exponential mechanism over 601 candidates",
        "cost: ε=0.5",
    ):
        assert fragment in out, fragment


def test_budget_reset_forgets_an_analyst(demo_copy: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.sqlite")
    base = ["--policy", str(POLICY), "--ledger", ledger]
    run("query", *base, "--backend", str(demo_copy), "--analyst", "bob", "SELECT COUNT(*) FROM visits")
    code, out, _ = run("budget", "reset", *base, "bob", "--yes")
    assert code == 0 and "reset bob: 1 ledger entry removed" in out
    code, out, _ = run("budget", "show", *base, "bob")
    assert out.splitlines()[2].split()[:3] == ["bob", "|", "0"]
    code, _, err = run("budget", "reset", *base, "mallory", "--yes")
    assert code == 1 and "ERROR 28000" in err


def test_budget_show_gives_rho_and_its_epsilon_under_zcdp(demo_copy: Path, tmp_path: Path) -> None:
    policy = tmp_path / "zcdp.yaml"
    policy.write_text(POLICY.read_text().replace("  mechanism: laplace\n", "  accounting: zcdp\n"))
    ledger = str(tmp_path / "ledger.sqlite")
    code, out, _ = run(
        "query",
        "--policy",
        str(policy),
        "--backend",
        str(demo_copy),
        "--analyst",
        "alice",
        "--ledger",
        ledger,
        "SELECT COUNT(*) FROM visits",
    )
    assert code == 0 and "this query spent ρ=" in out
    code, out, _ = run("budget", "show", "--policy", str(policy), "--ledger", ledger, "alice")
    header, _, row = out.splitlines()[:3]
    assert "ρ spent" in header
    epsilon, rho = float(row.split("|")[1]), float(row.split("|")[6])
    assert 0 < rho < epsilon < 0.5 + 1e-9  # ρ converts to an ε no larger than the query asked for


def test_policy_check_reports_every_problem_and_checks_the_live_schema(
    demo_copy: Path, tmp_path: Path
) -> None:
    code, out, _ = run("policy", "check", str(POLICY), "--backend", str(demo_copy))
    assert code == 0 and "OK (3 table(s), 2 analyst(s))" in out and "matches the schema" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        POLICY.read_text()
        .replace(
            "age:        {type: integer, lower: 0, upper: 120}",
            "age:        {type: integer, lower: 130, upper: 120}",
        )
        .replace("    max_rows_per_unit: 5\n", "    max_rows_per_unit: 5\n    max_rows: 3\n")
    )
    code, _, err = run("policy", "check", str(broken))
    assert code == 1
    assert "2 problem(s)" in err and "tables.patients.columns.age" in err and "tables.visits.max_rows" in err
    mismatched = tmp_path / "mismatched.yaml"
    mismatched.write_text(
        POLICY.read_text().replace(
            "enrolled:   {type: date}", "enrolled:   {type: date}\n      nickname: {type: text}"
        )
    )
    code, _, err = run("policy", "check", str(mismatched), "--backend", str(demo_copy))
    assert code == 1 and "nickname" in err


def test_policy_passwd_prints_a_verifier_and_init_drafts_a_loadable_policy(
    demo_copy: Path, tmp_path: Path
) -> None:
    code, out, _ = run("policy", "passwd", "--password-stdin", input="s3cret\n")
    assert code == 0
    verifier = parse_verifier(out.strip())
    assert verifier.iterations >= 4096 and verifier.matches("s3cret") and not verifier.matches("other")
    code, out, _ = run("policy", "init", "--backend", str(demo_copy))
    assert code == 0 and "patients:" in out and "TODO" in out
    draft = tmp_path / "draft.yaml"
    draft.write_text(out)
    assert {t.name for t in load_policy(draft).tables} >= {"patients", "visits", "zip_info"}


def test_policy_init_drafts_references_and_check_warns_about_row(tmp_path: Path) -> None:
    """A normalised schema: order_items carries order_id, whose foreign key reaches orders and its
    customer. `policy init` drafts the reference; `policy check` warns when the table is `row`."""
    import duckdb

    path = tmp_path / "shop.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER)")
        con.execute("CREATE TABLE order_items (order_id INTEGER REFERENCES orders (order_id), sku VARCHAR)")
    code, out, _ = run("policy", "init", "--backend", str(path))
    assert code == 0 and "privacy_unit: {references: orders, on: order_id}" in out
    draft = tmp_path / "draft.yaml"
    draft.write_text(out)
    assert load_policy(draft).table("order_items").privacy_unit == "customer_id"
    code, out, err = run("policy", "check", str(draft), "--backend", str(path))
    assert code == 0 and "warning" not in out, err
    draft.write_text(out_row := draft.read_text().replace("{references: orders, on: order_id}", "row"))
    assert "privacy_unit: row" in out_row
    code, out, err = run("policy", "check", str(draft), "--backend", str(path))
    assert code == 0, err
    assert "warning: tables.order_items: privacy_unit is row, but order_items.order_id references" in out
    assert "write privacy_unit: {references: orders, on: order_id}" in out


def _checked(draft: Path, backend: str) -> str:
    """`policy check --backend`'s output for a policy that passes it."""
    code, out, err = run("policy", "check", str(draft), "--backend", backend)
    assert code == 0, out + err
    return out


def _drafted_on_both(tmp_path: Path, pg_conn, pg_dsn: str, fill) -> Iterator[tuple[str, str]]:
    """(backend, `policy init`'s draft) for a DuckDB file and the PostgreSQL database, each filled
    by `fill(connection)`."""
    import duckdb

    path = tmp_path / "drafted.duckdb"
    with duckdb.connect(str(path)) as con:
        fill(con)
    fill(pg_conn)
    for backend in (str(path), pg_dsn):
        code, out, err = run("policy", "init", "--backend", backend)
        assert code == 0, err
        yield backend, out


def _visits_with_a_heavy_person(con) -> None:
    con.execute("CREATE TABLE visits (patient_id INTEGER, day DATE)")
    con.execute("INSERT INTO visits VALUES (1, DATE '2024-01-01'), (2, DATE '2024-01-02'), (NULL, NULL)")
    for day in range(1, 8):  # patient 3 has 7 visits, the most; the NULL patient's row is no one's
        con.execute(f"INSERT INTO visits VALUES (3, DATE '2024-02-0{day}')")


def test_policy_init_sets_the_rows_ceiling_to_the_most_rows_one_person_has_rounded_up(
    tmp_path: Path, pg_conn, pg_dsn: str
) -> None:
    """`policy init` counts, with the data owner's connection, the most rows one person has in each
    table whose unit it drafts, and writes it as max_rows_per_unit (a ceiling near it: many queries
    keep k at or above a quarter of the ceiling); `policy check --backend` warns about a ceiling far
    above it; on DuckDB and PostgreSQL alike."""
    for backend, out in _drafted_on_both(tmp_path, pg_conn, pg_dsn, _visits_with_a_heavy_person):
        # 7 rounded up to a power of two: analysts see the ceiling, and 7 is one person's count
        assert (
            "max_rows_per_unit: 8  # TODO: the most rows one person has here when drafted, rounded up" in out
        )
        draft = tmp_path / "draft.yaml"
        draft.write_text(out)
        assert load_policy(draft).table("visits").max_rows_per_unit == 8
        # `policy check --backend` says when a ceiling is far above what anyone has.
        assert "max_rows_per_unit is" not in _checked(draft, backend)
        draft.write_text(draft.read_text().replace("max_rows_per_unit: 8 ", "max_rows_per_unit: 100 "))
        assert (
            "warning: tables.visits.max_rows_per_unit is 100, and the most rows one person has in visits "
            "is 7: with bounds chosen per query many queries keep at least a quarter of the ceiling per "
            "person, so a ceiling this far above costs accuracy; write max_rows_per_unit: 8"
        ) in _checked(draft, backend)


def test_demo_init_builds_the_database(tmp_path: Path) -> None:
    code, out, _ = run("demo", "--init", str(tmp_path / "d"), "--persons", "300")
    assert code == 0 and "300 patients" in out
    assert (tmp_path / "d" / "demo.duckdb").stat().st_size > 0


def test_help_lists_every_command() -> None:
    code, out, _ = run("--help")
    assert code == 0
    for command in ("budget", "demo", "explain", "policy", "query", "serve"):
        assert command in out


def test_budget_show_rounds_to_meaningful_digits(demo_copy: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.sqlite")
    base = ["--policy", str(POLICY), "--ledger", ledger]
    for age in (20, 30, 40):  # 0.1 + 0.1 + 0.1 is 0.30000000000000004 in floats
        code, out, _ = run(
            "query", *base, "--backend", str(demo_copy), "--analyst", "bob", "--epsilon", "0.1",
            f"SELECT COUNT(*) FROM patients WHERE age > {age}",
        )  # fmt: skip
        assert code == 0, out
    assert "spent ε=0.1;" in out and "ε remaining 1.7 of 2" in out
    code, out, _ = run("budget", "show", *base, "bob")
    assert code == 0
    cells = [c.strip() for c in out.splitlines()[2].split("|")]
    assert cells[:3] == ["bob", "0.3", "1.7"]


def test_demo_init_never_shows_the_postgres_password(pg_dsn: str, tmp_path: Path) -> None:
    # The test cluster trusts local connections, so any password works; it must never be echoed.
    with_password = pg_dsn.replace("@", ":hunter2@", 1)
    assert "hunter2" in with_password
    code, out, err = run(
        "demo", "--init", str(tmp_path / "d"), "--persons", "100", "--postgres", with_password
    )
    assert code == 0, out + err
    assert "hunter2" not in out + err
    assert ":***@" in out and "loaded into" in out
    from dpproxy.cli import mask_dsn

    masked = mask_dsn("host=db dbname=demo user=bob password=hunter2")
    assert "hunter2" not in masked and "password=***" in masked and "dbname=demo" in masked


# --- Apache Spark (sc://…) ----------------------------------------------------------------------------


def test_help_names_the_spark_connect_url() -> None:
    for command in ("serve", "query", "explain", "policy check", "policy init"):
        code, out, _ = run(*command.split(), "--help")
        assert code == 0 and "sc://" in out, command
    code, out, _ = run("demo", "--help")
    assert "--spark URL" in out and "--spark-database" in out


def test_policy_check_says_what_a_unit_unique_table_vouches_for(tmp_path: Path) -> None:
    policy = tmp_path / "vouched.yaml"
    policy.write_text(
        POLICY.read_text().replace(
            "    max_groups_per_unit: 1\n", "    unit_unique: true\n    max_groups_per_unit: 1\n", 1
        )
    )
    code, out, err = run("policy", "check", str(policy))
    assert code == 0, err
    assert (
        "note: tables.patients.unit_unique: the policy vouches that patient_id is unique and never NULL in patients"
        in out
    )
    assert "visits.unit_unique" not in out


def test_a_missing_spark_client_names_the_extra(tmp_path: Path) -> None:
    # The client's import fails as when pyspark-client is not installed.
    code = "import sys; sys.modules['pyspark'] = None; from dpproxy.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "query", "--policy", str(POLICY), "--backend", "sc://localhost:1/;token=abc",
         "--analyst", "alice", "--ledger", str(tmp_path / "l.sqlite"), "SELECT COUNT(*) FROM patients"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "ERROR 08006: the Spark backend needs the Spark Connect client (pyspark-client), which is not "
        "installed: pip install 'dpproxy[spark]'"
    )


@SPARK
def test_policy_init_and_check_on_spark(spark_demo_url: str, tmp_path: Path) -> None:
    token = spark_demo_url.rpartition("token=")[2]
    code, out, err = run("policy", "init", "--backend", spark_demo_url, "--schema", "demo")
    assert code == 0, err
    # Spark's types, as policy types; each table in the Spark database demo.
    assert out.count("    schema: demo\n") == 3
    assert "      income:     {type: numeric, summable: false}" in out
    assert "      sex:        {type: text}" in out and "      enrolled:   {type: date}" in out
    assert "      visit_id:         {type: bigint, summable: false}" in out
    # Where the values lie, read on Spark too (its percentiles approximate).
    assert "      #   values when drafted: 99% in [" in out
    draft = tmp_path / "draft.yaml"
    draft.write_text(out)
    assert {(t.name, t.schema) for t in load_policy(draft).tables} == {
        ("patients", "demo"), ("visits", "demo"), ("zip_info", "demo"),
    }  # fmt: skip
    code, out, err = run("policy", "check", str(draft), "--backend", spark_demo_url)
    assert code == 0, err
    assert out.splitlines()[-1] == f"{draft}: matches the schema of {spark_demo_url.replace(token, '***')}"
    assert token not in out + err


@SPARK
def test_demo_init_loads_spark_and_prints_a_serve_line_without_the_token(
    spark_server: SparkServer, tmp_path: Path
) -> None:
    directory = tmp_path / "d"
    code, out, err = run(
        "demo", "--init", str(directory), "--persons", "100", "--spark", spark_server.url,
        "--spark-database", "demo_cli",
    )  # fmt: skip
    assert code == 0, err
    assert spark_server.token not in out + err
    policy = directory / "demo-spark.yaml"
    masked = f"sc://localhost:{spark_server.port}/;token=***"
    assert out.splitlines()[-3:] == [
        f"wrote {policy}, the demo policy for it (each table has schema: demo_cli)",
        "serve it with:",
        f"  dpproxy serve --policy {policy} --backend '{masked}' --database demo --ledger "
        f"{directory / 'ledger.sqlite'}  (write your token in place of ***)",
    ]
    assert {t.schema for t in load_policy(policy).tables} == {"demo_cli"}
    ledger = str(tmp_path / "ledger.sqlite")
    code, out, err = run(
        "query", "--policy", str(policy), "--backend", spark_server.url, "--analyst", "alice", "--ledger", ledger,
        "SELECT COUNT(*) FROM zip_info",
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[2].strip() == "2000"  # a public table: exact
    code, out, err = run(
        "explain", "--policy", str(policy), "--backend", spark_server.url, "SELECT COUNT(*) FROM patients"
    )
    assert code == 0, err
    assert "FROM `demo_cli`.`patients`" in out and "cost: ε=0.5" in out


def _payments(con) -> None:
    con.execute("CREATE TABLE payments (patient_id INTEGER, amount DOUBLE PRECISION, paid DATE)")
    con.execute(
        "INSERT INTO payments SELECT i % 20, i, DATE '2024-01-01' + CAST(i AS INTEGER) "
        "FROM generate_series(1, 200) AS g(i)"
    )
    con.execute(
        "INSERT INTO payments VALUES (1, 100000, DATE '2024-12-31'), (2, NULL, NULL), (NULL, NULL, NULL)"
    )


def test_policy_init_says_where_each_columns_values_lay(tmp_path: Path, pg_conn, pg_dsn: str) -> None:
    """`policy init` reads, with the data owner's connection, where each number, date and time
    column's values lie, and says it under the column: for the amounts 1..200 and one of 100,000,
    99% lie in [2, 200], which is the range to bound them by (all lie in [1, 100000]); and notes
    the rows without a person, which every private query leaves out. On DuckDB and PostgreSQL alike."""
    for backend, out in _drafted_on_both(tmp_path, pg_conn, pg_dsn, _payments):
        lines = out.splitlines()
        amount = next(i for i, line in enumerate(lines) if line.strip().startswith("amount:"))
        assert lines[amount + 1] == "      #   values when drafted: 99% in [2, 200], all in [1, 100000]", (
            backend
        )
        assert (
            "    # NOTE: 1 row(s) had no patient_id when drafted: they belong to no person\n"
            "    # and are left out of every private query. If each is a different person, write\n"
            '    # null_units: each_a_person (README, "Rows without a person").\n'
        ) in out
        paid = next(i for i, line in enumerate(lines) if line.strip().startswith("paid:"))
        assert lines[paid + 1] == "      #   values when drafted: [2024-01-02, 2024-12-31]", backend
        draft = tmp_path / "draft.yaml"
        draft.write_text(out)
        assert not load_policy(draft).table("payments").column("amount").bounded
        # `policy check --backend` says when a declared range is far wider than where 99% lie.
        wide = re.sub(
            r"amount: *\{type: double precision, summable: false\}",
            "amount: {type: double precision, lower: 0, upper: 100000}",
            out,
        )
        draft.write_text(wide)
        assert (
            "warning: tables.payments.columns.amount: lower..upper is [0, 100000], 505 times as wide as "
            "where 99% of its values lie, [2, 200]: an average's noise grows with upper - lower (a sum's "
            "with the larger of |lower| and |upper|), and bounds near that range shrink it as much, but "
            "values outside the bounds are clipped (check that what lies beyond matters little)"
        ) in _checked(draft, backend), backend
        draft.write_text(wide.replace("upper: 100000", "upper: 300"))
        assert "warning" not in _checked(draft, backend)


def test_the_backend_may_come_from_the_environment(demo_copy: Path, tmp_path: Path) -> None:
    """$DPPROXY_BACKEND keeps a DSN's password out of the process list (/proc/PID/cmdline)."""
    result = CliRunner(env={"DPPROXY_BACKEND": str(demo_copy)}).invoke(
        main,
        ["query", "--policy", str(POLICY), "--analyst", "alice", "--ledger", str(tmp_path / "l.sqlite"),
         "SELECT COUNT(*) FROM patients"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "spent ε=0.5" in result.output
