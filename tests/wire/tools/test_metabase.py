"""Metabase's PostgreSQL driver against dpproxy, replayed through pgjdbc (the driver Metabase ships).

The SQL is what Metabase sends for the demo schema, from its public source (metabase/metabase):
- src/metabase/driver/postgres.clj: `driver/db-default-timezone` ("show timezone;"),
  `current-user-table-privileges` (the privileges CTE, verbatim), `get-tables-sql`,
  `describe-fields-sql`, `describe-fks-sql` and `enum-types`; the HoneySQL maps rendered as
  HoneySQL 2 renders them with `:dialect :ansi` (quoted identifiers, string values as `?` parameters);
- src/metabase/driver/sql_jdbc/sync/describe_table.clj: the table-rows sample used for
  fingerprinting (raw rows: refused) and the field-values query of a category field;
- a GUI question compiles through metabase.driver.sql.query-processor with every column qualified
  `"public"."patients"."col"`, and `:metadata/table-existence-check` probes a table with
  `SELECT TRUE AS "_" FROM … WHERE 1 <> 1 LIMIT 0`.
One JVM runs the whole sequence per backend; its results are cached on the server fixture.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tests.wire.test_clients import Served

from .replay import (
    Result,
    assert_close,
    assert_empty_probe,
    assert_refused,
    charged_epsilon,
    meta,
    prepared,
    query,
    run_jvm,
)

PRIVILEGES_SQL = "\n".join(
    [
        "with table_privileges as (",
        " select",
        "   NULL as role,",
        "   t.schemaname as schema,",
        "   t.objectname as table,",
        "   pg_catalog.has_any_column_privilege(current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'update') as update,",
        "   pg_catalog.has_any_column_privilege(current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'select') as select,",
        "   pg_catalog.has_any_column_privilege(current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'insert') as insert,",
        "   pg_catalog.has_table_privilege(     current_user, '\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' || replace(t.objectname, '\"', '\"\"') || '\"',  'delete') as delete",
        " from (",
        "   select schemaname, tablename as objectname from pg_catalog.pg_tables",
        "   union",
        "   select schemaname, viewname as objectname from pg_catalog.pg_views",
        "   union",
        "   select schemaname, matviewname as objectname from pg_catalog.pg_matviews",
        " ) t",
        " where t.schemaname !~ '^pg_'",
        "   and t.schemaname <> 'information_schema'",
        "   and pg_catalog.has_schema_privilege(current_user, t.schemaname, 'usage')",
        ")",
        "select t.*",
        "from table_privileges t",
    ]
)

GET_TABLES_SQL = (
    'SELECT "n"."nspname" AS "schema", "c"."relname" AS "name", CASE "c"."relkind" WHEN \'r\' THEN \'TABLE\' '
    "WHEN 'p' THEN 'PARTITIONED TABLE' WHEN 'v' THEN 'VIEW' WHEN 'f' THEN 'FOREIGN TABLE' "
    'WHEN \'m\' THEN \'MATERIALIZED VIEW\' ELSE NULL END AS "type", "d"."description" AS "description", '
    '"stat"."n_live_tup" AS "estimated_row_count" FROM "pg_catalog"."pg_class" AS "c" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "n" ON "c"."relnamespace" = "n"."oid" '
    'LEFT JOIN "pg_catalog"."pg_description" AS "d" ON ("c"."oid" = "d"."objoid") AND ("d"."objsubid" = 0) '
    'AND ("d"."classoid" = \'pg_class\'::regclass) '
    'LEFT JOIN "pg_stat_user_tables" AS "stat" ON ("n"."nspname" = "stat"."schemaname") '
    'AND ("c"."relname" = "stat"."relname") '
    'WHERE ("c"."relnamespace" = "n"."oid") AND ("n"."nspname" !~ ?) AND ("n"."nspname" <> ?) '
    "AND c.relkind in ('r', 'p', 'v', 'f', 'm') AND (\"n\".\"nspname\" IN (?)) "
    'ORDER BY "type" ASC, "schema" ASC, "name" ASC'
)

DESCRIBE_FIELDS_SQL = (
    'SELECT "c"."column_name" AS "name", CASE WHEN "c"."udt_schema" IN (\'public\', \'pg_catalog\') '
    'THEN FORMAT(\'%s\', "c"."udt_name") ELSE FORMAT(\'"%s"."%s"\', "c"."udt_schema", "c"."udt_name") END '
    'AS "database-type", "c"."ordinal_position" - 1 AS "database-position", "c"."table_schema" AS "table-schema", '
    '"c"."table_name" AS "table-name", "pk"."column_name" IS NOT NULL AS "pk?", '
    'COL_DESCRIPTION(CAST(CAST(FORMAT(\'%I.%I\', CAST("c"."table_schema" AS TEXT), CAST("c"."table_name" AS TEXT)) '
    'AS REGCLASS) AS OID), "c"."ordinal_position") AS "field-comment", '
    '(("column_default" IS NULL) OR (LOWER("column_default") = \'null\')) AND ("is_nullable" = \'NO\') '
    'AND NOT ((("column_default" IS NOT NULL) AND ("column_default" LIKE \'%nextval(%\')) '
    'OR ("is_identity" <> \'NO\')) AS "database-required", '
    '(("column_default" IS NOT NULL) AND ("column_default" LIKE \'%nextval(%\')) OR ("is_identity" <> \'NO\') '
    'AS "database-is-auto-increment" FROM "information_schema"."columns" AS "c" '
    'LEFT JOIN (SELECT "tc"."table_schema", "tc"."table_name", "kc"."column_name" '
    'FROM "information_schema"."table_constraints" AS "tc" '
    'INNER JOIN "information_schema"."key_column_usage" AS "kc" ON ("tc"."constraint_name" = "kc"."constraint_name") '
    'AND ("tc"."table_schema" = "kc"."table_schema") AND ("tc"."table_name" = "kc"."table_name") '
    'WHERE "tc"."constraint_type" = \'PRIMARY KEY\') AS "pk" '
    'ON ("c"."table_schema" = "pk"."table_schema") AND ("c"."table_name" = "pk"."table_name") '
    'AND ("c"."column_name" = "pk"."column_name") '
    'WHERE c.table_schema !~ \'^information_schema|catalog_history|pg_\' AND ("c"."table_schema" IN (?)) '
    'UNION ALL SELECT "pa"."attname" AS "name", CASE WHEN "ptn"."nspname" IN (\'public\', \'pg_catalog\') '
    'THEN FORMAT(\'%s\', "pt"."typname") ELSE FORMAT(\'"%s"."%s"\', "ptn"."nspname", "pt"."typname") END '
    'AS "database-type", "pa"."attnum" - 1 AS "database-position", "pn"."nspname" AS "table-schema", '
    '"pc"."relname" AS "table-name", FALSE AS "pk?", NULL AS "field-comment", FALSE AS "database-required", '
    'FALSE AS "database-is-auto-increment" FROM "pg_catalog"."pg_class" AS "pc" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "pn" ON "pn"."oid" = "pc"."relnamespace" '
    'INNER JOIN "pg_catalog"."pg_attribute" AS "pa" ON "pa"."attrelid" = "pc"."oid" '
    'INNER JOIN "pg_catalog"."pg_type" AS "pt" ON "pt"."oid" = "pa"."atttypid" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "ptn" ON "ptn"."oid" = "pt"."typnamespace" '
    'WHERE ("pc"."relkind" = \'m\') AND ("pa"."attnum" >= 1) AND ("pn"."nspname" IN (?)) '
    'ORDER BY "table-schema" ASC, "table-name" ASC, "database-position" ASC'
)

DESCRIBE_FKS_SQL = (
    'SELECT "fk_ns"."nspname" AS "fk-table-schema", "fk_table"."relname" AS "fk-table-name", '
    '"fk_column"."attname" AS "fk-column-name", "pk_ns"."nspname" AS "pk-table-schema", '
    '"pk_table"."relname" AS "pk-table-name", "pk_column"."attname" AS "pk-column-name" '
    'FROM "pg_constraint" AS "c" INNER JOIN "pg_class" AS "fk_table" ON "c"."conrelid" = "fk_table"."oid" '
    'INNER JOIN "pg_namespace" AS "fk_ns" ON "c"."connamespace" = "fk_ns"."oid" '
    'INNER JOIN "pg_attribute" AS "fk_column" ON "c"."conrelid" = "fk_column"."attrelid" '
    'INNER JOIN "pg_class" AS "pk_table" ON "c"."confrelid" = "pk_table"."oid" '
    'INNER JOIN "pg_namespace" AS "pk_ns" ON "pk_table"."relnamespace" = "pk_ns"."oid" '
    'INNER JOIN "pg_attribute" AS "pk_column" ON "c"."confrelid" = "pk_column"."attrelid" '
    "WHERE fk_ns.nspname !~ '^information_schema|catalog_history|pg_' AND (\"c\".\"contype\" = 'f'::char) "
    'AND ("fk_column"."attnum" = ANY(c.conkey)) AND ("pk_column"."attnum" = ANY(c.confkey)) '
    'AND ("fk_ns"."nspname" IN (?)) ORDER BY "fk-table-schema" ASC, "fk-table-name" ASC'
)

ENUM_TYPES_SQL = (
    "SELECT nspname, typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
    "WHERE t.oid IN (SELECT DISTINCT enumtypid FROM pg_enum e)"
)

PATIENT_FIELDS = ["patient_id", "age", "sex", "income", "zip", "diagnosis", "smoker", "enrolled"]
DIAGNOSES = {"healthy", "flu", "cold", "asthma", "diabetes", "hypertension"}


def _qualified(column: str) -> str:
    return f'"public"."patients"."{column}"'


ROWS_SAMPLE_SQL = (
    "SELECT "
    + ", ".join(f'{_qualified(c)} AS "{c}"' for c in PATIENT_FIELDS)
    + ' FROM "public"."patients" LIMIT 10000'
)

STEPS = [
    query("can_connect", "SELECT 1"),
    prepared("timezone", "show timezone;"),
    meta("schemas", "getSchemas"),
    query("privileges", PRIVILEGES_SQL),
    prepared("tables", GET_TABLES_SQL, "s:^pg_", "s:information_schema", "s:public"),
    prepared("fields", DESCRIBE_FIELDS_SQL, "s:public", "s:public"),
    prepared("fks", DESCRIBE_FKS_SQL, "s:public"),
    query("enums", ENUM_TYPES_SQL),
    # Sync: the existence probe, the fingerprint sample (raw rows) and a category field's values.
    query("probe", 'SELECT TRUE AS "_" FROM "public"."patients" WHERE 1 <> 1 LIMIT 0'),
    query("rows_sample", ROWS_SAMPLE_SQL),
    query(
        "field_values",
        f'SELECT {_qualified("diagnosis")} AS "diagnosis" FROM "public"."patients" '
        f"GROUP BY {_qualified('diagnosis')} ORDER BY {_qualified('diagnosis')} ASC LIMIT 1000",
    ),
    # GUI questions: Count by Diagnosis, Average of Income by Sex filtered on age, Count by
    # Enrolled: Month, and a raw-rows table view (refused) beside one of a public table.
    query(
        "count_by_diagnosis",
        f'SELECT {_qualified("diagnosis")} AS "diagnosis", COUNT(*) AS "count" FROM "public"."patients" '
        f"GROUP BY {_qualified('diagnosis')} ORDER BY {_qualified('diagnosis')} ASC",
    ),
    prepared(
        "avg_income_by_sex",
        f'SELECT {_qualified("sex")} AS "sex", AVG({_qualified("income")}) AS "avg" FROM "public"."patients" '
        f"WHERE {_qualified('age')} > ? GROUP BY {_qualified('sex')} ORDER BY {_qualified('sex')} ASC "
        "LIMIT 1048575",
        "i:40",
    ),
    query(
        "count_by_month",
        'SELECT CAST(DATE_TRUNC(\'month\', "public"."patients"."enrolled") AS date) AS "enrolled", '
        'COUNT(*) AS "count" FROM "public"."patients" '
        'GROUP BY CAST(DATE_TRUNC(\'month\', "public"."patients"."enrolled") AS date) '
        'ORDER BY CAST(DATE_TRUNC(\'month\', "public"."patients"."enrolled") AS date) ASC',
    ),
    query("table_view", ROWS_SAMPLE_SQL.replace("LIMIT 10000", "LIMIT 2000")),
    query(
        "public_table_view",
        'SELECT "public"."zip_info"."zip" AS "zip", "public"."zip_info"."city" AS "city" '
        'FROM "public"."zip_info" ORDER BY "public"."zip_info"."zip" ASC LIMIT 2000',
    ),
]


@pytest.fixture
def metabase(served: Served, replay_classes: Path) -> dict[str, Result]:
    if "metabase" not in served.cache:
        before = served.spent()
        served.cache["metabase"] = run_jvm(served, replay_classes, STEPS)
        served.cache["metabase_spent"] = served.spent() - before
    return served.cache["metabase"]


def test_metabase_connects_and_lists_the_exposed_tables(metabase: dict[str, Result]) -> None:
    assert metabase["can_connect"].ok().rows == [("1",)]
    assert metabase["timezone"].ok().rowcount == 1
    assert "public" in metabase["schemas"].ok().column("table_schem")
    privileges = metabase["privileges"].ok()
    readable = {row[2] for row in privileges.rows if row[privileges.names.index("select")] == "t"}
    assert {"patients", "visits", "zip_info"} <= readable
    tables = metabase["tables"].ok()
    assert tables.names == ["schema", "name", "type", "description", "estimated_row_count"]
    assert [(r[0], r[1], r[2]) for r in tables.rows] == [
        ("public", t, "TABLE") for t in ("patients", "visits", "zip_info")
    ]
    assert metabase["enums"].ok().rows == []


def test_metabase_describes_fields_with_the_primary_key(metabase: dict[str, Result]) -> None:
    fields = metabase["fields"].ok()
    patients = [r for r in fields.rows if r[fields.names.index("table-name")] == "patients"]
    assert [r[0] for r in patients] == PATIENT_FIELDS
    types = dict((r[0], r[1]) for r in patients)
    assert types["age"] == "int4" and types["income"] == "numeric" and types["enrolled"] == "date"
    pk = {r[0] for r in patients if r[fields.names.index("pk?")] == "t"}
    # Issue 9 item 6: the backing database's primary key is reflected (structure only).
    assert pk == {"patient_id"}


def test_metabase_finds_the_foreign_key_for_auto_joins(metabase: dict[str, Result]) -> None:
    fks = metabase["fks"].ok()
    assert ("public", "visits", "patient_id", "public", "patients", "patient_id") in [
        (
            r[fks.names.index("fk-table-schema")],
            r[fks.names.index("fk-table-name")],
            r[fks.names.index("fk-column-name")],
            r[fks.names.index("pk-table-schema")],
            r[fks.names.index("pk-table-name")],
            r[fks.names.index("pk-column-name")],
        )
        for r in fks.rows
    ]


def test_metabase_sync_probe_is_empty_and_the_raw_sample_is_refused(metabase: dict[str, Result]) -> None:
    assert_empty_probe(metabase["probe"], ["_"])
    assert metabase["probe"].types == ["bool"]
    assert_refused(metabase["rows_sample"], "42501", "patients")
    values = metabase["field_values"].ok()
    assert values.names == ["diagnosis"] and set(values.column("diagnosis")) <= DIAGNOSES
    assert values.rowcount >= 4


def test_metabase_gui_questions_answer_with_qualified_columns(
    served: Served, metabase: dict[str, Result]
) -> None:
    counts = metabase["count_by_diagnosis"].ok()
    assert counts.names == ["diagnosis", "count"] and counts.types == ["varchar", "int8"]
    assert set(counts.column("diagnosis")) <= DIAGNOSES and counts.rowcount >= 4
    total = sum(int(c or 0) for c in counts.column("count"))
    assert abs(total - served.truth.count()) < 0.2 * served.truth.count()
    incomes = metabase["avg_income_by_sex"].ok()
    assert incomes.names == ["sex", "avg"] and incomes.types == ["varchar", "numeric"]
    assert incomes.column("sex") == ["F", "M", "X"]
    for sex, avg in incomes.rows:
        truth = served.truth.mean_income(lambda p, sex=sex: p.age > 40 and p.sex == sex)
        assert_close(avg, truth, incomes, "avg")
    months = metabase["count_by_month"].ok()
    assert months.names == ["enrolled", "count"] and months.types == ["date", "int8"]
    assert all(dt.date.fromisoformat(m or "").day == 1 for m in months.column("enrolled"))


def test_metabase_table_view_is_refused_with_a_hint_and_public_rows_show(metabase: dict[str, Result]) -> None:
    assert_refused(metabase["table_view"], "42501", "raw rows", "patients")
    public = metabase["public_table_view"].ok()
    assert public.names == ["zip", "city"] and public.rowcount > 0


def test_metabase_charges_only_the_dp_answers(served: Served, metabase: dict[str, Result]) -> None:
    spent = {name: charged_epsilon(result) for name, result in metabase.items()}
    assert {name for name, eps in spent.items() if eps > 0} == {
        "count_by_diagnosis",
        "avg_income_by_sex",
        "count_by_month",
    }
    assert served.cache["metabase_spent"] == pytest.approx(sum(spent.values()))
