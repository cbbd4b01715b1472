SELECT
  "__unit",
  "__k0",
  LEAST("__counted", 4) AS "__rows",
  CAST(CASE
    WHEN "__counted" > 4
    THEN (
      DIV("__sum0", "__counted") * 4 + DIV((
        "__sum0" % "__counted"
      ) * 4, "__counted")
    )
    ELSE "__sum0"
  END AS BIGINT) AS "__c0",
  CAST(CASE
    WHEN "__counted" > 4
    THEN (
      DIV("__sum1", "__counted") * 4 + DIV((
        "__sum1" % "__counted"
      ) * 4, "__counted")
    )
    ELSE "__sum1"
  END AS BIGINT) AS "__c1"
FROM (
  SELECT
    "__unit",
    "__k0",
    COUNT(CASE WHEN "__c0" <> 0 OR "__c1" <> 0 THEN 1 END) AS "__counted",
    COALESCE(SUM("__c0"), 0) AS "__sum0",
    COALESCE(SUM("__c1"), 0) AS "__sum1"
  FROM grid_values
  GROUP BY
    "__unit",
    "__k0"
) AS "__sums"
