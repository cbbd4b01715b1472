"""Policy YAML as a person reads it: duplicate keys reported, YAML 1.1 surprises avoided, merge keys,
and alias bombs refused.
"""

from __future__ import annotations

import pytest

from dpproxy.errors import PolicyError
from dpproxy.policy import ColumnType, parse_policy
from tests.policy.policy_text import SOURCE, assert_problem, load, problems


def test_duplicate_yaml_keys_are_reported_not_silently_overwritten():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: pid
            columns:
              pid: {type: integer}
              x: {type: integer, lower: 0, upper: 10}
              x: {type: text}
        tables: {u: {public: true}}
    """
    found = problems(text)
    assert_problem(found, 8, "tables.t.columns.x", "duplicate key (first given on line 7)", "keep only one")
    assert_problem(found, 9, "tables", "duplicate key (first given on line 2)")
    assert len(found) == 2


def test_yaml_1_1_spellings_keep_their_meaning():
    # `no` and `on` are booleans to YAML 1.1 and 1e-5 is a string; 010 is octal. None of that
    # should leak into a policy: keys are names as written and numbers are read as decimals.
    text = """
        version: 1
        analysts:
          a: {epsilon: 1, delta: 1e-5}
        tables:
          t:
            privacy_unit: row
            columns:
              no: {type: integer, lower: 010, upper: 1e3}
              on: {type: text, public_values: [00501, NO, yes, 1.50]}
    """
    policy = load(text)
    assert policy.analyst("a").delta == 1e-5
    table = policy.table("t")
    assert table.column("no").lower == 10 and table.column("no").upper == 1000
    assert table.column("on").public_values == ("00501", "NO", "yes", "1.50")


def test_alias_bombs_are_refused_quickly():
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        levels.append(f"l{i}: &l{i} [" + ", ".join([f"*{'a' if i == 1 else f'l{i - 1}'}"] * 10) + "]")
    text = "version: 1\n" + "\n".join(levels) + "\ntables: {t: {public: true}}\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text, SOURCE)
    assert "once aliases are expanded" in info.value.problems[0]


def test_merge_keys_share_settings_and_own_keys_win():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            columns:
              a: &money {type: numeric, lower: 0, upper: 100, scale: 2}
              b: {<<: *money, upper: 50}
    """
    table = load(text).table("t")
    assert table.column("a").upper == 100
    b = table.column("b")
    assert (b.type, b.lower, b.upper, b.scale) == (ColumnType.NUMERIC, 0, 50, 2)
