"""`dpproxy serve` and `dpproxy demo` as an operator runs them: in a subprocess, printing where they
listen, answering a real client, and stopping cleanly on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from dpproxy.cli import main
from dpproxy.policy import load_policy

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        # Keep the default ledger and data directories out of the real home directory.
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "DPPROXY_LEDGER": str(tmp_path / "ledger.sqlite"),
    }


def test_demo_builds_serves_and_prints_how_to_connect(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpproxy.cli",
            "demo",
            "--dir",
            str(directory),
            "--persons",
            "300",
            "--port",
            "0",
            "--console-port",
            "0",  # any free port: the suite passes while the README's demo runs on 6432/6433
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,  # not the repository: the demo policy must come from the package
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not any(line.startswith("Ctrl-C") for line in lines):
            line = process.stdout.readline()
            assert line, f"dpproxy demo exited early: {''.join(lines)} {process.stderr.read()}"  # type: ignore[union-attr]
            lines.append(line)
        output = "".join(lines)
        match = re.search(r'psql "postgresql://alice@127\.0\.0\.1:(\d+)/demo"', output)
        assert match, output
        assert "alice / alice-demo" in output and "bob / bob-demo" in output
        assert (directory / "demo.duckdb").is_file()
        dsn = f"host=127.0.0.1 port={match[1]} user=alice password=alice-demo dbname=demo"
        with psycopg.connect(dsn, autocommit=True) as conn:
            (count,) = conn.execute("SELECT COUNT(*) FROM patients").fetchone()  # type: ignore[misc]
            assert 150 < count < 450
            # The query the banner suggests works as printed.
            suggested = re.search(r"then try: (.*);", output)
            assert suggested and len(conn.execute(suggested[1]).fetchall()) == 6  # public diagnoses
            assert conn.execute("SELECT current_database()").fetchone() == ("demo",)
            # A name qualified with the served database is the table; another database is not.
            assert conn.execute('SELECT COUNT(*) FROM "demo"."public"."patients"').fetchone()
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="cross-database references"):
                conn.execute("SELECT COUNT(*) FROM other.public.patients")
        # The demo serves the database "demo" only, as PostgreSQL would answer for another name.
        with pytest.raises(psycopg.OperationalError, match='database "postgres" does not exist'):
            psycopg.connect(dsn.replace("dbname=demo", "dbname=postgres"))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    # The budget lives beside the demo data, not in the default ledger.
    assert (directory / "ledger.sqlite").is_file() and not (tmp_path / "ledger.sqlite").exists()


def test_demo_init_only_builds(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--init", str(tmp_path / "d"), "--persons", "100"])
    assert result.exit_code == 0, result.output
    assert "built" in result.output and (tmp_path / "d" / "demo.duckdb").is_file()


def test_serve_help_lists_its_options() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for option in (
        "--policy",
        "--backend",
        "--host",
        "--port",
        "--ledger",
        "--tls-cert",
        "--tls-key",
        "--idle-timeout",
        "--shutdown-grace",
        "--backend-timeout",
        "--database",
    ):
        assert option in result.output


def test_serve_refuses_half_a_tls_configuration(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not used")
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "--policy",
            str(REPO / "policies" / "demo.yaml"),
            "--backend",
            "x.duckdb",
            "--tls-cert",
            str(cert),
        ],
    )
    assert result.exit_code == 2 and "--tls-key" in result.output


def test_serve_refuses_a_tls_key_other_users_can_read(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("not used")
    key.write_text("not used")
    key.chmod(0o644)
    args = ["serve", "--policy", str(REPO / "policies" / "demo.yaml"), "--backend", "x.duckdb"]
    result = CliRunner().invoke(main, [*args, "--tls-cert", str(cert), "--tls-key", str(key)])
    assert result.exit_code == 2 and "can be read by other users (mode 0644)" in result.output


def test_serve_reports_an_unusable_backend(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "--policy",
            str(REPO / "policies" / "demo.yaml"),
            "--backend",
            str(tmp_path / "missing.duckdb"),
        ],
    )
    assert result.exit_code != 0


def test_passwd_prints_an_md5_hash_for_a_user(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["policy", "passwd", "--password-stdin", "--md5-user", "carol"], input="s3cret\n"
    )
    assert result.exit_code == 0
    md5 = result.output.strip()
    assert md5 == "md5" + __import__("hashlib").md5(b"s3cretcarol").hexdigest()
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nserver: {auth_methods: [md5, scram-sha-256]}\n"
        f'analysts: {{carol: {{md5_password: "{md5}", epsilon: 1, delta: 0}}}}\n'
        "tables: {t: {public: true}}\n"
    )
    loaded = load_policy(policy)
    assert loaded.analyst("carol").md5_password == md5  # type: ignore[union-attr]
    assert [m.value for m in loaded.server.auth_methods] == ["md5", "scram-sha-256"]


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ("{auth_methods: [kerberos]}", "unknown authentication method `kerberos`"),
        ("{auth_methods: []}", "expected a non-empty list"),
        ("{auth_methods: [md5, md5]}", "listed twice"),
        ("{methods: [md5]}", "unknown key"),
    ],
)
def test_server_settings_are_validated(tmp_path: Path, server: str, problem: str) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(f"version: 1\nserver: {server}\ntables: {{t: {{public: true}}}}\n")
    result = CliRunner().invoke(main, ["policy", "check", str(policy)])
    assert result.exit_code == 1 and problem in result.output


def test_demo_credentials_printed_match_the_shipped_policy() -> None:
    from dpproxy.cli import DEMO_ANALYSTS
    from dpproxy.scram import parse_verifier

    policy = load_policy(REPO / "dpproxy" / "data" / "demo.yaml")
    for name, password in DEMO_ANALYSTS:
        verifier = policy.analyst(name).password  # type: ignore[union-attr]
        assert verifier is not None and parse_verifier(verifier).matches(password)
    assert (REPO / "policies" / "demo.yaml").resolve() == (REPO / "dpproxy" / "data" / "demo.yaml").resolve()
