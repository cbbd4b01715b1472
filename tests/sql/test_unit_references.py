"""Privacy units reached through foreign keys (`privacy_unit: {references: orders, on: order_id}`):
the policy resolves the chain; the rewrite reads the referencing table joined up the chain, so each
item row belongs to its order's person; joins on the reference's key count as joins on the unit.
Certified on D and on D minus each person — the person's orders and every item of those orders —
on both backends; refused where the referenced key is not known to be unique.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpproxy.backends import open_backend
from dpproxy.engine import Engine
from dpproxy.errors import NotSupported, PolicyError
from dpproxy.policy import parse_policy
from tests.certify import NeighbourReader, certify, insert_rows, rows_without
from tests.sql.test_certificates import CERT_SETTINGS

POLICY = """
version: 1
defaults: {{epsilon: 1.0, delta: 1.0e-6}}
analysts:
  analyst: {{epsilon: 100, delta: 1.0e-3}}
tables:
  orders:
    privacy_unit: customer_id
    max_rows_per_unit: {rows}
    max_groups_per_unit: 2
    columns:
      order_id: {{type: integer, summable: false}}
      customer_id: {{type: integer}}
      status: {{type: text, public_values: [open, shipped]}}
  order_items:
    privacy_unit: {{references: orders, on: order_id{vouch}}}
    max_rows_per_unit: {rows}
    max_groups_per_unit: 2
    columns:
      order_id: {{type: integer, summable: false}}
      product: {{type: text}}
      price: {{type: integer, lower: 0, upper: 10}}
"""

QUERIES = [
    "SELECT COUNT(*), SUM(price) FROM order_items",
    "SELECT product, COUNT(*), AVG(price) FROM order_items GROUP BY product",
    "SELECT o.status, COUNT(*), SUM(oi.price) FROM order_items oi JOIN orders o ON oi.order_id = o.order_id "
    "GROUP BY o.status",
    "SELECT o.status, COUNT(oi.price) FROM orders o LEFT JOIN order_items oi ON o.order_id = oi.order_id "
    "GROUP BY o.status",
    "SELECT COUNT(DISTINCT customer_id) FROM order_items WHERE price > 3",
    # Two rows reaching their person through the same key, joined on it: one person's rows.
    "SELECT COUNT(*), SUM(a.price) FROM order_items a JOIN order_items b ON a.order_id = b.order_id",
]


def policy(rows: int = 3, vouch: bool = True):
    return parse_policy(POLICY.format(rows=rows, vouch=", key_unique: true" if vouch else ""))


class Shop:
    """Orders (order_id unique) of persons 0…n−1, items referencing them, and orphan items whose
    order is missing (they belong to no person)."""

    def __init__(self, kind: str, conn=None) -> None:
        self.kind = kind
        self.conn = conn if conn is not None else duckdb.connect()
        self.neighbours = NeighbourReader(self.conn) if kind == "duckdb" else None

    def load(
        self, people: list[list[tuple[str, list[tuple[str, int]]]]], orphans: list[tuple[str, int]]
    ) -> None:
        if self.neighbours is not None:
            self.neighbours.forget()
        for table in ("order_items", "orders"):
            self.conn.execute(f"DROP TABLE IF EXISTS {table}")
        self.conn.execute(
            "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER, status VARCHAR)"
        )
        self.conn.execute("CREATE TABLE order_items (order_id INTEGER, product VARCHAR, price INTEGER)")
        orders, items = [], []
        for person, their_orders in enumerate(people):
            for status, their_items in their_orders:
                order_id = len(orders) + 1
                orders.append((order_id, person, status))
                items += [(order_id, product, price) for product, price in their_items]
        items += [(10_000 + i, product, price) for i, (product, price) in enumerate(orphans)]
        for table, rows in (("orders", orders), ("order_items", items)):
            insert_rows(self.conn, self.kind, table, rows)

    def run(self, sql: str, without: int | None = None) -> list[tuple]:
        """`sql` on D, or on D minus one person: their orders and every item of those orders."""
        if without is None:
            return self.conn.execute(sql).fetchall()
        mark = "%s" if self.kind == "postgres" else "?"
        deletes = [
            f"DELETE FROM order_items WHERE order_id IN (SELECT order_id FROM orders WHERE customer_id = {mark})",
            f"DELETE FROM orders WHERE customer_id = {mark}",
        ]
        return rows_without(self.conn, self.neighbours, [(delete, without) for delete in deletes], sql)


@pytest.fixture(params=["duckdb", "postgres"])
def shop(request: pytest.FixtureRequest) -> Shop:
    if request.param == "postgres":
        return Shop("postgres", request.getfixturevalue("pg_conn"))
    return Shop("duckdb")


item = st.tuples(st.sampled_from(("a", "b")), st.integers(-2, 12))
order = st.tuples(st.sampled_from(("open", "shipped")), st.lists(item, max_size=4))
people = st.lists(st.lists(order, min_size=1, max_size=3), max_size=5)


@pytest.mark.parametrize("sql", QUERIES)
@CERT_SETTINGS
@given(people=people, orphans=st.lists(item, max_size=2), rows=st.integers(1, 4))
def test_a_unit_reached_through_a_reference_keeps_its_sensitivity(
    shop: Shop, sql: str, people: list, orphans: list, rows: int
) -> None:
    shop.load(people, orphans)
    engine = Engine(policy(rows), None, dialect=shop.kind)
    plan = engine.plan(sql, salt="certificate")
    certify(plan, shop.run, len(people))


def test_the_policy_resolves_the_chain() -> None:
    text = (
        POLICY.format(rows=3, vouch="")
        + """
  shipments:
    privacy_unit: {references: order_items, on: order_id}
    columns:
      order_id: {type: integer, summable: false}
      weight: {type: integer, lower: 0, upper: 100}
"""
    )
    tables = {t.name: t for t in parse_policy(text).tables}
    assert tables["order_items"].privacy_unit == tables["shipments"].privacy_unit == "customer_id"
    assert tables["shipments"].unit_reference.table == "order_items"


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        ("{references: nowhere, on: order_id}", "`nowhere` is not a protected table of the policy"),
        ("{references: orders, on: product}", "`product` is not a listed column of orders"),
        ("{references: order_items, on: order_id}", "go round in a circle: order_items → order_items"),
        ("{references: orders}", "tables.order_items.privacy_unit.on: missing"),
    ],
)
def test_a_broken_reference_is_a_policy_error_naming_it(unit: str, message: str) -> None:
    text = POLICY.format(rows=3, vouch="").replace("{references: orders, on: order_id}", unit)
    with pytest.raises(PolicyError) as error:
        parse_policy(text)
    assert message in str(error.value)


def test_a_referenced_key_not_known_unique_is_refused_naming_it() -> None:
    engine = Engine(policy(vouch=False), None)
    with pytest.raises(NotSupported) as error:
        engine.plan("SELECT COUNT(*) FROM order_items")
    assert error.value.sqlstate == "0A000"
    assert "orders.order_id, which is not known to be unique" in error.value.message
    assert "key_unique: true" in (error.value.hint or "")


def test_a_primary_key_in_the_database_is_enough(tmp_path) -> None:
    shop = Shop("duckdb", duckdb.connect(str(tmp_path / "shop.duckdb")))
    shop.load([[("open", [("a", 5), ("b", 7)])] for _ in range(300)], [("a", 1)])
    shop.conn.close()
    engine = Engine(policy(vouch=False), open_backend(str(tmp_path / "shop.duckdb")), ledger=None)
    result = engine.execute(
        "SELECT COUNT(*), COUNT(DISTINCT customer_id) FROM order_items", analyst="analyst"
    )
    ((items, persons),) = result.rows
    assert abs(items - 600) < 60 and abs(persons - 300) < 30  # the orphan item belongs to no one
