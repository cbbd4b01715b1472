"""Analysts: budgets, and passwords that must be SCRAM verifiers and are never echoed."""

from __future__ import annotations

import pytest

from dpproxy.scram import make_verifier, parse_verifier
from tests.policy.policy_text import load, only_problem

# A verifier for the password "pw", made once (PBKDF2 is deliberately slow).
PW_VERIFIER = make_verifier("pw")


def test_analysts_may_be_empty_or_absent():
    assert load("version: 1\ntables: {t: {public: true}}\n").analysts == ()
    assert load("version: 1\nanalysts: {}\ntables: {t: {public: true}}\n").analysts == ()
    assert load("version: 1\nanalysts:\ntables: {t: {public: true}}\n").analysts == ()


def analyst(spec: str) -> str:
    return f"version: 1\nanalysts:\n  ann: {{{spec}}}\ntables: {{t: {{public: true}}}}\n"


@pytest.mark.parametrize(
    "password",
    ["hunter2-plaintext", "md5a3556571e93b0d20722ba62be61e8c2d", "SCRAM-SHA-256$4096:c2FsdA==$bad:bad"],
)
def test_passwords_must_be_scram_verifiers_and_are_never_echoed(password):
    found = only_problem(analyst(f'password: "{password}", epsilon: 1, delta: 0'), 3, "analysts.ann.password")
    assert "run `dpproxy policy passwd` and paste its output" in found
    assert password not in found


def test_analysts_are_loaded_and_a_password_is_optional():
    text = f"""
        version: 1
        analysts:
          ann: {{password: "{PW_VERIFIER}", epsilon: 10, delta: 1.0e-5, max_epsilon_per_query: 2}}
          cli_only: {{epsilon: 1, delta: 0}}
          later: {{password: null, epsilon: 1, delta: 0}}
        tables: {{t: {{public: true}}}}
    """
    policy = load(text)
    ann = policy.analyst("ann")
    assert ann.password == PW_VERIFIER and parse_verifier(ann.password).matches("pw")
    assert (ann.epsilon, ann.delta, ann.max_epsilon_per_query) == (10.0, 1e-5, 2.0)
    assert PW_VERIFIER not in repr(ann)
    assert policy.analyst("cli_only").password is None
    assert policy.analyst("later").password is None
    assert policy.epsilon_limits(ann) == (0.001, 2.0)


@pytest.mark.parametrize(
    ("spec", "path", "fragment"),
    [
        ("epsilon: 0, delta: 0", "epsilon", "greater than 0"),
        ("epsilon: 1, delta: 1", "delta", "below 1"),
        (
            "epsilon: 1, delta: 0, max_epsilon_per_query: 2",
            "max_epsilon_per_query",
            "greater than the analyst's total",
        ),
        ("epsilon: 1, delta: 0, max_epsilon_per_query: 0", "max_epsilon_per_query", "greater than 0"),
        (
            "epsilon: 1, delta: 0, max_epsilon_per_query: 0.0001",
            "max_epsilon_per_query",
            "below defaults.min_epsilon",
        ),
    ],
)
def test_bad_analyst_budgets_are_rejected(spec, path, fragment):
    only_problem(analyst(spec), 3, f"analysts.ann.{path}", fragment)
