"""`dpproxy audit` in a terminal: an analyst's statement text and parameters are theirs to write, so
control characters in them must not reach the operator's terminal, where escape sequences could
erase or rewrite the lines above (hiding the analyst's own statements from the audit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dpproxy.audit import StatementRecord
from dpproxy.budget import open_ledger
from dpproxy.cli import main

ERASE_LINE_ABOVE = "\x1b[1A\x1b[2K"  # cursor up, erase the line
C1_CSI = "\x9b2K"  # the one-character CSI of C1 controls


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_control_characters_an_analyst_wrote_are_shown_escaped(tmp_path: Path, fmt: str) -> None:
    path = str(tmp_path / "ledger.sqlite")
    with open_ledger(path) as ledger:
        hidden = StatementRecord("alice", "SELECT COUNT(*) FROM patients", kind="private")
        sneaky = StatementRecord(
            "alice", f"SELECT 1 {ERASE_LINE_ABOVE * 3}\rnothing to see \u202e", (C1_CSI, "\x07"), kind="query"
        )
        for record in (hidden, sneaky):
            record.finish()
        ledger.audit_write([hidden, sneaky])
    result = CliRunner().invoke(main, ["audit", "--ledger", path, "--format", fmt])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "\x9b" not in result.stdout and "\x07" not in result.stdout
    assert "\u202e" not in result.stdout and "\\u202e" in result.stdout  # no reordering of what is read
    if fmt == "table":
        assert "\r" not in result.stdout
    assert "\\x1b[1A" in result.stdout and "nothing to see" in result.stdout
    assert "SELECT COUNT(*) FROM patients" in result.stdout
