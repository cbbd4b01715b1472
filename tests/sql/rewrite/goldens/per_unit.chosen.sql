SELECT
  "__unit",
  "__k0",
  LEAST("__counted", 4) AS "__rows",
  CAST(CASE
    WHEN "__counted" > 4
    THEN (
      DIV("__sum1", "__counted") * 4 + DIV((
        "__sum1" % "__counted"
      ) * 4, "__counted")
    )
    ELSE "__sum1"
  END AS BIGINT) AS "__c1",
  CAST(CASE
    WHEN "__counted" > 4
    THEN (
      DIV("__sum2", "__counted") * 4 + DIV((
        "__sum2" % "__counted"
      ) * 4, "__counted")
    )
    ELSE "__sum2"
  END AS BIGINT) AS "__c2",
  CAST(CASE
    WHEN "__counted" > 4
    THEN CASE
      WHEN "__sum3" < 0
      THEN -(
        DIV((
          -"__sum3"
        ), "__counted") * 4 + DIV((
          (
            -"__sum3"
          ) % "__counted"
        ) * 4, "__counted")
      )
      ELSE (
        DIV("__sum3", "__counted") * 4 + DIV((
          "__sum3" % "__counted"
        ) * 4, "__counted")
      )
    END
    ELSE "__sum3"
  END AS BIGINT) AS "__c3",
  CAST(CASE
    WHEN "__counted" > 4
    THEN CASE
      WHEN "__sum4" < 0
      THEN -(
        DIV((
          -"__sum4"
        ), "__counted") * 4 + DIV((
          (
            -"__sum4"
          ) % "__counted"
        ) * 4, "__counted")
      )
      ELSE (
        DIV("__sum4", "__counted") * 4 + DIV((
          "__sum4" % "__counted"
        ) * 4, "__counted")
      )
    END
    ELSE "__sum4"
  END AS BIGINT) AS "__c4"
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
