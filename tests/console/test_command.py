"""`dpproxy console` and `serve --console-port`: served from the command line, refused without owners."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb
from click.testing import CliRunner

from dpproxy.budget import open_ledger
from dpproxy.cli import main
from tests.console.consoles import Client

POLICY = Path(__file__).resolve().parent.parent.parent / "policies" / "demo.yaml"
PLAIN = "version: 1\ntables: {t: {public: true}}\n"


def test_without_a_console_section_the_console_is_refused(tmp_path: Path) -> None:
    policy = tmp_path / "plain.yaml"
    policy.write_text(PLAIN)
    runner = CliRunner()
    result = runner.invoke(main, ["console", "--policy", str(policy), "--ledger", str(tmp_path / "l.sqlite")])
    assert result.exit_code == 2 and "has no `console:` section listing the owners" in result.output
    backend = tmp_path / "empty.duckdb"
    with duckdb.connect(str(backend)) as db:
        db.execute("CREATE TABLE t (a integer)")
    result = runner.invoke(
        main,
        ["serve", "--policy", str(policy), "--backend", str(backend), "--port", "0", "--console-port", "0",
         "--ledger", str(tmp_path / "l.sqlite"), "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--console-port: the policy" in result.output and "no `console:` section" in result.output


def test_dpproxy_console_serves_the_login_page(tmp_path: Path) -> None:
    # Only `dpproxy serve` creates a ledger: the console refuses a missing one, naming it.
    missing = subprocess.run(
        [sys.executable, "-m", "dpproxy.cli", "console", "--policy", str(POLICY), "--port", "0",
         "--ledger", str(tmp_path / "ledger.sqlite")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode != 0 and f"no privacy ledger at {tmp_path / 'ledger.sqlite'}" in missing.stderr
    assert not (tmp_path / "ledger.sqlite").exists()
    open_ledger(tmp_path / "ledger.sqlite").close()
    process = subprocess.Popen(
        [sys.executable, "-m", "dpproxy.cli", "console", "--policy", str(POLICY), "--port", "0",
         "--ledger", str(tmp_path / "ledger.sqlite")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        match = re.search(r"console at (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        client = Client(match[1])
        assert client.request("/login").status == 200
        assert client.login().status == 303 and client.request("/policy").status == 200
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
