SELECT
  "__k0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          DIV("__rows", "__total") * 1 + DIV((
            "__rows" % "__total"
          ) * 1, "__total")
        )
        ELSE "__rows"
      END
    ),
    0
  ) AS "__c0_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN (
          DIV("__rows", "__total") * 2 + DIV((
            "__rows" % "__total"
          ) * 2, "__total")
        )
        ELSE "__rows"
      END
    ),
    0
  ) AS "__c0_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN (
          DIV("__rows", "__total") * 4 + DIV((
            "__rows" % "__total"
          ) * 4, "__total")
        )
        ELSE "__rows"
      END
    ),
    0
  ) AS "__c0_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          DIV("__c1", "__total") * 1 + DIV((
            "__c1" % "__total"
          ) * 1, "__total")
        )
        ELSE "__c1"
      END
    ),
    0
  ) AS "__c1_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN (
          DIV("__c1", "__total") * 2 + DIV((
            "__c1" % "__total"
          ) * 2, "__total")
        )
        ELSE "__c1"
      END
    ),
    0
  ) AS "__c1_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN (
          DIV("__c1", "__total") * 4 + DIV((
            "__c1" % "__total"
          ) * 4, "__total")
        )
        ELSE "__c1"
      END
    ),
    0
  ) AS "__c1_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN (
          DIV("__c2", "__total") * 1 + DIV((
            "__c2" % "__total"
          ) * 1, "__total")
        )
        ELSE "__c2"
      END
    ),
    0
  ) AS "__c2_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN (
          DIV("__c2", "__total") * 2 + DIV((
            "__c2" % "__total"
          ) * 2, "__total")
        )
        ELSE "__c2"
      END
    ),
    0
  ) AS "__c2_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN (
          DIV("__c2", "__total") * 4 + DIV((
            "__c2" % "__total"
          ) * 4, "__total")
        )
        ELSE "__c2"
      END
    ),
    0
  ) AS "__c2_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN CASE
          WHEN "__c3" < 0
          THEN -(
            DIV((
              -"__c3"
            ), "__total") * 1 + DIV((
              (
                -"__c3"
              ) % "__total"
            ) * 1, "__total")
          )
          ELSE (
            DIV("__c3", "__total") * 1 + DIV((
              "__c3" % "__total"
            ) * 1, "__total")
          )
        END
        ELSE "__c3"
      END
    ),
    0
  ) AS "__c3_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN CASE
          WHEN "__c3" < 0
          THEN -(
            DIV((
              -"__c3"
            ), "__total") * 2 + DIV((
              (
                -"__c3"
              ) % "__total"
            ) * 2, "__total")
          )
          ELSE (
            DIV("__c3", "__total") * 2 + DIV((
              "__c3" % "__total"
            ) * 2, "__total")
          )
        END
        ELSE "__c3"
      END
    ),
    0
  ) AS "__c3_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN CASE
          WHEN "__c3" < 0
          THEN -(
            DIV((
              -"__c3"
            ), "__total") * 4 + DIV((
              (
                -"__c3"
              ) % "__total"
            ) * 4, "__total")
          )
          ELSE (
            DIV("__c3", "__total") * 4 + DIV((
              "__c3" % "__total"
            ) * 4, "__total")
          )
        END
        ELSE "__c3"
      END
    ),
    0
  ) AS "__c3_2",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 1
        THEN CASE
          WHEN "__c4" < 0
          THEN -(
            DIV((
              -"__c4"
            ), "__total") * 1 + DIV((
              (
                -"__c4"
              ) % "__total"
            ) * 1, "__total")
          )
          ELSE (
            DIV("__c4", "__total") * 1 + DIV((
              "__c4" % "__total"
            ) * 1, "__total")
          )
        END
        ELSE "__c4"
      END
    ),
    0
  ) AS "__c4_0",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 2
        THEN CASE
          WHEN "__c4" < 0
          THEN -(
            DIV((
              -"__c4"
            ), "__total") * 2 + DIV((
              (
                -"__c4"
              ) % "__total"
            ) * 2, "__total")
          )
          ELSE (
            DIV("__c4", "__total") * 2 + DIV((
              "__c4" % "__total"
            ) * 2, "__total")
          )
        END
        ELSE "__c4"
      END
    ),
    0
  ) AS "__c4_1",
  COALESCE(
    SUM(
      CASE
        WHEN "__total" > 4
        THEN CASE
          WHEN "__c4" < 0
          THEN -(
            DIV((
              -"__c4"
            ), "__total") * 4 + DIV((
              (
                -"__c4"
              ) % "__total"
            ) * 4, "__total")
          )
          ELSE (
            DIV("__c4", "__total") * 4 + DIV((
              "__c4" % "__total"
            ) * 4, "__total")
          )
        END
        ELSE "__c4"
      END
    ),
    0
  ) AS "__c4_2",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__total" > 1 THEN 1 ELSE 0 END), 0) AS "__above0",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__total" > 2 THEN 1 ELSE 0 END), 0) AS "__above1",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__total" > 4 THEN 1 ELSE 0 END), 0) AS "__above2",
  COALESCE(SUM(CASE WHEN "__gn" <= 1 THEN 1 ELSE 0 END), 0) AS "__units0",
  COALESCE(SUM(CASE WHEN "__gn" <= 2 THEN 1 ELSE 0 END), 0) AS "__units1",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__groups" > 1 THEN 1 ELSE 0 END), 0) AS "__wider0",
  COALESCE(SUM(CASE WHEN "__gn" = 1 AND "__groups" > 2 THEN 1 ELSE 0 END), 0) AS "__wider1",
  COALESCE(SUM(CASE WHEN "__gn" = 1 THEN 1 ELSE 0 END), 0) AS "__persons",
  COUNT(*) AS "__units"
FROM ranked_groups
GROUP BY
  "__k0"
