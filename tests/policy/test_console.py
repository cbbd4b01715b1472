"""The `console:` section: owners with SCRAM verifiers (never a plaintext password, never echoed)."""

from __future__ import annotations

import pytest

from dpproxy.scram import make_verifier, parse_verifier
from tests.policy.policy_text import load, only_problem

PW_VERIFIER = make_verifier("pw")


def test_the_console_section_is_optional():
    assert load("version: 1\ntables: {t: {public: true}}\n").console is None


def test_owners_are_loaded_with_their_verifiers_kept_out_of_repr():
    policy = load(
        f"""
        version: 1
        console:
          owners:
            carol: {{password: "{PW_VERIFIER}"}}
          session_minutes: 30
        tables: {{t: {{public: true}}}}
        """
    )
    assert policy.console.session_minutes == 30
    carol = policy.console.owner("carol")
    assert parse_verifier(carol.password).matches("pw") and PW_VERIFIER not in repr(policy.console)
    assert policy.console.owner("alice") is None


@pytest.mark.parametrize("password", ["hunter2-plaintext", "SCRAM-SHA-256$4096:c2FsdA==$bad:bad"])
def test_an_owners_password_must_be_a_verifier_and_is_never_echoed(password):
    text = f'version: 1\nconsole:\n  owners:\n    carol: {{password: "{password}"}}\ntables: {{t: {{public: true}}}}\n'
    found = only_problem(text, 4, "console.owners.carol.password")
    assert "run `dpproxy policy passwd` and paste its output" in found and password not in found


@pytest.mark.parametrize(
    ("section", "line", "path", "fragment"),
    [
        ("console:\n", 2, "console", "has no owners"),
        ("console: {owners: {}}\n", 2, "console.owners", "no owner is listed"),
        (
            f'console: {{owners: {{carol: {{password: "{PW_VERIFIER}"}}}}, session_minutes: 0}}\n',
            2,
            "console.session_minutes",
            "between 1 and",
        ),
        (
            f'console: {{owners: {{Carol: {{password: "{PW_VERIFIER}"}}}}}}\n',
            2,
            "console.owners.Carol",
            "not a valid owner name",
        ),
        ("console: {owners: {carol: {}}}\n", 2, "console.owners.carol.password", "missing"),
        (
            f'console: {{owners: {{carol: {{password: "{PW_VERIFIER}"}}}}, sesion_minutes: 5}}\n',
            2,
            "console.sesion_minutes",
            "did you mean `session_minutes`",
        ),
    ],
)
def test_console_problems_name_the_key_and_a_fix(section, line, path, fragment):
    only_problem(f"version: 1\n{section}tables: {{t: {{public: true}}}}\n", line, path, fragment)
