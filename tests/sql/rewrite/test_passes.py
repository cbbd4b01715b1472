"""Golden tests of the rewrite passes: each pass, applied to the state the passes before it built,
must write exactly this SQL (PostgreSQL dialect, salt "golden"). A change to one pass shows up in its
own test, and the diff is the SQL a reviewer must check against the privacy argument
(docs/privacy.md). To update after an intended change, print the new SQL with the same code and read
it before pasting.

Inputs: tests/sql/rewrite/goldens_spec.py (each case: the pass, the policy and the statement it is
shown with); the SQL: tests/sql/rewrite/goldens/<case>.sql.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.sql.numbers import emit
from dpproxy.sql.rewrite import RULES, rewrite
from dpproxy.sql.rewrite.row_pipeline import refinement_select
from dpproxy.sql.rewrite.state import RewriteContext, RewriteState
from tests.sql.rewrite.goldens_spec import CASES, policy

REFINED_WINDOW = [301, 302, 303]


def refinement_written(case: str) -> str:
    """The second statement of the case's refined histogram, for the coarse bins REFINED_WINDOW."""
    _, _, kwargs, sql = CASES[case]
    query = Engine(parse_policy(policy(**kwargs)), None).analyze(sql)
    state = rewrite(query, salt="golden", dialect="postgres")
    (h,) = [h for h, histogram in enumerate(query.histograms) if histogram.fine]
    steps = {step.name: step.select for step in state.auxiliary}
    return emit(refinement_select(steps[f"histogram_{h}"], h, REFINED_WINDOW), "postgres", pretty=True)


def rewritten_by(case: str) -> tuple[RewriteState, RewriteState]:
    """The state before the case's pass (what the passes before it built) and after it."""
    pass_name, _, kwargs, sql = CASES[case]
    query = Engine(parse_policy(policy(**kwargs)), None).analyze(sql)
    ctx = RewriteContext(query, "golden", "postgres")
    state = RewriteState()
    for rule in RULES:
        after = rule(state, ctx)
        if rule.__name__ == pass_name:
            return state, after
        state = after
    raise AssertionError(f"no pass named {pass_name}")


def written(before: RewriteState, after: RewriteState) -> str:
    """The SQL the pass added: a CTE step, the final SELECT, or the row pipeline's statements."""
    if after.auxiliary != before.auxiliary:
        return "\n\n".join(emit(step.select, "postgres", pretty=True) for step in after.auxiliary)
    if after.steps != before.steps:
        return emit(after.steps[-1].select, "postgres", pretty=True)
    assert after.final is not None
    return emit(after.final, "postgres", pretty=True)


GOLDENS = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("case", list(CASES))
def test_pass_writes_its_golden_sql(case: str) -> None:
    pass_name, reads, _, _ = CASES[case]
    if pass_name == "refinement":
        assert refinement_written(case) == (GOLDENS / f"{case}.sql").read_text().rstrip("\n")
        return
    before, after = rewritten_by(case)
    # The pass's input: the relation the steps before it end with (none for the first pass, and for
    # the row pipeline, which reads the tables itself).
    assert (before.current if before.steps else None) == reads or pass_name == "row_pipeline"
    assert written(before, after) == (GOLDENS / f"{case}.sql").read_text().rstrip("\n")


def test_every_golden_file_is_a_case() -> None:
    assert sorted(p.stem for p in GOLDENS.glob("*.sql")) == sorted(CASES)
