SELECT
  "__unit",
  "__k0",
  LEAST("__counted", 2) AS "__rows",
  LEAST(GREATEST("__sum1", 0), 20000) AS "__c1",
  LEAST(
    GREATEST(
      CASE
        WHEN "__counted" > 2
        THEN (
          DIV("__sum2", "__counted") * 2000 + DIV((
            "__sum2" % "__counted"
          ) * 2000, "__counted")
        )
        ELSE "__sum2" * 1000
      END,
      0
    ),
    2000
  ) AS "__c2",
  LEAST(
    GREATEST(
      CASE
        WHEN "__counted" > 2
        THEN CASE
          WHEN "__sum3" < 0
          THEN -(
            DIV((
              -"__sum3"
            ), "__counted") * 2000 + DIV((
              (
                -"__sum3"
              ) % "__counted"
            ) * 2000, "__counted")
          )
          ELSE (
            DIV("__sum3", "__counted") * 2000 + DIV((
              "__sum3" % "__counted"
            ) * 2000, "__counted")
          )
        END
        ELSE "__sum3" * 1000
      END,
      -150000
    ),
    150000
  ) AS "__c3",
  LEAST(GREATEST("__sum4", -200), 200) AS "__c4"
FROM (
  SELECT
    "__unit",
    "__k0",
    COUNT(*) AS "__counted",
    COALESCE(SUM("__c1"), 0) AS "__sum1",
    COALESCE(SUM("__c2"), 0) AS "__sum2",
    COALESCE(SUM("__c3"), 0) AS "__sum3",
    COALESCE(SUM("__c4"), 0) AS "__sum4"
  FROM grid_values
  GROUP BY
    "__unit",
    "__k0"
) AS "__sums"
