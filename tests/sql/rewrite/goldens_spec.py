"""The policy and statements the golden tests of the rewrite passes use (see test_passes.py)."""

from __future__ import annotations


def policy(*, rows: int = 2, groups: int = 2, bounding: str = "clamp") -> str:
    return f"""
version: 1
tables:
  t:
    privacy_unit: pid
    max_rows_per_unit: {rows}
    max_groups_per_unit: {groups}
    row_bounding: {bounding}
    columns:
      pid: {{type: integer}}
      grp: {{type: text}}
      pub: {{type: text, public_values: [a, b, c]}}
      x: {{type: integer, lower: -5, upper: 10}}
      y: {{type: numeric, lower: 0, upper: 100, scale: 2}}
      z: {{type: double precision, lower: -1, upper: 1}}
"""


SUMS = "SELECT grp, COUNT(*), SUM(y), AVG(x), SUM(z) FROM t WHERE x > 0 GROUP BY grp"
# Each pass, the policy it is shown with, and the statement it rewrites.
CASES: dict[str, tuple[dict[str, object], str]] = {
    "select_rows": ({}, SUMS),
    "to_grid": ({}, SUMS),
    "bound_rows": ({"bounding": "sample"}, SUMS),
    "per_unit": ({}, SUMS),
    "bound_groups": ({}, SUMS),
    "per_group": ({}, SUMS),
    "row_pipeline": ({}, "SELECT grp, COUNT(DISTINCT pub), MEDIAN(x) FROM t GROUP BY grp"),
}
