SELECT
  "__unit",
  "__k0",
  CAST(CAST("__c1" AS DECIMAL(18, 2)) * 100 AS BIGINT) AS "__c1",
  CASE WHEN "__c2" IS NULL THEN 0 ELSE 1 END AS "__c2",
  (
    CAST("__c3" AS BIGINT) * 10 - 25
  ) AS "__c3",
  CAST(FLOOR("__c4" * 100 + CAST('0.5' AS DOUBLE PRECISION)) AS BIGINT) AS "__c4"
FROM selected_rows
