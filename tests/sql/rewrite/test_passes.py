"""Golden tests of the rewrite passes: each pass, applied to the state the passes before it built,
must write exactly this SQL (PostgreSQL dialect, salt "golden"). A change to one pass shows up in its
own test, and the diff is the SQL a reviewer must check against the privacy argument
(docs/privacy.md). To update after an intended change, print the new SQL with the same code and read
it before pasting.

Inputs: tests/sql/rewrite/goldens_spec.py (the policy, the statement each pass is shown with).
"""

from __future__ import annotations

import pytest

from dpproxy.engine import Engine
from dpproxy.policy import parse_policy
from dpproxy.sql.numbers import emit
from dpproxy.sql.rewrite import RULES
from dpproxy.sql.rewrite.state import RewriteContext, RewriteState
from tests.sql.rewrite.goldens_spec import CASES, policy


def rewritten_by(pass_name: str) -> tuple[RewriteState, RewriteState]:
    """The state before the pass (what the passes before it built) and after it."""
    kwargs, sql = CASES[pass_name]
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


GOLDEN_SELECT_ROWS = """\
SELECT
  "t0"."pid" AS "__unit",
  (
    "t0"."grp" COLLATE "C"
  ) AS "__k0",
  (
    CASE
      WHEN "t0"."y" IS NULL
      THEN NULL
      WHEN "t0"."y" < 0
      THEN 0
      WHEN "t0"."y" > 100
      THEN 100
      ELSE "t0"."y"
    END
  ) AS "__c1",
  (
    CASE
      WHEN "t0"."x" IS NULL
      THEN NULL
      WHEN "t0"."x" < -5
      THEN -5
      WHEN "t0"."x" > 10
      THEN 10
      ELSE "t0"."x"
    END
  ) AS "__c2",
  (
    CASE
      WHEN "t0"."x" IS NULL
      THEN NULL
      WHEN "t0"."x" < -5
      THEN -5
      WHEN "t0"."x" > 10
      THEN 10
      ELSE "t0"."x"
    END
  ) AS "__c3",
  (
    CASE
      WHEN CAST("t0"."z" AS DOUBLE PRECISION) IS NULL
      THEN NULL
      WHEN CAST("t0"."z" AS DOUBLE PRECISION) < CAST('-1' AS DOUBLE PRECISION)
      THEN CAST('-1' AS DOUBLE PRECISION)
      WHEN CAST("t0"."z" AS DOUBLE PRECISION) > CAST('1' AS DOUBLE PRECISION)
      THEN CAST('1' AS DOUBLE PRECISION)
      WHEN ABS(CAST("t0"."z" AS DOUBLE PRECISION)) < CAST('1e-100' AS DOUBLE PRECISION)
      THEN CAST('0' AS DOUBLE PRECISION)
      ELSE CAST("t0"."z" AS DOUBLE PRECISION)
    END
  ) AS "__c4"
FROM "t" AS "t0"
WHERE
  (
    (
      (
        CASE
          WHEN "t0"."x" IS NULL
          THEN NULL
          WHEN "t0"."x" < -5
          THEN -5
          WHEN "t0"."x" > 10
          THEN 10
          ELSE "t0"."x"
        END
      )
    ) > 0
  )
"""

GOLDEN_TO_GRID = """\
SELECT
  "__unit",
  "__k0",
  CAST(CAST("__c1" AS DECIMAL(18, 2)) * 100 AS BIGINT) AS "__c1",
  CASE WHEN "__c2" IS NULL THEN 0 ELSE 1 END AS "__c2",
  (
    CAST("__c3" AS BIGINT) - 2
  ) AS "__c3",
  CAST(FLOOR("__c4" * 100 + CAST('0.5' AS DOUBLE PRECISION)) AS BIGINT) AS "__c4"
FROM selected_rows
"""

GOLDEN_BOUND_ROWS = """\
SELECT
  "__unit",
  "__k0",
  "__c1",
  "__c2",
  "__c3",
  "__c4"
FROM (
  SELECT
    *,
    ROW_NUMBER() OVER (
      PARTITION BY "__unit", "__k0"
      ORDER BY HASHTEXTEXTENDED(
        'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), '') || '|' || COALESCE(CAST("__c1" AS VARCHAR), '') || '|' || COALESCE(CAST("__c2" AS VARCHAR), '') || '|' || COALESCE(CAST("__c3" AS VARCHAR), '') || '|' || COALESCE(CAST("__c4" AS VARCHAR), ''),
        0
      ), "__c1", "__c2", "__c3", "__c4"
    ) AS "__rn"
  FROM grid_values
) AS ranked
WHERE
  "__rn" <= 2
"""

GOLDEN_PER_UNIT = """\
SELECT
  "__unit",
  "__k0",
  LEAST(COUNT(*), 2) AS "__rows",
  LEAST(GREATEST(COALESCE(SUM("__c1"), 0), 0), 20000) AS "__c1",
  LEAST(SUM("__c2"), 2) AS "__c2",
  LEAST(GREATEST(COALESCE(SUM("__c3"), 0), -14), 16) AS "__c3",
  LEAST(GREATEST(COALESCE(SUM("__c4"), 0), -200), 200) AS "__c4"
FROM grid_values
GROUP BY
  "__unit",
  "__k0"
"""

GOLDEN_BOUND_GROUPS = """\
SELECT
  "__unit",
  "__k0",
  "__rows",
  "__c1",
  "__c2",
  "__c3",
  "__c4"
FROM (
  SELECT
    *,
    ROW_NUMBER() OVER (
      PARTITION BY "__unit"
      ORDER BY HASHTEXTEXTENDED(
        'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
        0
      ), "__k0"
    ) AS "__gn"
  FROM per_unit
) AS ranked
WHERE
  "__gn" <= 2
"""

GOLDEN_PER_GROUP = """\
SELECT
  "__k0",
  COALESCE(SUM("__rows"), 0) AS "__c0",
  COALESCE(SUM("__c1"), 0) AS "__c1",
  COALESCE(SUM("__c2"), 0) AS "__c2",
  COALESCE(SUM("__c3"), 0) AS "__c3",
  COALESCE(SUM("__c4"), 0) AS "__c4",
  COUNT(*) AS "__units"
FROM bounded_groups
GROUP BY
  "__k0"
"""

GOLDEN_ROW_PIPELINE = """\
WITH rows_selected AS (
  SELECT
    "t0"."pid" AS "__unit",
    (
      "t0"."grp" COLLATE "C"
    ) AS "__k0",
    "t0"."pub" AS "__c0",
    DIV(
      CAST((
        CAST((
          CASE
            WHEN (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            ) IS NULL
            THEN NULL
            WHEN (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            ) < -5
            THEN -5
            WHEN (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            ) > 10
            THEN 10
            ELSE (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            )
          END
        ) AS BIGINT) - -5
      ) * 15 AS BIGINT),
      15
    ) AS "__h0"
  FROM "t" AS "t0"
), rows_bounded AS (
  SELECT
    "__unit",
    "__k0",
    "__c0",
    "__h0"
  FROM (
    SELECT
      *,
      ROW_NUMBER() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0", HASHTEXTEXTENDED(
          'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), '') || '|' || COALESCE(CAST("__c0" AS VARCHAR), '') || '|' || COALESCE(CAST("__h0" AS VARCHAR), ''),
          0
        ), "__c0", "__h0"
      ) AS "__rn",
      RANK() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0"
      ) AS "__gstart",
      DENSE_RANK() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0"
      ) AS "__gn"
    FROM rows_selected
  ) AS ranked
  WHERE
    "__gn" <= 2 AND "__rn" - "__gstart" < 2
)
SELECT
  "__k0",
  COUNT(DISTINCT "__c0") AS "__c0"
FROM rows_bounded
GROUP BY
  "__k0"

WITH rows_selected AS (
  SELECT
    "t0"."pid" AS "__unit",
    (
      "t0"."grp" COLLATE "C"
    ) AS "__k0",
    "t0"."pub" AS "__c0",
    DIV(
      CAST((
        CAST((
          CASE
            WHEN (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            ) IS NULL
            THEN NULL
            WHEN (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            ) < -5
            THEN -5
            WHEN (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            ) > 10
            THEN 10
            ELSE (
              CASE
                WHEN "t0"."x" IS NULL
                THEN NULL
                WHEN "t0"."x" < -5
                THEN -5
                WHEN "t0"."x" > 10
                THEN 10
                ELSE "t0"."x"
              END
            )
          END
        ) AS BIGINT) - -5
      ) * 15 AS BIGINT),
      15
    ) AS "__h0"
  FROM "t" AS "t0"
), rows_bounded AS (
  SELECT
    "__unit",
    "__k0",
    "__c0",
    "__h0"
  FROM (
    SELECT
      *,
      ROW_NUMBER() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0", HASHTEXTEXTENDED(
          'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), '') || '|' || COALESCE(CAST("__c0" AS VARCHAR), '') || '|' || COALESCE(CAST("__h0" AS VARCHAR), ''),
          0
        ), "__c0", "__h0"
      ) AS "__rn",
      RANK() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0"
      ) AS "__gstart",
      DENSE_RANK() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0"
      ) AS "__gn"
    FROM rows_selected
  ) AS ranked
  WHERE
    "__gn" <= 2 AND "__rn" - "__gstart" < 2
)
SELECT
  "__k0",
  "__h0",
  COUNT(*) AS "__count"
FROM rows_bounded
WHERE
  NOT "__h0" IS NULL
GROUP BY
  "__k0",
  "__h0"
"""


@pytest.mark.parametrize(
    ("pass_name", "reads", "golden"),
    [
        ("select_rows", None, GOLDEN_SELECT_ROWS),
        ("to_grid", "selected_rows", GOLDEN_TO_GRID),
        ("bound_rows", "grid_values", GOLDEN_BOUND_ROWS),
        ("per_unit", "grid_values", GOLDEN_PER_UNIT),
        ("bound_groups", "per_unit", GOLDEN_BOUND_GROUPS),
        ("per_group", "bounded_groups", GOLDEN_PER_GROUP),
        ("row_pipeline", None, GOLDEN_ROW_PIPELINE),
    ],
)
def test_pass_writes_its_golden_sql(pass_name: str, reads: str | None, golden: str) -> None:
    before, after = rewritten_by(pass_name)
    # The pass's input: the relation the steps before it end with (none for the first pass, and for
    # the row pipeline, which reads the tables itself).
    assert (before.current if before.steps else None) == reads or pass_name == "row_pipeline"
    assert written(before, after) == golden.rstrip("\n")
