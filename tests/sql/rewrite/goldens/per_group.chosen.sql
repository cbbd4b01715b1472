SELECT
  "__k0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          (
            "__rows" * 1000 / "__total"
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
          (
            "__rows" * 2000 / "__total"
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
          (
            "__rows" * 4000 / "__total"
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
          (
            "__c1" * 1000 / "__total"
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
          (
            "__c1" * 2000 / "__total"
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
          (
            "__c1" * 4000 / "__total"
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
          (
            "__c2" * 1000 / "__total"
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
          (
            "__c2" * 2000 / "__total"
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
          (
            "__c2" * 4000 / "__total"
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
          (
            ABS("__c3") * 1000 / "__total"
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
          (
            ABS("__c3") * 2000 / "__total"
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
          (
            ABS("__c3") * 4000 / "__total"
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
          (
            ABS("__c4") * 1000 / "__total"
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
          (
            ABS("__c4") * 2000 / "__total"
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
          (
            ABS("__c4") * 4000 / "__total"
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
