"""Drafting a policy from a live schema: it loads as-is, is conservative, and loads once filled in."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from decimal import Decimal

from dpproxy.policy import ColumnType, ValueRange, check_against_schema, draft_policy, parse_policy
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


def test_draft_policy_reaches_persons_through_foreign_keys():
    """Normalised schemas: order_items carries order_id, not the customer; flights carry the aircraft
    (the planes table, referenced by its key, is the person); airlines, a two-column code list, is
    referenced too. No table with a foreign key is drafted `row`."""
    integer, text = (ColumnType.INTEGER, "INTEGER"), (ColumnType.TEXT, "TEXT")
    live = {
        "orders": [Live("order_id", *integer), Live("customer_id", *integer)],
        "order_items": [Live("item_id", *integer), Live("order_id", *integer), Live("sku", *text)],
        "shipments": [Live("ship_id", *integer), Live("item_id", *integer)],
        "planes": [Live("tailnum", *text), Live("seats", *integer), Live("model", *text)],
        "airlines": [Live("carrier", *text), Live("name", *text)],
        "flights": [Live("flight", *integer), Live("tailnum", *text), Live("carrier", *text)],
    }
    foreign_keys = {
        "order_items": [("order_id", "orders", "order_id")],
        "shipments": [("item_id", "order_items", "item_id")],
        "flights": [("carrier", "airlines", "carrier"), ("tailnum", "planes", "tailnum")],
    }
    draft = draft_policy(live, foreign_keys=foreign_keys)
    policy = parse_policy(draft, "draft.yaml")
    assert check_against_schema(policy, live) == []
    tables = {t.name: t for t in policy.tables}
    assert tables["orders"].privacy_unit == "customer_id" and tables["orders"].unit_reference is None
    assert (tables["order_items"].unit_reference.table, tables["order_items"].unit_reference.on) == (
        "orders",
        "order_id",
    )
    assert tables["order_items"].privacy_unit == "customer_id"
    # A chain: shipments → order_items → orders.
    assert tables["shipments"].unit_reference.table == "order_items"
    assert tables["shipments"].privacy_unit == "customer_id"
    # The aircraft is the person; flights carry its key, so name it directly.
    assert tables["planes"].privacy_unit == "tailnum" and tables["flights"].privacy_unit == "tailnum"
    assert tables["flights"].unit_reference is None
    assert "it also references airlines(carrier)" in draft
    assert not any(t.unit_is_row for t in policy.tables)


def test_draft_policy_sets_the_rows_ceiling_to_the_most_rows_one_person_has() -> None:
    """With bounds chosen per query k never goes below a quarter of the rows ceiling: a draft that
    reads the most rows one person has (`most_rows`, the caller's count) writes it as the ceiling;
    a table whose count is unknown keeps the restrictive 1."""
    asked: list[tuple[str, str]] = []

    def most_rows(table: str, unit: str) -> int | None:
        asked.append((table, unit))
        return 575 if table == "visits" else None

    policy = parse_policy(draft_policy(DEMO_LIVE, most_rows=most_rows), "draft.yaml")
    assert ("visits", "patient_id") in asked and ("patients", "patient_id") in asked
    assert policy.table("visits").max_rows_per_unit == 1024  # 575 rounded up: analysts see ceilings
    assert policy.table("patients").max_rows_per_unit == 1
    assert all(table != "zip_info" for table, _ in asked)  # `row`: no person to count rows of


def test_draft_policy_says_where_the_values_lay_under_each_column() -> None:
    """With `value_ranges` (the caller's reading of the data), the draft says under each number, date
    and time column other than the unit where its values lay: for numbers where 99% of them do, for
    the data owner choosing `lower` and `upper`; it still loads as-is and bounds nothing itself. A
    column the reading left out, or a table without such columns, gets no line."""
    asked: dict[str, list[str]] = {}

    def value_ranges(table: str, columns: Sequence[str]) -> Mapping[str, ValueRange]:
        asked[table] = list(columns)
        if table != "visits":
            return {}
        return {
            "cost": ValueRange(Decimal("0.50"), Decimal("19999.99"), Decimal("12.5"), Decimal("4200.00")),
            "duration_minutes": ValueRange(1, 600, 5, 180),
            "visit_date": ValueRange(dt.date(2023, 1, 2), dt.date(2023, 12, 30)),
        }

    draft = draft_policy(DEMO_LIVE, value_ranges=value_ranges)
    assert asked == {
        "patients": ["age", "income", "enrolled"],  # not the unit, not text or booleans
        "visits": ["visit_id", "visit_date", "cost", "duration_minutes"],
    }
    lines = draft.splitlines()
    cost = next(i for i, line in enumerate(lines) if line.strip().startswith("cost:"))
    assert lines[cost + 1] == "      #   values when drafted: 99% in [12.5, 4200], all in [0.5, 19999.99]"
    minutes = next(i for i, line in enumerate(lines) if line.strip().startswith("duration_minutes:"))
    assert lines[minutes + 1] == "      #   values when drafted: 99% in [5, 180], all in [1, 600]"
    day = next(i for i, line in enumerate(lines) if line.strip().startswith("visit_date:"))
    assert "add lower: ..., upper: ... (date_trunc buckets become public keys)" in lines[day]
    assert lines[day + 1] == "      #   values when drafted: [2023-01-02, 2023-12-30]"
    assert draft.count("values when drafted:") == 3  # visit_id was left out by the reading
    assert draft.count('"values when drafted" quote the data') == 1  # visits only
    policy = parse_policy(draft, "draft.yaml")
    assert not any(c.bounded for c in policy.table("visits").columns)
