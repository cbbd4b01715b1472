WITH rows_selected AS (
  SELECT
    "t0"."pid" AS "__unit",
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
), rows_sampled AS (
  SELECT
    "__unit",
    "__h0",
    "__rn"
  FROM (
    SELECT
      *,
      ROW_NUMBER() OVER (
        PARTITION BY "__unit"
        ORDER BY HASHTEXTEXTENDED(
          'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__h0" AS VARCHAR), ''),
          0
        ), "__h0"
      ) AS "__rn"
    FROM rows_selected
  ) AS ranked
  WHERE
    "__rn" <= 4
)
SELECT
  "__h0",
  SUM(CASE WHEN "__rn" <= 1 THEN 1 ELSE 0 END) AS "__count0",
  SUM(CASE WHEN "__rn" <= 2 THEN 1 ELSE 0 END) AS "__count1",
  SUM(CASE WHEN "__rn" <= 4 THEN 1 ELSE 0 END) AS "__count2"
FROM rows_sampled
WHERE
  NOT "__h0" IS NULL
GROUP BY
  "__h0"
