SELECT
  *,
  CASE WHEN "__c3" < 0 THEN -1 ELSE 1 END AS "__sign3",
  CASE WHEN "__c4" < 0 THEN -1 ELSE 1 END AS "__sign4"
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
