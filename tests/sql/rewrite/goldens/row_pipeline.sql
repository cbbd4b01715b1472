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
  WHERE
    NOT "t0"."pid" IS NULL
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
SELECT DISTINCT
  "__k0",
  "__unit",
  "__c0"
FROM rows_bounded
WHERE
  NOT "__c0" IS NULL

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
  WHERE
    NOT "t0"."pid" IS NULL
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
