"""Drafting a policy from a live schema: it loads as-is, is conservative, and loads once filled in."""

from __future__ import annotations

from dpproxy.policy import ColumnType, check_against_schema, draft_policy, parse_policy
from tests.policy.demo_schema import DEMO_LIVE, Live


def test_draft_policy_loads_as_is_and_is_conservative():
    live = {
        **DEMO_LIVE,
        "survey": [Live("answer", ColumnType.TEXT, "TEXT"), Live("score", ColumnType.DOUBLE, "DOUBLE")],
        "odd": [Live("blob", None, "BYTEA")],
        "Mixed": [Live("a", ColumnType.TEXT, "TEXT")],
    }
    draft = draft_policy(live, analyst="ann")
    policy = parse_policy(draft, "draft.yaml")
    assert check_against_schema(policy, live) == []
    assert {t.name for t in policy.tables} == {"patients", "visits", "zip_info", "survey"}
    assert policy.table("patients").privacy_unit == "patient_id"
    assert policy.table("visits").privacy_unit == "patient_id"  # shared with patients
    assert policy.table("survey").unit_is_row
    for table in policy.tables:
        assert not table.public
        assert not any(c.bounded or c.public_values for c in table.columns), table.name
        summable = [c.name for c in table.columns if c.type.is_number and c.summable]
        assert summable in ([], [table.privacy_unit]), table.name
    assert policy.analyst("ann").password is None
    assert "TODO" in draft and "# skipped table Mixed" in draft and "skipped table odd" in draft


def test_draft_policy_loads_after_the_owner_fills_in_bounds():
    draft = draft_policy(DEMO_LIVE)
    lines = []
    for line in draft.splitlines():
        if line.strip().startswith(("age:", "income:")):
            line = line.replace("summable: false", "lower: 0, upper: 100").split("  # TODO")[0]
        lines.append(line)
    patients = parse_policy("\n".join(lines), "draft.yaml").table("patients")
    assert patients.column("age").summable and patients.column("income").upper == 100
