"""Tables: the privacy unit, contribution limits, row bounding, randomized response, public tables."""

from __future__ import annotations

import pytest

from dpproxy.errors import PolicyError
from dpproxy.policy import ColumnType, parse_policy
from tests.policy.policy_text import TABLE, assert_problem, load, only_problem, problems


def test_privacy_unit_is_required_on_protected_tables():
    text = "version: 1\ntables:\n  t:\n    columns: {a: {type: text}}\n"
    only_problem(text, 3, "tables.t.privacy_unit", "missing", "`row`", "`public: true`")


def test_privacy_unit_must_name_a_listed_column():
    found = only_problem(TABLE.replace("privacy_unit: pid", "privacy_unit: pdi"), 4, "tables.t.privacy_unit")
    assert "`pdi` is not a listed column" in found and "did you mean `pid`?" in found


def test_row_unit_tables_cannot_raise_contribution_limits():
    text = """
        version: 1
        tables:
          t:
            privacy_unit: row
            max_groups_per_unit: 2
            max_rows_per_unit: 1
            columns: {a: {type: text}}
    """
    only_problem(text, 5, "tables.t.max_groups_per_unit", "must be 1 when the privacy unit is `row`")
    table = load(text.replace("max_groups_per_unit: 2", "max_groups_per_unit: 1")).table("t")
    assert table.unit_is_row and table.privacy_unit is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("0", "between 1 and 100000"), ("100001", "almost certainly a mistake"), ("2.5", "whole")],
)
def test_contribution_limits_are_positive_and_sane(value, fragment):
    text = TABLE.replace("privacy_unit: pid", f"privacy_unit: pid\n        max_rows_per_unit: {value}")
    only_problem(text, 5, "tables.t.max_rows_per_unit", fragment)


def test_contribution_limits_are_loaded():
    limits = "\n        max_groups_per_unit: 3\n        max_rows_per_unit: 1000"
    text = TABLE.replace("privacy_unit: pid", "privacy_unit: pid" + limits)
    table = load(text).table("t")
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (3, 1000)


def test_protected_table_needs_columns():
    only_problem("version: 1\ntables:\n  t: {privacy_unit: row}\n", 3, "tables.t.columns", "missing")


def test_public_tables_take_optional_typed_columns_and_no_privacy_keys():
    policy = load(
        "version: 1\ntables:\n  z: {public: true}\n"
        "  y: {public: true, schema: ref, columns: {n: {type: int}}}\n"
    )
    z, y = policy.table("z"), policy.table("y")
    assert z.public and z.columns == ()
    assert y.schema == "ref" and y.column("n").type is ColumnType.INTEGER
    text = """
        version: 1
        tables:
          z:
            public: true
            privacy_unit: zip
            max_rows_per_unit: 2
            columns: {zip: {type: text, public_values: [a]}, n: {type: integer, lower: 0, upper: 1}}
    """
    found = problems(text)
    assert_problem(
        found, 5, "tables.z.privacy_unit", "public table has no privacy unit", "remove `privacy_unit`"
    )
    assert_problem(found, 6, "tables.z.max_rows_per_unit", "public table")
    assert_problem(found, 7, "tables.z.columns.zip.public_values", "read raw")
    assert_problem(found, 7, "tables.z.columns.n.lower", "read raw", "remove `lower`")
    assert_problem(found, 7, "tables.z.columns.n.upper", "read raw")
    assert len(found) == 5


def test_a_table_with_nothing_under_it_is_rejected():
    only_problem("version: 1\ntables:\n  z:\n", 3, "tables.z", "expected a mapping", "{public: true}")


def test_row_bounding_is_clamp_by_default_and_can_sample() -> None:
    base = "version: 1\ntables:\n  t:\n    privacy_unit: pid\n    max_rows_per_unit: 3\n{extra}    columns: {{pid: {{type: integer}}}}\n"
    assert parse_policy(base.format(extra="")).table("t").row_bounding == "clamp"
    assert parse_policy(base.format(extra="    row_bounding: sample\n")).table("t").row_bounding == "sample"
    with pytest.raises(PolicyError) as caught:
        parse_policy(base.format(extra="    row_bounding: drop\n"), source="p.yaml")
    assert "p.yaml:6: tables.t.row_bounding: `drop` is not a row bounding; write clamp or sample" in str(
        caught.value
    )


def test_randomized_response_is_a_table_switch() -> None:
    base = (
        "version: 1\ntables:\n  t:\n    privacy_unit: pid\n{extra}    columns: {{pid: {{type: integer}}}}\n"
    )
    assert parse_policy(base.format(extra="")).table("t").randomized_response is False
    assert parse_policy(base.format(extra="    randomized_response: true\n")).table("t").randomized_response
    with pytest.raises(PolicyError) as caught:
        parse_policy(base.format(extra="    randomized_response: yes please\n"), source="p.yaml")
    assert "p.yaml:5: tables.t.randomized_response: expected true or false" in str(caught.value)


def test_unit_unique_is_vouched_for_by_the_data_owner_and_said_so() -> None:
    vouched = load(TABLE.replace("privacy_unit: pid", "privacy_unit: pid\n        unit_unique: true")).table(
        "t"
    )
    assert vouched.unit_unique and vouched.privacy_unit == "pid"
    assert vouched.vouched() == (
        "tables.t.unit_unique: the policy vouches that pid is unique and never NULL in t, so each of its "
        "rows is taken to be a different person; dpproxy cannot check this, and a duplicate would let "
        "that person count more than once"
    )
    plain = load(TABLE).table("t")
    assert not plain.unit_unique and plain.vouched() is None
    only_problem(
        TABLE.replace("privacy_unit: pid", "privacy_unit: pid\n        unit_unique: maybe"),
        5,
        "tables.t.unit_unique",
        "expected true or false",
    )


def test_unit_unique_contradicting_limits_or_a_row_unit_is_refused() -> None:
    limits = TABLE.replace(
        "privacy_unit: pid", "privacy_unit: pid\n        unit_unique: true\n        max_rows_per_unit: 3"
    )
    only_problem(limits, 6, "tables.t.max_rows_per_unit", "must be 1 when unit_unique is true")
    row = "version: 1\ntables:\n  t:\n    privacy_unit: row\n    unit_unique: true\n    columns: {a: {type: text}}\n"
    only_problem(row, 5, "tables.t.unit_unique", "`privacy_unit: row` already", "remove unit_unique")
    public = "version: 1\ntables:\n  t: {public: true, unit_unique: true}\n"
    only_problem(public, 3, "tables.t.unit_unique", "a public table has no privacy unit")
