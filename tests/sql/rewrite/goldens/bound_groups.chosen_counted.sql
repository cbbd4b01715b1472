SELECT
  *
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
    GREATEST(CAST(SUM("__rows") OVER (PARTITION BY "__unit") AS BIGINT), 1) AS "__total",
    COUNT(*) OVER (PARTITION BY "__unit") AS "__groups"
  FROM per_unit
) AS ranked
