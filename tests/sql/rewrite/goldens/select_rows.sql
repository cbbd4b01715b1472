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
  NOT "t0"."pid" IS NULL
  AND (
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
