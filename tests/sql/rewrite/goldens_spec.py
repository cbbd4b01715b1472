"""The policy and statements the golden tests of the rewrite passes use (see test_passes.py)."""

from __future__ import annotations


def policy(*, rows: int = 2, groups: int = 2, bounding: str = "clamp", bounds: str = "fixed") -> str:
    return f"""
version: 1
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: {rows}
    max_groups_per_unit: {groups}
    row_bounding: {bounding}
    contribution_bounds: {bounds}
    columns:
      pid: {{type: integer}}
      grp: {{type: text}}
      pub: {{type: text, public_values: [a, b, c]}}
      x: {{type: integer, lower: -5, upper: 10}}
      y: {{type: numeric, lower: 0, upper: 100, scale: 2}}
      z: {{type: double precision, lower: -1, upper: 1}}
"""


SUMS = "SELECT grp, COUNT(*), SUM(y), AVG(x), SUM(z) FROM t WHERE x > 0 GROUP BY grp"
FILTERED = (
    "SELECT grp, COUNT(*) FILTER (WHERE x > 0), SUM(CASE WHEN y > 50 THEN 1 ELSE 0 END) FROM t GROUP BY grp"
)
CHOSEN = {"rows": 4, "groups": 2, "bounds": "chosen"}
# Each golden case: (the pass, the relation it reads, the policy it is shown with, the statement).
# Its SQL is tests/sql/rewrite/goldens/<case>.sql.
CASES: dict[str, tuple[str, str | None, dict[str, object], str]] = {
    "select_rows": ("select_rows", None, {}, SUMS),
    "to_grid": ("to_grid", "selected_rows", {}, SUMS),
    "bound_rows.sample": ("bound_rows", "grid_values", {"bounding": "sample"}, SUMS),
    "per_unit.clamp": ("per_unit", "grid_values", {}, SUMS),
    "bound_groups.fixed": ("bound_groups", "per_unit", {}, SUMS),
    "per_group.fixed": ("per_group", "bounded_groups", {}, SUMS),
    "row_pipeline": (
        "row_pipeline",
        None,
        {},
        "SELECT grp, COUNT(DISTINCT pub), MEDIAN(x) FROM t GROUP BY grp",
    ),
    # Bounds chosen per query: sums scaled, not clamped; every candidate's values in one pass.
    "per_unit.chosen": ("per_unit", "grid_values", CHOSEN, SUMS),
    "bound_groups.chosen": ("bound_groups", "per_unit", CHOSEN, SUMS),
    "per_group.chosen": ("per_group", "ranked_groups", CHOSEN, SUMS),
    # Without COUNT(*), k counts a person's rows that add to a released value (some value neither
    # NULL nor 0 on the grid): a FILTER's rows, not every row; the total is at least 1, as the
    # quotients divide by it.
    "per_unit.chosen_counted": ("per_unit", "grid_values", CHOSEN, FILTERED),
    "bound_groups.chosen_counted": ("bound_groups", "per_unit", CHOSEN, FILTERED),
    # Public keys (their values restricted where the rows are read) with bounds chosen and a count
    # of persons per group (COUNT(DISTINCT unit)): the candidates of g.
    # A refined quantile's second statement: the same bounded rows as its histogram's first pass,
    # counted per sub-bin inside the coarse bins around the first pick (here bins 301 to 303).
    "row_pipeline.refinement": ("refinement", None, {}, "SELECT grp, MEDIAN(y) FROM t GROUP BY grp"),
    # Bounds chosen per query: a histogram counts the rows each person keeps at every candidate k
    # (their first k in the group's salted order), one column each; the release keeps the chosen
    # one's. Per group (rows_bounded numbers a person's rows in all), over the whole table
    # (rows_sampled), and in a refinement's second statement.
    "row_pipeline.chosen": ("row_pipeline", None, CHOSEN, "SELECT grp, MEDIAN(x) FROM t GROUP BY grp"),
    "row_pipeline.chosen_scalar": ("row_pipeline", None, CHOSEN, "SELECT MEDIAN(x) FROM t"),
    "row_pipeline.refinement_chosen": (
        "refinement",
        None,
        CHOSEN,
        "SELECT grp, MEDIAN(y) FROM t GROUP BY grp",
    ),
    "per_group.public_keys": (
        "per_group",
        "ranked_groups",
        CHOSEN,
        "SELECT pub, COUNT(*), COUNT(DISTINCT pid) FROM t GROUP BY pub",
    ),
}
