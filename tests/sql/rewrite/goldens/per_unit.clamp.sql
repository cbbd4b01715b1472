SELECT
  "__unit",
  "__k0",
  LEAST(COUNT(*), 2) AS "__rows",
  LEAST(GREATEST(COALESCE(SUM("__c1"), 0), 0), 20000) AS "__c1",
  LEAST(
    GREATEST(
      CASE
        WHEN COUNT(*) > 2
        THEN (
          DIV(COALESCE(SUM("__c2"), 0), COUNT(*)) * 2000 + DIV((
            COALESCE(SUM("__c2"), 0) % COUNT(*)
          ) * 2000, COUNT(*))
        )
        ELSE COALESCE(SUM("__c2"), 0) * 1000
      END,
      0
    ),
    2000
  ) AS "__c2",
  LEAST(
    GREATEST(
      CASE
        WHEN COUNT(*) > 2
        THEN CASE
          WHEN COALESCE(SUM("__c3"), 0) < 0
          THEN -(
            DIV((
              -COALESCE(SUM("__c3"), 0)
            ), COUNT(*)) * 2000 + DIV((
              (
                -COALESCE(SUM("__c3"), 0)
              ) % COUNT(*)
            ) * 2000, COUNT(*))
          )
          ELSE (
            DIV(COALESCE(SUM("__c3"), 0), COUNT(*)) * 2000 + DIV((
              COALESCE(SUM("__c3"), 0) % COUNT(*)
            ) * 2000, COUNT(*))
          )
        END
        ELSE COALESCE(SUM("__c3"), 0) * 1000
      END,
      -150000
    ),
    150000
  ) AS "__c3",
  LEAST(GREATEST(COALESCE(SUM("__c4"), 0), -200), 200) AS "__c4"
FROM grid_values
GROUP BY
  "__unit",
  "__k0"
