"""psql scripting against dpproxy, with Debian's psql 15: the export and scripting paths a shell
script uses (`psql -At`, `COPY (SELECT …) TO STDOUT`, `\\copy (…) TO file`, SQL-level `PREPARE` /
`EXECUTE` / `DEALLOCATE`, and `client_min_messages` to silence the per-query NOTICE), as the
PostgreSQL 15 documentation of psql and COPY describes them.
"""

from __future__ import annotations

import csv
import io
import subprocess
from pathlib import Path

import pytest

from tests.wire.test_clients import SUBPROCESS_TIMEOUT, Served, psql_as_alice

DIAGNOSES = {"healthy", "flu", "cold", "asthma", "diabetes", "hypertension"}


def psql(served: Served, *args: str, options: str = "") -> subprocess.CompletedProcess[str]:
    """`psql -X -At -v ON_ERROR_STOP=1 ARGS…` as a script runs it; stderr kept apart."""
    program, target, env = psql_as_alice(served)
    if options:
        env["PGOPTIONS"] = options
    return subprocess.run(
        [program, *target, "-X", "-At", "-v", "ON_ERROR_STOP=1", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=SUBPROCESS_TIMEOUT,
    )


def test_psql_at_prints_bare_values_and_a_notice_on_stderr(served: Served) -> None:
    result = psql(served, "-c", "SELECT COUNT(*) FROM patients")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().isdigit()
    assert "NOTICE:" in result.stderr and "spent ε=" in result.stderr


def test_client_min_messages_silences_the_notice(served: Served) -> None:
    # At startup (PGOPTIONS), so `psql -At … 2>&1` gives only the value.
    result = psql(served, "-c", "SELECT COUNT(*) FROM patients", options="-c client_min_messages=warning")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout.strip().isdigit()
    # With SET, for the rest of the session.
    result = psql(served, "-c", "SET client_min_messages = warning", "-c", "SELECT COUNT(*) FROM visits")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout.splitlines()[-1].isdigit()


def test_copy_query_to_stdout_as_csv_with_header(served: Served) -> None:
    before = served.spent()
    result = psql(
        served,
        "-c",
        "COPY (SELECT diagnosis, COUNT(*) AS n FROM patients GROUP BY diagnosis ORDER BY diagnosis) "
        "TO STDOUT WITH (FORMAT csv, HEADER)",
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["diagnosis", "n"]
    assert {r[0] for r in rows[1:]} <= DIAGNOSES and all(r[1].isdigit() for r in rows[1:])
    assert served.spent() == pytest.approx(before + 0.5)  # the same noisy, charged answer


def test_copy_of_a_public_query_in_text_format(served: Served) -> None:
    result = psql(served, "-c", "COPY (SELECT zip, city FROM zip_info ORDER BY zip LIMIT 3) TO STDOUT")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(len(line.split("\t")) == 2 for line in lines)


def test_backslash_copy_writes_a_file(served: Served, tmp_path: Path) -> None:
    target = tmp_path / "by_sex.csv"
    result = psql(
        served,
        "-c",
        rf"\copy (SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex) TO '{target}' WITH CSV HEADER",
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(target.open()))
    assert rows[0] == ["sex", "n"] and sorted(r[0] for r in rows[1:]) == ["F", "M", "X"]


def test_copy_of_raw_rows_is_refused(served: Served) -> None:
    before = served.spent()
    result = psql(served, "-c", "COPY (SELECT * FROM patients) TO STDOUT")
    assert result.returncode != 0
    assert "raw rows" in result.stderr and "HINT" in result.stderr
    assert served.spent() == before


def test_prepare_execute_deallocate(served: Served) -> None:
    result = psql(
        served,
        "-c",
        "PREPARE older(int) AS SELECT COUNT(*) FROM patients WHERE age > $1",
        "-c",
        "EXECUTE older(40)",
        "-c",
        "DEALLOCATE older",
    )
    # Each -c is its own statement in one session: the prepared statement lives across them.
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "PREPARE" in lines and "DEALLOCATE" in lines
    assert any(line.isdigit() for line in lines)
    missing = psql(served, "-c", "EXECUTE never_prepared(1)")
    assert missing.returncode != 0
    assert 'prepared statement "never_prepared" does not exist' in missing.stderr
