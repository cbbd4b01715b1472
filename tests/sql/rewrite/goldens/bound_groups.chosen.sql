SELECT
  *,
  (
    "__rows" * 1000 / "__total"
  ) AS "__q0",
  "__rows" * 1000 % "__total" AS "__m0",
  (
    "__c1" * 1000 / "__total"
  ) AS "__q1",
  "__c1" * 1000 % "__total" AS "__m1",
  (
    "__c2" * 1000 / "__total"
  ) AS "__q2",
  "__c2" * 1000 % "__total" AS "__m2",
  CASE WHEN "__c3" < 0 THEN -1 ELSE 1 END AS "__sign3",
  (
    ABS("__c3") * 1000 / "__total"
  ) AS "__q3",
  ABS("__c3") * 1000 % "__total" AS "__m3",
  CASE WHEN "__c4" < 0 THEN -1 ELSE 1 END AS "__sign4",
  (
    ABS("__c4") * 1000 / "__total"
  ) AS "__q4",
  ABS("__c4") * 1000 % "__total" AS "__m4"
FROM (
  SELECT
    *,
    ROW_NUMBER() OVER (
      PARTITION BY "__unit"
      ORDER BY HASHTEXTEXTENDED(
        'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
        0
      ), "__k0"
    ) AS "__gn",
    CAST(SUM("__rows") OVER (PARTITION BY "__unit") AS BIGINT) AS "__total",
    COUNT(*) OVER (PARTITION BY "__unit") AS "__groups"
  FROM per_unit
) AS ranked
WHERE
  "__gn" <= 2
