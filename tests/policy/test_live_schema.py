"""A policy against the live schema: missing tables and columns, and types wider than declared."""

from __future__ import annotations

from dpproxy.policy import ColumnType, check_against_schema, load_policy
from tests.policy.demo_schema import DEMO_LIVE, Live
from tests.policy.policy_text import POLICIES, load


def test_the_demo_policy_matches_the_demo_schema():
    assert check_against_schema(load_policy(POLICIES / "demo.yaml"), DEMO_LIVE) == []


def test_schema_check_finds_missing_tables_columns_and_wrong_types():
    live = {name: list(columns) for name, columns in DEMO_LIVE.items() if name != "zip_info"}
    live["patients"] = [c for c in live["patients"] if c.name != "zip"]
    live["patients"][1] = Live("age", ColumnType.BIGINT, "BIGINT")
    live["patients"][3] = Live("income", ColumnType.DOUBLE, "DOUBLE")
    live["visits"][2] = Live("visit_date", ColumnType.TEXT, "TEXT")
    live["visits"][3] = Live("department", None, "JSON")
    found = check_against_schema(load_policy(POLICIES / "demo.yaml"), live)
    assert len(found) == 6, "\n".join(found)
    text = "\n".join(found)
    assert "tables.zip_info: the database has no table zip_info" in text
    assert "tables.patients.columns.zip: the database table patients has no column zip" in text
    assert "patients.age is BIGINT, wider than the policy's integer; declare `type: bigint`" in text
    assert "patients.income is DOUBLE, wider than the policy's numeric" in text
    assert "visits.visit_date is TEXT, incompatible with the policy's date" in text
    assert "visits.department has type JSON, which dpproxy does not support" in text
    assert all(p.startswith(str(POLICIES / "demo.yaml")) for p in found)


def test_schema_check_finds_schema_qualified_tables():
    policy = load("version: 1\ntables:\n  z: {public: true, schema: ref, columns: {n: {type: bigint}}}\n")
    assert check_against_schema(policy, {"ref.z": [Live("n", ColumnType.INTEGER, "integer")]}) == []
    assert "no table ref.z" in check_against_schema(policy, {})[0]


def test_bounds_with_more_decimals_than_a_wide_decimal_column_are_refused():
    """Compared with its bounds at their scale, a DECIMAL(38,0) column's value of 10^37 failed the
    query on DuckDB (an adversarial review): a value-dependent failure, refused at start instead."""
    text = "version: 1\ntables:\n  t:\n    privacy_unit: pid\n    columns:\n      pid: {type: integer}\n"
    wide = load(text + "      y: {type: numeric, lower: 0, upper: 100.5, scale: 1}\n")
    live = {"t": [Live("pid", ColumnType.INTEGER, "INTEGER"), Live("y", ColumnType.NUMERIC, "DECIMAL(38,0)")]}
    [problem] = check_against_schema(wide, live)
    assert "t.y is DECIMAL(38,0): bounds with 1 decimal(s)" in problem and "declare `scale: 0`" in problem
    whole = load(text + "      y: {type: numeric, lower: 0, upper: 100, scale: 1}\n")
    assert check_against_schema(whole, live) == []  # whole bounds: compared at the column's scale
    live["t"][1] = Live("y", ColumnType.NUMERIC, "DECIMAL(18,3)")  # room for the decimal: fine
    assert check_against_schema(wide, live) == []
