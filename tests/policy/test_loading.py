"""Loading a policy: the top level of a file, every problem of a file at once, the example policies.

Every rejection must name the file, the line, the key path and a fix, and all problems of a file
are reported at once.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from dpproxy.errors import PolicyError
from dpproxy.policy import ColumnType, Mechanism, load_policy, parse_policy
from dpproxy.scram import parse_verifier
from tests.policy.policy_text import (
    POLICIES,
    SOURCE,
    TABLE,
    assert_problem,
    load,
    only_problem,
    problems,
    yaml_text,
)


def test_minimal_policy_loads_with_defaults():
    policy = load(TABLE)
    assert policy.version == 1
    assert policy.source == SOURCE
    assert policy.analysts == ()
    assert policy.defaults.mechanism is Mechanism.LAPLACE
    table = policy.table("t")
    assert table is not None and table.privacy_unit == "pid" and not table.public
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (1, 1)
    x = table.column("x")
    assert x is not None and x.bounded and x.summable
    assert (x.lower, x.upper) == (Decimal(0), Decimal(10))
    pid = table.column("pid")
    assert pid is not None and not pid.bounded  # the unit has no bounds, so it is never summed


def test_missing_required_keys_are_reported():
    found = problems("defaults: {epsilon: 0.5}\n")
    assert_problem(found, 1, "version", "missing", "add `version: 1`")
    assert_problem(found, 1, "tables", "missing", "add `tables:`")
    only_problem(
        "version: 1\ntables:\n  t: {public: true, columns: {a: {}}}\n",
        3,
        "tables.t.columns.a.type",
        "missing",
    )
    found = problems("version: 1\nanalysts:\n  a: {password: null}\ntables: {t: {public: true}}\n")
    assert_problem(found, 3, "analysts.a.epsilon", "missing")
    assert_problem(found, 3, "analysts.a.delta", "missing")


def test_version_must_be_1():
    only_problem(
        "version: 2\ntables: {t: {public: true}}\n", 1, "version", "unsupported version 2", "`version: 1`"
    )


def test_empty_policy_and_non_mapping_are_rejected():
    with pytest.raises(PolicyError) as info:
        parse_policy("", SOURCE)
    assert "expected a mapping with `version` and `tables`" in info.value.problems[0]
    assert_problem(problems("- version: 1\n"), 1, "(top level)", "found a list")
    only_problem("version: 1\ntables: {}\n", 2, "tables", "no tables", "at least one table")


def test_yaml_syntax_errors_name_the_line():
    found = problems("version: 1\ntables:\n  t: {public: true\n  u: 1\n")
    assert len(found) == 1
    assert (
        found[0].startswith(f"{SOURCE}:")
        and "not valid YAML" in found[0]
        and "fix the YAML syntax" in found[0]
    )
    assert_problem(problems("version: 1\ntables:\n\tt: 1\n"), 3, "(yaml)", "tabs")


def test_all_problems_are_reported_at_once_in_file_order(tmp_path):
    path = tmp_path / "five.yaml"
    path.write_text(
        yaml_text(
            """
            version: 1
            defaults: {epsilon: 0}
            analysts:
              ann: {password: letmein, epsilon: 1, delta: 0}
            tables:
              t:
                privacy_unit: pid
                columns:
                  pid: {type: integer}
                  age: {type: integer, lower: 0}
                  income: {type: numeric}
                  dx: {type: text, public_values: [a, a]}
            """
        )
    )
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    found = info.value.problems
    assert [p.split(": ")[0] for p in found] == [f"{path}:{line}" for line in (2, 4, 10, 11, 12)]
    assert str(path) in str(info.value) and "5 problem(s)" in str(info.value)
    assert info.value.sqlstate == "F0000"


def test_an_unreadable_file_is_a_policy_error(tmp_path):
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "missing.yaml")
    assert "cannot read the policy file" in info.value.problems[0]


def test_demo_policy_loads_with_the_expected_shape():
    policy = load_policy(POLICIES / "demo.yaml")
    assert [t.name for t in policy.tables] == ["patients", "visits", "zip_info"]
    patients, visits, zip_info = policy.tables
    assert patients.privacy_unit == "patient_id"
    assert (patients.max_groups_per_unit, patients.max_rows_per_unit) == (1, 1)
    assert {c.name: c.type for c in patients.columns} == {
        "patient_id": ColumnType.INTEGER,
        "age": ColumnType.INTEGER,
        "sex": ColumnType.VARCHAR,
        "income": ColumnType.NUMERIC,
        "zip": ColumnType.VARCHAR,
        "diagnosis": ColumnType.VARCHAR,
        "smoker": ColumnType.BOOLEAN,
        "enrolled": ColumnType.DATE,
    }
    assert (patients.column("age").lower, patients.column("age").upper) == (0, 120)
    income = patients.column("income")
    assert (income.lower, income.upper, income.grid_scale) == (0, 500000, 2)
    assert patients.column("sex").public_values == ("F", "M", "X")
    assert patients.column("smoker").public_values == (True, False)
    assert patients.column("zip").public_values is None
    assert len(patients.column("diagnosis").public_values) == 6

    assert visits.privacy_unit == "patient_id"
    assert (visits.max_groups_per_unit, visits.max_rows_per_unit) == (3, 5)
    assert visits.column("visit_id").type is ColumnType.BIGINT and not visits.column("visit_id").summable
    assert (visits.column("cost").lower, visits.column("cost").upper) == (0, 20000)
    assert (visits.column("duration_minutes").lower, visits.column("duration_minutes").upper) == (0, 600)
    assert len(visits.column("department").public_values) == 8
    assert zip_info.public

    alice, bob = policy.analyst("alice"), policy.analyst("bob")
    assert (alice.epsilon, alice.delta, bob.epsilon, bob.delta) == (10.0, 1e-5, 2.0, 1e-6)
    assert parse_verifier(alice.password).matches("alice-demo")
    assert parse_verifier(bob.password).matches("bob-demo")


def test_census_policy_loads_with_the_expected_shape():
    policy = load_policy(POLICIES / "census.yaml")
    (adults,) = policy.tables
    assert adults.name == "adults" and adults.unit_is_row
    assert [c.name for c in adults.columns] == [
        "age", "sex", "education", "hours_per_week", "income_bracket", "capital_gain",
    ]  # fmt: skip
    assert (adults.column("hours_per_week").lower, adults.column("hours_per_week").upper) == (0, 99)
    assert (adults.column("capital_gain").lower, adults.column("capital_gain").upper) == (0, 100000)
    assert adults.column("income_bracket").public_values == ("<=50K", ">50K")
    assert adults.column("education").public_values and adults.column("sex").public_values
    assert len(policy.analysts) == 1
    assert policy.server.audit_retention_days == 90
    assert policy.budget is not None and (policy.budget.epsilon, policy.budget.delta) == (8.0, 1e-5)
    assert policy.console is not None
    steward = policy.console.owner("steward")
    assert steward is not None and parse_verifier(steward.password).matches("census-console")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\x00\n", "(yaml): not valid YAML: the character U+0000 at offset 10 is not allowed"),
        ("version: " + "9" * 5000 + "\n", "version: is far too large"),
        (
            "version: 1\ndefaults:\n  data_epoch: " + "7" * 5000 + "\n",
            "must be a whole number of at most 100 digits",
        ),
    ],
    ids=["a NUL byte", "a 5000-digit version", "a 5000-digit data epoch"],
)
def test_text_the_yaml_reader_or_python_refuses_is_a_policy_problem(text: str, expected: str) -> None:
    """Not a traceback: a PolicyError naming the line, never quoting the text."""
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert any(expected in problem for problem in info.value.problems), info.value.problems
    assert "9" * 50 not in str(info.value) and "7" * 50 not in str(info.value)
