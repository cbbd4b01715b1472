SELECT
  "__unit",
  "__k0",
  "__rows",
  "__c1",
  "__c2",
  "__c3",
  "__c4"
FROM (
  SELECT
    *,
    ROW_NUMBER() OVER (
      PARTITION BY "__unit"
      ORDER BY HASHTEXTEXTENDED(
        'golden:groups' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), ''),
        0
      ), "__k0"
    ) AS "__gn"
  FROM per_unit
) AS ranked
WHERE
  "__gn" <= 2
