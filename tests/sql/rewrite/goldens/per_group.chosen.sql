SELECT
  "__k0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          "__q0" * 1 + (
            "__m0" * 1 / "__total"
          )
        )
        ELSE "__rows" * 1000
      END
    ),
    0
  ) AS "__c0_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN (
          "__q0" * 2 + (
            "__m0" * 2 / "__total"
          )
        )
        ELSE "__rows" * 1000
      END
    ),
    0
  ) AS "__c0_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN (
          "__q0" * 4 + (
            "__m0" * 4 / "__total"
          )
        )
        ELSE "__rows" * 1000
      END
    ),
    0
  ) AS "__c0_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          "__q1" * 1 + (
            "__m1" * 1 / "__total"
          )
        )
        ELSE "__c1" * 1000
      END
    ),
    0
  ) AS "__c1_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN (
          "__q1" * 2 + (
            "__m1" * 2 / "__total"
          )
        )
        ELSE "__c1" * 1000
      END
    ),
    0
  ) AS "__c1_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN (
          "__q1" * 4 + (
            "__m1" * 4 / "__total"
          )
        )
        ELSE "__c1" * 1000
      END
    ),
    0
  ) AS "__c1_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          "__q2" * 1 + (
            "__m2" * 1 / "__total"
          )
        )
        ELSE "__c2" * 1000
      END
    ),
    0
  ) AS "__c2_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN (
          "__q2" * 2 + (
            "__m2" * 2 / "__total"
          )
        )
        ELSE "__c2" * 1000
      END
    ),
    0
  ) AS "__c2_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN (
          "__q2" * 4 + (
            "__m2" * 4 / "__total"
          )
        )
        ELSE "__c2" * 1000
      END
    ),
    0
  ) AS "__c2_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN "__sign3" * (
          "__q3" * 1 + (
            "__m3" * 1 / "__total"
          )
        )
        ELSE "__c3" * 1000
      END
    ),
    0
  ) AS "__c3_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN "__sign3" * (
          "__q3" * 2 + (
            "__m3" * 2 / "__total"
          )
        )
        ELSE "__c3" * 1000
      END
    ),
    0
  ) AS "__c3_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN "__sign3" * (
          "__q3" * 4 + (
            "__m3" * 4 / "__total"
          )
        )
        ELSE "__c3" * 1000
      END
    ),
    0
  ) AS "__c3_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN "__sign4" * (
          "__q4" * 1 + (
            "__m4" * 1 / "__total"
          )
        )
        ELSE "__c4" * 1000
      END
    ),
    0
  ) AS "__c4_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN "__sign4" * (
          "__q4" * 2 + (
            "__m4" * 2 / "__total"
          )
        )
        ELSE "__c4" * 1000
      END
    ),
    0
  ) AS "__c4_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN "__sign4" * (
          "__q4" * 4 + (
            "__m4" * 4 / "__total"
          )
        )
        ELSE "__c4" * 1000
      END
    ),
    0
  ) AS "__c4_2",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__total" > 1 THEN 1 ELSE 0 END), 0) AS "__above0",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__total" > 2 THEN 1 ELSE 0 END), 0) AS "__above1",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__total" > 4 THEN 1 ELSE 0 END), 0) AS "__above2",
  COALESCE(SUM(CASE WHEN "__gn" <= 1 THEN 1 ELSE 0 END), 0) AS "__units0",
  COALESCE(SUM(CASE WHEN "__gn" <= 2 THEN 1 ELSE 0 END), 0) AS "__units1",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__groups" > 1 THEN 1 ELSE 0 END), 0) AS "__wider0",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__groups" > 2 THEN 1 ELSE 0 END), 0) AS "__wider1",
  COALESCE(SUM(CASE WHEN "__gn" = 1 THEN 1 ELSE 0 END), 0) AS "__persons",
  COUNT(*) AS "__units"
FROM ranked_groups
GROUP BY
  "__k0"
