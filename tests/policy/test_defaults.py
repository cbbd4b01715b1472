"""Defaults: per-query ε and δ, the mechanism, accounting (pure or zCDP) and replay with its data epoch."""

from __future__ import annotations

import pytest

from dpproxy.policy import Defaults, Mechanism
from tests.policy.policy_text import TABLE, assert_problem, load, only_problem, problems


@pytest.mark.parametrize(
    ("defaults", "path", "fragment"),
    [
        ("epsilon: 0", "defaults.epsilon", "greater than 0"),
        ("epsilon: -1", "defaults.epsilon", "greater than 0"),
        ("delta: 1", "defaults.delta", "below 1"),
        ("delta: -0.1", "defaults.delta", "at least 0"),
        (
            "mechanism: gaussian, delta: 0",
            "defaults.delta",
            "gaussian mechanism needs a delta greater than 0",
        ),
        ("mechanism: cauchy", "defaults.mechanism", "laplace or gaussian"),
        ("min_epsilon: 0.6", "defaults.min_epsilon", "min_epsilon <= epsilon <= max_epsilon"),
        ("epsilon: 2", "defaults.epsilon", "min_epsilon <= epsilon <= max_epsilon"),
        ("min_epsilon: 2, max_epsilon: 1, epsilon: 1.5", "defaults.epsilon", "min_epsilon <= epsilon"),
        ("epsilon: .inf", "defaults.epsilon", "finite"),
        ("epsilon: .nan", "defaults.epsilon", "finite"),
        ("epsilon: 1e400", "defaults.epsilon", "too large to be a finite number"),
    ],
)
def test_bad_defaults_are_rejected(defaults, path, fragment):
    only_problem(
        f"version: 1\ndefaults: {{{defaults}}}\ntables: {{t: {{public: true}}}}\n", 2, path, fragment
    )


def test_defaults_are_loaded():
    text = (
        "version: 1\ndefaults: {epsilon: 0.2, delta: 1e-6, mechanism: gaussian, max_epsilon: 0.5}\n"
        "tables: {t: {public: true}}\n"
    )
    defaults = load(text).defaults
    assert (defaults.epsilon, defaults.delta, defaults.mechanism) == (0.2, 1e-6, Mechanism.GAUSSIAN)
    assert (defaults.min_epsilon, defaults.max_epsilon) == (0.001, 0.5)


def test_accounting_is_pure_and_replay_on_by_default():
    defaults = load("version: 1\ndefaults: {epsilon: 0.2}\ntables: {t: {public: true}}\n").defaults
    assert (defaults.accounting, defaults.replay, defaults.mechanism) == ("pure", True, Mechanism.LAPLACE)
    assert load(TABLE).defaults == Defaults()
    assert (Defaults().accounting, Defaults().replay) == ("pure", True)


def test_zcdp_accounting_implies_gaussian_noise():
    text = """
        version: 1
        defaults:
          accounting: zcdp
          replay: false
        analysts:
          ann: {epsilon: 10, delta: 1.0e-5}
        tables: {t: {public: true}}
    """
    defaults = load(text).defaults
    assert (defaults.accounting, defaults.mechanism, defaults.delta) == ("zcdp", Mechanism.GAUSSIAN, 1e-7)
    assert defaults.replay is False
    explicit = load(
        "version: 1\ndefaults: {accounting: ZCDP, mechanism: gaussian}\ntables: {t: {public: true}}\n"
    )
    assert (explicit.defaults.accounting, explicit.defaults.mechanism) == ("zcdp", Mechanism.GAUSSIAN)
    pure = load(
        "version: 1\ndefaults: {accounting: pure, mechanism: gaussian}\ntables: {t: {public: true}}\n"
    )
    assert (pure.defaults.accounting, pure.defaults.mechanism) == ("pure", Mechanism.GAUSSIAN)


@pytest.mark.parametrize(
    ("defaults", "path", "fragments"),
    [
        ("accounting: rdp", "defaults.accounting", ("unknown accounting `rdp`", "write pure or zcdp")),
        ("accounting: [zcdp]", "defaults.accounting", ("expected text", "write pure or zcdp")),
        ("acounting: zcdp", "defaults.acounting", ("unknown key", "did you mean `accounting`?")),
        (
            "accounting: zcdp, mechanism: laplace",
            "defaults.mechanism",
            ("laplace noise cannot be charged in ρ", "write `mechanism: gaussian`", "`accounting: pure`"),
        ),
        (
            "accounting: zcdp, delta: 0",
            "defaults.delta",
            ("`accounting: zcdp` needs a delta greater than 0", "set defaults.delta"),
        ),
        (
            "accounting: zcdp, mechanism: gaussian, delta: 0",
            "defaults.delta",
            ("`accounting: zcdp` needs a delta greater than 0", "or use `accounting: pure`"),
        ),
        ("replay: 'yes'", "defaults.replay", ("expected true or false", "without quotes")),
        ("replay: 1", "defaults.replay", ("expected true or false",)),
    ],
)
def test_bad_accounting_and_replay_are_rejected(defaults, path, fragments):
    only_problem(
        f"version: 1\ndefaults: {{{defaults}}}\ntables: {{t: {{public: true}}}}\n", 2, path, *fragments
    )


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("3", 3),
        ("-1", -1),
        ("0", 0),
        ('"3"', "3"),  # text: another epoch than the number 3
        ("2024-06-01", "2024-06-01"),  # an unquoted date is taken as written
        ("june-refresh", "june-refresh"),
        ("'yes'", "yes"),
    ],
)
def test_replay_epoch_is_a_whole_number_or_text(written, expected):
    assert Defaults().data_epoch == 0 and load(TABLE).defaults.data_epoch == 0
    defaults = load(
        f"version: 1\ndefaults: {{data_epoch: {written}}}\ntables: {{t: {{public: true}}}}\n"
    ).defaults
    assert defaults.data_epoch == expected and type(defaults.data_epoch) is type(expected)


@pytest.mark.parametrize(
    "written",
    ["1.5", "1e3", "true", "yes", "null", ".inf", "[1]", "{a: 1}", '""', '"   "', '"' + "x" * 101 + '"'],
)
def test_replay_epoch_bad_values_are_rejected(written):
    text = (
        f"version: 1\ndefaults:\n  epsilon: 0.5\n  data_epoch: {written}\ntables: {{t: {{public: true}}}}\n"
    )
    only_problem(text, 4, "defaults.data_epoch", "whole number", 'text such as "2024-06-01"')


def test_zcdp_problems_name_their_own_lines_and_every_analyst_needs_delta():
    text = """
        version: 1
        defaults:
          accounting: zcdp
          mechanism: laplace
        analysts:
          ann: {epsilon: 10, delta: 1.0e-5}
          bob:
            epsilon: 1
            delta: 0
        tables: {t: {public: true}}
    """
    found = problems(text)
    assert len(found) == 2, "\n".join(found)
    assert_problem(found, 4, "defaults.mechanism", "laplace noise cannot be charged in ρ")
    assert_problem(
        found,
        9,
        "analysts.bob.delta",
        "must be greater than 0 under `accounting: zcdp`",
        "give the analyst a small δ budget such as 1.0e-5",
    )
    # Under pure accounting the same analyst is fine: δ = 0 allows only queries spending no δ.
    assert load(text.replace("accounting: zcdp", "accounting: pure")).analyst("bob").delta == 0.0
