SELECT
  "__unit",
  "__k0",
  LEAST(COUNT(*), 4) AS "__rows",
  CAST(CASE
    WHEN COUNT(*) > 4
    THEN (
      DIV(COALESCE(SUM("__c1"), 0), COUNT(*)) * 4 + DIV((
        COALESCE(SUM("__c1"), 0) % COUNT(*)
      ) * 4, COUNT(*))
    )
    ELSE COALESCE(SUM("__c1"), 0)
  END AS BIGINT) AS "__c1",
  CAST(CASE
    WHEN COUNT(*) > 4
    THEN (
      DIV(COALESCE(SUM("__c2"), 0), COUNT(*)) * 4 + DIV((
        COALESCE(SUM("__c2"), 0) % COUNT(*)
      ) * 4, COUNT(*))
    )
    ELSE COALESCE(SUM("__c2"), 0)
  END AS BIGINT) AS "__c2",
  CAST(CASE
    WHEN COUNT(*) > 4
    THEN CASE
      WHEN COALESCE(SUM("__c3"), 0) < 0
      THEN -(
        DIV((
          -COALESCE(SUM("__c3"), 0)
        ), COUNT(*)) * 4 + DIV((
          (
            -COALESCE(SUM("__c3"), 0)
          ) % COUNT(*)
        ) * 4, COUNT(*))
      )
      ELSE (
        DIV(COALESCE(SUM("__c3"), 0), COUNT(*)) * 4 + DIV((
          COALESCE(SUM("__c3"), 0) % COUNT(*)
        ) * 4, COUNT(*))
      )
    END
    ELSE COALESCE(SUM("__c3"), 0)
  END AS BIGINT) AS "__c3",
  CAST(CASE
    WHEN COUNT(*) > 4
    THEN CASE
      WHEN COALESCE(SUM("__c4"), 0) < 0
      THEN -(
        DIV((
          -COALESCE(SUM("__c4"), 0)
        ), COUNT(*)) * 4 + DIV((
          (
            -COALESCE(SUM("__c4"), 0)
          ) % COUNT(*)
        ) * 4, COUNT(*))
      )
      ELSE (
        DIV(COALESCE(SUM("__c4"), 0), COUNT(*)) * 4 + DIV((
          COALESCE(SUM("__c4"), 0) % COUNT(*)
        ) * 4, COUNT(*))
      )
    END
    ELSE COALESCE(SUM("__c4"), 0)
  END AS BIGINT) AS "__c4"
FROM grid_values
GROUP BY
  "__unit",
  "__k0"
