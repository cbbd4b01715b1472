SELECT
  "__unit",
  "__k0",
  LEAST(COUNT(*), 2) AS "__rows",
  LEAST(GREATEST(COALESCE(SUM("__c1"), 0), 0), 20000) AS "__c1",
  LEAST(SUM("__c2"), 2) AS "__c2",
  LEAST(GREATEST(COALESCE(SUM("__c3"), 0), -150), 150) AS "__c3",
  LEAST(GREATEST(COALESCE(SUM("__c4"), 0), -200), 200) AS "__c4"
FROM grid_values
GROUP BY
  "__unit",
  "__k0"
