WITH rows_selected AS (
  SELECT
    "t0"."pid" AS "__unit",
    (
      "t0"."grp" COLLATE "C"
    ) AS "__k0",
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
  WHERE
    NOT "t0"."pid" IS NULL
), rows_bounded AS (
  SELECT
    "__unit",
    "__k0",
    "__h0",
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
          'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), '') || '|' || COALESCE(CAST("__h0" AS VARCHAR), ''),
          0
        ), "__h0"
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
  SUM(CASE WHEN "__rn" - "__gstart" < 1 AND "__gn" <= 1 THEN 1 ELSE 0 END) AS "__count0",
  SUM(CASE WHEN "__rn" - "__gstart" < 1 AND "__gn" <= 2 THEN 1 ELSE 0 END) AS "__count1",
  SUM(CASE WHEN "__rn" - "__gstart" < 2 AND "__gn" <= 1 THEN 1 ELSE 0 END) AS "__count2",
  SUM(CASE WHEN "__rn" - "__gstart" < 2 AND "__gn" <= 2 THEN 1 ELSE 0 END) AS "__count3",
  SUM(CASE WHEN "__rn" - "__gstart" < 4 AND "__gn" <= 1 THEN 1 ELSE 0 END) AS "__count4",
  SUM(CASE WHEN "__rn" - "__gstart" < 4 AND "__gn" <= 2 THEN 1 ELSE 0 END) AS "__count5"
FROM rows_bounded
WHERE
  NOT "__h0" IS NULL
GROUP BY
  "__k0",
  "__h0"
