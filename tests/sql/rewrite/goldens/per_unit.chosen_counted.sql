SELECT
  "__unit",
  "__k0",
  LEAST(COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END), 4) AS "__rows",
  CAST(CASE
    WHEN COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END) > 4
    THEN (
      DIV(COALESCE(SUM("__c0"), 0), COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END)) * 4 + DIV(
        (
          COALESCE(SUM("__c0"), 0) % COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END)
        ) * 4,
        COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END)
      )
    )
    ELSE COALESCE(SUM("__c0"), 0)
  END AS BIGINT) AS "__c0",
  CAST(CASE
    WHEN COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END) > 4
    THEN (
      DIV(COALESCE(SUM("__c1"), 0), COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END)) * 4 + DIV(
        (
          COALESCE(SUM("__c1"), 0) % COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END)
        ) * 4,
        COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END)
      )
    )
    ELSE COALESCE(SUM("__c1"), 0)
  END AS BIGINT) AS "__c1"
FROM grid_values
GROUP BY
  "__unit",
  "__k0"
