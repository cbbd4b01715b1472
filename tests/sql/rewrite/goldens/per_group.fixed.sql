SELECT
  "__k0",
  COALESCE(SUM("__rows"), 0) AS "__c0",
  COALESCE(SUM("__c1"), 0) AS "__c1",
  COALESCE(SUM("__c2"), 0) AS "__c2",
  COALESCE(SUM("__c3"), 0) AS "__c3",
  COALESCE(SUM("__c4"), 0) AS "__c4",
  COUNT(*) AS "__units"
FROM bounded_groups
GROUP BY
  "__k0"
