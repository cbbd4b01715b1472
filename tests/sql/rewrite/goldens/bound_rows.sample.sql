SELECT
  "__unit",
  "__k0",
  "__c1",
  "__c2",
  "__c3",
  "__c4"
FROM (
  SELECT
    *,
    ROW_NUMBER() OVER (
      PARTITION BY "__unit", "__k0"
      ORDER BY HASHTEXTEXTENDED(
        'golden:rows' || '|' || COALESCE(CAST("__unit" AS VARCHAR), '') || '|' || COALESCE(CAST("__k0" AS VARCHAR), '') || '|' || COALESCE(CAST("__c1" AS VARCHAR), '') || '|' || COALESCE(CAST("__c2" AS VARCHAR), '') || '|' || COALESCE(CAST("__c3" AS VARCHAR), '') || '|' || COALESCE(CAST("__c4" AS VARCHAR), ''),
        0
      ), "__c1", "__c2", "__c3", "__c4"
    ) AS "__rn"
  FROM grid_values
) AS ranked
WHERE
  "__rn" <= 2
