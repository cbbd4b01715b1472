"""Pass 1 — read the protected table: filter, restrict public keys, project what later passes need.

    SELECT zip, SUM(income) FROM patients WHERE age > 30 GROUP BY zip
    becomes
    SELECT t0.patient_id AS __unit, t0.zip AS __k0, <income clipped to its bounds> AS __c0
    FROM patients AS t0 WHERE <age clipped> > 30

Rows whose public key is not one of the declared public values are dropped here, so that only the
declared values can be released for that key; so are rows whose privacy unit is NULL (no person),
unless the policy makes each a person of its own (`null_units: each_a_person`: Relation.unit_row).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from sqlglot import exp

from dpproxy.sql.relation import Relation
from dpproxy.sql.rewrite.state import (
    UNIT,
    UNIT_ROW,
    RewriteContext,
    RewriteState,
    component_column,
    key_column,
    key_value,
)


def public_value_literal(value: object) -> exp.Expression:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, Decimal)):
        text = str(value)
        literal = exp.Literal.number(text.lstrip("-"))
        return exp.Neg(this=literal) if text.startswith("-") else literal
    if isinstance(value, dt.datetime):
        return exp.Cast(
            this=exp.Literal.string(value.isoformat(sep=" ")),
            to=exp.DataType.build(exp.DataType.Type.TIMESTAMP),
        )
    if isinstance(value, dt.date):
        return exp.Cast(
            this=exp.Literal.string(value.isoformat()), to=exp.DataType.build(exp.DataType.Type.DATE)
        )
    return exp.Literal.string(str(value))


def person_projections(relation: Relation) -> list[exp.Expression]:
    """The columns that name each row's person (RewriteContext.persons): the unit as UNIT, and with
    `null_units: each_a_person` the digest of a row without one as UNIT_ROW (Relation.unit_row)."""
    assert relation.unit is not None
    projections: list[exp.Expression] = [exp.alias_(relation.unit.copy(), UNIT, quoted=True, copy=False)]
    unit_row = relation.unit_row
    if unit_row is not None:
        projections.append(exp.alias_(unit_row, UNIT_ROW, quoted=True, copy=False))
    return projections


def read_relation(ctx: RewriteContext, projections: list[exp.Expression]) -> exp.Select:
    """SELECT projections FROM the relation (joins) WHERE the query's condition AND every public key
    is one of its declared values."""
    query = ctx.query
    base, joins = query.relation.from_items()
    select = exp.select(*projections, copy=False).from_(base, copy=False)
    for join in joins:
        select = select.join(join, copy=False)
    conditions: list[exp.Expression] = []
    if ctx.per_unit and query.relation.unit is not None and not query.relation.null_unit_columns:
        # A row whose privacy unit is NULL belongs to no person its bounds could follow: it is left
        # out of every private query (README, "Rows without a person"), unless the policy makes each
        # such row a person of its own (`null_units: each_a_person`, Relation.unit_row).
        conditions.append(exp.Not(this=exp.Is(this=query.relation.unit.copy(), expression=exp.Null())))
    if query.where is not None:
        conditions.append(exp.Paren(this=query.where.copy()))
    for key in query.keys:
        if key.public_values is None:
            continue
        if key.contiguous:
            # The values are every value the key can take between the first and the last (the days
            # of a range, its weeks): the span says it in two constants, not thousands.
            first, last = key.public_values[0], key.public_values[-1]
            conditions.append(
                exp.Between(
                    this=key.sql.copy(), low=public_value_literal(first), high=public_value_literal(last)
                )
            )
        else:
            values = [public_value_literal(v) for v in key.public_values]
            conditions.append(exp.In(this=key.sql.copy(), expressions=values))
    if conditions:
        select = select.where(exp.and_(*conditions, copy=False), copy=False)
    return select


def select_rows(state: RewriteState, ctx: RewriteContext) -> RewriteState:
    query = ctx.query
    relation = query.relation
    projections: list[exp.Expression] = []
    if ctx.per_unit:
        projections.extend(person_projections(relation))
    for j, key in enumerate(query.keys):
        projections.append(exp.alias_(key_value(key, ctx.dialect), key_column(j), quoted=True, copy=False))
    for i in ctx.valued_components:
        argument = query.components[i].argument
        assert argument is not None
        projections.append(exp.alias_(argument.copy(), component_column(i), quoted=True, copy=False))
    if not projections:
        projections.append(exp.alias_(exp.Literal.number(1), "__row", quoted=True, copy=False))
    select = read_relation(ctx, projections)
    return state.then(
        "selected_rows",
        "read the tables: joins, WHERE, public keys restricted to their declared values, columns clipped to "
        "bounds",
        select,
    )
