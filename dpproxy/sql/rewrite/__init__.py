"""The rewrite of a private query, as an ordered list of passes (after sqlglot's optimizer RULES).

Each pass is a pure function `rule(state, ctx) -> state` over sqlglot expressions; the state is a
chain of CTEs, so the SQL after any pass can be printed and run (`dpproxy explain` shows each one).
Together they implement the contribution bounding of docs/privacy.md §3: clip every value, bound
each unit's rows per group and groups, pre-aggregate per unit, aggregate exactly per group. Noise is
never added here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from dpproxy.sql.query import PrivateQuery
from dpproxy.sql.rewrite.bound_groups import bound_groups
from dpproxy.sql.rewrite.bound_rows import bound_rows
from dpproxy.sql.rewrite.per_group import per_group
from dpproxy.sql.rewrite.per_unit import per_unit
from dpproxy.sql.rewrite.row_pipeline import row_pipeline
from dpproxy.sql.rewrite.select_rows import select_rows
from dpproxy.sql.rewrite.state import RewriteContext, RewriteState
from dpproxy.sql.rewrite.to_grid import to_grid

Rule = Callable[[RewriteState, RewriteContext], RewriteState]

RULES: tuple[Rule, ...] = (select_rows, to_grid, bound_rows, per_unit, bound_groups, per_group, row_pipeline)


def rewrite(query: PrivateQuery, *, salt: str | None = None, dialect: str = "postgres") -> RewriteState:
    """Fold the query through RULES. The salt is fresh per plan unless given (tests fix it)."""
    ctx = RewriteContext(query, salt if salt is not None else secrets.token_hex(8), dialect)
    state = RewriteState()
    # Without a main statement only the row pipeline is built (it reads the tables itself).
    for rule in RULES if query.needs_main_statement else (row_pipeline,):
        state = rule(state, ctx)
    return state
