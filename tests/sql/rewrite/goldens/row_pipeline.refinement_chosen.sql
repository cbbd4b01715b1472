WITH rows_selected AS (
  SELECT
    "t0"."pid" AS "__unit",
    (
      "t0"."grp" COLLATE "C"
    ) AS "__k0",
    DIV(
      CAST((
        CAST(CAST((
          CASE
            WHEN (
              CASE
                WHEN "t0"."y" IS NULL
                THEN NULL
                WHEN "t0"."y" < 0
                THEN 0
                WHEN "t0"."y" > 100
                THEN 100
                ELSE "t0"."y"
              END
            ) IS NULL
            THEN NULL
            WHEN (
              CASE
                WHEN "t0"."y" IS NULL
                THEN NULL
                WHEN "t0"."y" < 0
                THEN 0
                WHEN "t0"."y" > 100
                THEN 100
                ELSE "t0"."y"
              END
            ) < 0
            THEN 0
            WHEN (
              CASE
                WHEN "t0"."y" IS NULL
                THEN NULL
                WHEN "t0"."y" < 0
                THEN 0
                WHEN "t0"."y" > 100
                THEN 100
                ELSE "t0"."y"
              END
            ) > 100
            THEN 100
            ELSE (
              CASE
                WHEN "t0"."y" IS NULL
                THEN NULL
                WHEN "t0"."y" < 0
                THEN 0
                WHEN "t0"."y" > 100
                THEN 100
                ELSE "t0"."y"
              END
            )
          END
        ) AS DECIMAL(18, 2)) * 100 AS BIGINT) - 0
      ) * 999 AS BIGINT),
      10000
    ) AS "__h0",
    DIV(
      CAST((
        CAST((
          CAST(CAST((
            CASE
              WHEN (
                CASE
                  WHEN "t0"."y" IS NULL
                  THEN NULL
                  WHEN "t0"."y" < 0
                  THEN 0
                  WHEN "t0"."y" > 100
                  THEN 100
                  ELSE "t0"."y"
                END
              ) IS NULL
              THEN NULL
              WHEN (
                CASE
                  WHEN "t0"."y" IS NULL
                  THEN NULL
                  WHEN "t0"."y" < 0
                  THEN 0
                  WHEN "t0"."y" > 100
                  THEN 100
                  ELSE "t0"."y"
                END
              ) < 0
              THEN 0
              WHEN (
                CASE
                  WHEN "t0"."y" IS NULL
                  THEN NULL
                  WHEN "t0"."y" < 0
                  THEN 0
                  WHEN "t0"."y" > 100
                  THEN 100
                  ELSE "t0"."y"
                END
              ) > 100
              THEN 100
              ELSE (
                CASE
                  WHEN "t0"."y" IS NULL
                  THEN NULL
                  WHEN "t0"."y" < 0
                  THEN 0
                  WHEN "t0"."y" > 100
                  THEN 100
                  ELSE "t0"."y"
                END
              )
            END
          ) AS DECIMAL(18, 2)) * 100 AS BIGINT) - 0
        ) * 999 AS BIGINT) % 10000
      ) * 11 AS BIGINT),
      10000
    ) AS "__s0"
  FROM "t" AS "t0"
  WHERE
    NOT "t0"."pid" IS NULL
), rows_bounded AS (
  SELECT
    "__unit",
    "__k0",
    "__h0",
    "__s0",
    "__rn",
    "__gstart",
    "__gn"
  FROM (
    SELECT
      *,
      ROW_NUMBER() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
          0
        ), "__k0", HASHTEXTEXTENDED(
          'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), '') || '|' || COALESCE(CAST("__h0" AS VARCHAR), '') || '|' || COALESCE(CAST("__s0" AS VARCHAR), ''),
          0
        ), "__h0", "__s0"
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
    "__gn" <= 2 AND "__rn" - "__gstart" < 4
)
SELECT
  "__k0",
  "__h0",
  "__s0",
  SUM(CASE WHEN "__rn" - "__gstart" < 1 AND "__gn" <= 1 THEN 1 ELSE 0 END) AS "__count0",
  SUM(CASE WHEN "__rn" - "__gstart" < 1 AND "__gn" <= 2 THEN 1 ELSE 0 END) AS "__count1",
  SUM(CASE WHEN "__rn" - "__gstart" < 2 AND "__gn" <= 1 THEN 1 ELSE 0 END) AS "__count2",
  SUM(CASE WHEN "__rn" - "__gstart" < 2 AND "__gn" <= 2 THEN 1 ELSE 0 END) AS "__count3",
  SUM(CASE WHEN "__rn" - "__gstart" < 4 AND "__gn" <= 1 THEN 1 ELSE 0 END) AS "__count4",
  SUM(CASE WHEN "__rn" - "__gstart" < 4 AND "__gn" <= 2 THEN 1 ELSE 0 END) AS "__count5"
FROM rows_bounded
WHERE
  NOT "__h0" IS NULL AND "__h0" IN (301, 302, 303)
GROUP BY
  "__k0",
  "__h0",
  "__s0"
