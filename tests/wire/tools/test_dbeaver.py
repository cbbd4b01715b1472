"""DBeaver's PostgreSQL plugin against dpproxy: connect and navigator queries, through pgjdbc.

The SQL is DBeaver's, verbatim for a PostgreSQL 15 server with default connection settings, from
dbeaver/dbeaver, plugins/org.jkiss.dbeaver.ext.postgresql/src/org/jkiss/dbeaver/ext/postgresql/model/:
- PostgreDataSource.java: the database list (`SELECT db.oid,db.* FROM pg_catalog.pg_database db …`
  with the connection's database as parameter) and `SELECT version()`;
- PostgreExecutionContext.java: `SELECT current_schema(),session_user` and `SHOW search_path`;
- PostgreDatabase.java (SchemaCache): the schema list from pg_namespace;
- PostgreSchema.java (TableCache, ConstraintCache, IndexCache): tables, columns, constraints and
  indexes of a schema, each with the schema's OID as parameter (2200 for public, as in PostgreSQL).
The data tab reads `SELECT * FROM public.patients` with LIMIT 200 (refused for a protected table,
with a hint) and the row count is a `count(*)` (a DP answer). One JVM per backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wire.test_clients import Served

from .replay import Result, assert_close, assert_refused, charged_epsilon, prepared, query, run_jvm

PUBLIC_OID = "l:2200"

DATABASES_SQL = (
    "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE 1 = 1 AND datallowconn AND NOT datistemplate "
    "OR db.datname =?\nORDER BY db.datname"
)
SCHEMAS_SQL = (
    "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 "
    "AND d.classoid='pg_namespace'::regclass\n ORDER BY nspname"
)
TABLES_SQL = (
    "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  "
    "pg_catalog.pg_get_partkeydef(c.oid) as partition_key \n"
    "FROM pg_catalog.pg_class c\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
    "AND d.classoid='pg_class'::regclass\n"
    "WHERE c.relnamespace=? AND c.relkind not in ('i','I','c')"
)
COLUMNS_SQL = (
    "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,dsc.description,dep.objid"
    "\nFROM pg_catalog.pg_attribute a"
    "\nINNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)"
    "\nLEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum)"
    "\nLEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)"
    "\nLEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' "
    "and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid"
    "\nWHERE NOT a.attisdropped AND c.relkind not in ('i','I','c') AND c.relnamespace=?"
    "\nORDER BY a.attnum"
)
CONSTRAINTS_SQL = (
    "SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,d.description"
    ", case when c.contype='c' then \"substring\"(pg_get_constraintdef(c.oid), 7) else null end consrc_copy"
    "\nFROM pg_catalog.pg_constraint c"
    "\nINNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid"
    "\nLEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid"
    "\nLEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
    "AND d.classoid='pg_constraint'::regclass"
    "\nWHERE t.relnamespace=?"
    "\nORDER BY c.oid"
)
INDEXES_SQL = (
    "SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,c.reltablespace,tc.relname as tabrelname,"
    "dsc.description,pg_catalog.pg_get_expr(i.indpred, i.indrelid) as pred_expr"
    ",pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as expr"
    ",pg_catalog.pg_relation_size(i.indexrelid) as index_rel_size"
    ",pg_catalog.pg_stat_get_numscans(i.indexrelid) as index_num_scans"
    "\nFROM pg_catalog.pg_index i"
    "\nINNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid"
    "\nINNER JOIN pg_catalog.pg_class tc ON tc.oid=i.indrelid"
    "\nLEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid=dsc.objoid"
    "\nWHERE  c.relnamespace=? ORDER BY c.relname"
)

STEPS = [
    prepared("databases", DATABASES_SQL, "s:demo"),
    query("version", "SELECT version()"),
    prepared("context", "SELECT current_schema(),session_user"),
    query("search_path", "SHOW search_path"),
    prepared("schemas", SCHEMAS_SQL),
    prepared("tables", TABLES_SQL, PUBLIC_OID),
    prepared("columns", COLUMNS_SQL, PUBLIC_OID),
    prepared("constraints", CONSTRAINTS_SQL, PUBLIC_OID),
    prepared("indexes", INDEXES_SQL, PUBLIC_OID),
    query("data_tab", "SELECT * FROM public.patients\nLIMIT 200"),
    query("data_tab_public", "SELECT * FROM public.zip_info\nLIMIT 200"),
    query("row_count", "SELECT count(*) FROM public.patients"),
]


@pytest.fixture
def dbeaver(served: Served, replay_classes: Path) -> dict[str, Result]:
    if "dbeaver" not in served.cache:
        before = served.spent()
        served.cache["dbeaver"] = run_jvm(served, replay_classes, STEPS)
        served.cache["dbeaver_spent"] = served.spent() - before
    return served.cache["dbeaver"]


def test_dbeaver_connects_and_reads_the_session(dbeaver: dict[str, Result]) -> None:
    assert dbeaver["databases"].ok().column("datname") == ["demo"]
    assert (dbeaver["version"].ok().rows[0][0] or "").startswith("PostgreSQL 15.0 ")
    assert dbeaver["context"].ok().rows == [("public", "alice")]
    assert dbeaver["search_path"].ok().rowcount == 1


def test_dbeaver_navigator_lists_schemas_tables_and_columns(dbeaver: dict[str, Result]) -> None:
    schemas = dbeaver["schemas"].ok()
    assert ("2200", "public") in [(r[0], r[schemas.names.index("nspname")]) for r in schemas.rows]
    tables = dbeaver["tables"].ok()
    assert sorted(tables.column("relname")) == ["patients", "visits", "zip_info"]
    assert set(tables.column("relkind")) == {"r"}
    columns = dbeaver["columns"].ok()
    patients = [r[columns.names.index("attname")] for r in columns.rows if r[0] == "patients"]
    assert patients == ["patient_id", "age", "sex", "income", "zip", "diagnosis", "smoker", "enrolled"]


def test_dbeaver_sees_keys_and_indexes_for_the_er_diagram(dbeaver: dict[str, Result]) -> None:
    constraints = dbeaver["constraints"].ok()
    kinds = {
        (r[constraints.names.index("tabrelname")], r[constraints.names.index("contype")])
        for r in constraints.rows
    }
    # Issue 9 item 6: primary and foreign keys of the backing database, structure only.
    assert {("patients", "p"), ("visits", "p"), ("visits", "f"), ("zip_info", "p")} <= kinds
    indexes = dbeaver["indexes"].ok()
    assert {"patients", "visits", "zip_info"} <= set(indexes.column("tabrelname"))
    # Sizes and scan counts are statistics: never reported.
    assert set(indexes.column("index_rel_size")) <= {"0", None}
    assert set(indexes.column("index_num_scans")) <= {"0", None}


def test_dbeaver_data_tab_is_refused_with_a_hint_but_counts_answer(
    served: Served, dbeaver: dict[str, Result]
) -> None:
    assert_refused(dbeaver["data_tab"], "42501", "raw rows", "patients")
    assert "Hint" in dbeaver["data_tab"].error[1]  # type: ignore[index]
    public = dbeaver["data_tab_public"].ok()
    assert public.rowcount == 200 and "zip" in public.names
    count = dbeaver["row_count"].ok()
    assert count.names == ["count"] and count.types == ["int8"]
    assert_close(count.rows[0][0], served.truth.count(), count, "count")
    metadata = [n for n in dbeaver if n not in {"row_count"}]
    assert all(charged_epsilon(dbeaver[n]) == 0 for n in metadata)
    assert served.cache["dbeaver_spent"] == pytest.approx(charged_epsilon(count))
