"""Build expected.json: what a real PostgreSQL 15 answers to the catalog queries clients send.

The reference database is what the shadow catalog stands for: the demo policy's tables, empty, with
the policy's column types and no constraints, owned by the bootstrap role `dpproxy`, readable by
the analyst `alice`. To regenerate (PostgreSQL 15 binaries; run initdb/postgres as a non-root user):

    initdb -D DATA -U dpproxy -A trust -E UTF8 --locale=C
    postgres -D DATA -p 55432 -c log_statement=all      # the log feeds clients/capture.py
    psql -U dpproxy -p 55432 postgres -c "CREATE ROLE alice LOGIN" -c "CREATE DATABASE demo"
    psql -U dpproxy -p 55432 demo -c "$DEMO_DDL" -c "GRANT SELECT ON patients, visits, zip_info TO alice"
    .venv/bin/python tests/wire/catalog_queries/clients/capture.py --log LOG --port 55432 > tests/wire/catalog_queries/captured.json
    .venv/bin/python tests/wire/catalog_queries/build_fixtures.py postgresql://alice@127.0.0.1:55432/demo

Input: captured.json (what psql, psycopg, asyncpg, pg8000, SQLAlchemy, pgjdbc and node-postgres
sent) and the hand-written probes below (information_schema, BI tools' queries, table-free
functions). For every statement the router sends to the CATALOG, the fixture records the parameter
types PostgreSQL infers when the client gives none, the result columns (name, type OID, size,
modifier, table OID, column number) and the rows. OIDs of the exposed tables, the analyst's role
and the database are written as {oid:…} symbols, so that the replay can substitute the shadow's.
The same cluster, with `-U dpproxy`, serves dpproxy/wire/catalog/dump_pg15.py.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
import sys
from pathlib import Path

import psycopg
from psycopg.pq import Format

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from dpproxy.wire.router import Kind, route, split_statements

HERE = Path(__file__).parent
MAX_ROWS = 700
EXPOSED = ("patients", "visits", "zip_info")

DEMO_DDL = """
CREATE TABLE patients (patient_id integer, age integer, sex varchar, income numeric, zip varchar,
                       diagnosis varchar, smoker boolean, enrolled date);
CREATE TABLE visits (visit_id bigint, patient_id integer, visit_date date, department varchar,
                     cost numeric, duration_minutes integer);
CREATE TABLE zip_info (zip varchar, city varchar, state varchar, population integer);
"""

# Probes written by hand: what BI tools and people ask that the captured clients did not.
HANDWRITTEN: list[tuple[str, str]] = [
    ("functions", "SELECT version()"),
    ("functions", "SELECT current_database(), current_schema(), current_user, session_user, user"),
    ("functions", "SELECT current_schemas(true), current_schemas(false)"),
    ("functions", "SELECT pg_encoding_to_char(6), pg_encoding_to_char(0)"),
    (
        "functions",
        "SELECT format_type(23, -1), format_type(1043, -1), format_type(1700, -1), "
        "format_type(1114, NULL), format_type(1184, -1), format_type(16, NULL), format_type(1043, 44), "
        "format_type(1700, 655366), format_type(1007, NULL), format_type(18, NULL), format_type(25, NULL)",
    ),
    (
        "functions",
        "SELECT to_regtype('integer'), to_regtype('int4'), to_regtype('varchar'), "
        "to_regtype('nosuchtype'), to_regclass('patients'), to_regclass('public.visits'), "
        "to_regclass('nosuchtable'), to_regclass('pg_class')",
    ),
    (
        "functions",
        "SELECT 'patients'::regclass::oid = to_regclass('patients')::oid, 'int4'::regtype, "
        "23::regtype, 'pg_catalog.pg_class'::regclass, 'public'::regnamespace",
    ),
    (
        "functions",
        "SELECT has_table_privilege('patients', 'SELECT'), has_schema_privilege('public', 'USAGE'), "
        "pg_table_is_visible('visits'::regclass), pg_type_is_visible(23)",
    ),
    (
        "functions",
        "SELECT obj_description('patients'::regclass, 'pg_class'), "
        "col_description('patients'::regclass, 1), shobj_description(1, 'pg_database')",
    ),
    (
        "functions",
        "SELECT current_setting('server_version_num'), current_setting('DateStyle'), "
        "current_setting('standard_conforming_strings'), current_setting('integer_datetimes'), "
        "current_setting('max_identifier_length'), current_setting('nosuch.setting', true)",
    ),
    ("functions", "SELECT set_config('application_name', 'probe', false)"),
    (
        "functions",
        "SELECT pg_catalog.array_to_string(ARRAY['a', 'b'], ','), array_upper(ARRAY[1,2,3], 1), "
        "array_lower(ARRAY[1,2,3], 1), array_length(ARRAY[1,2], 1), cardinality(ARRAY[1,2])",
    ),
    (
        "functions",
        "SELECT 1, 1::int8, 1.5, 'x', NULL, true, DATE '2024-01-02', "
        "TIMESTAMP '2024-01-02 03:04:05', 2.5::float8, 'y'::varchar, 'z'::name",
    ),
    (
        "functions",
        "SELECT pg_get_userbyid(10), pg_size_pretty(pg_table_size('patients')), "
        "pg_relation_size('patients'), pg_total_relation_size('patients')",
    ),
    ("functions", "SELECT quote_ident('Patients'), quote_ident('patients'), quote_literal('it''s')"),
    (
        "functions",
        "SELECT txid_current() IS NOT NULL, pg_backend_pid() > 0, now() IS NOT NULL, "
        "pg_is_in_recovery(), inet_server_port() IS NULL OR true",
    ),
    ("functions", "SELECT * FROM generate_series(1, 3) AS s(i)"),
    ("functions", "SELECT E'a\\nb' AS e, $$dollar$$ AS d, U&'\\0041' AS u"),
    (
        "information_schema",
        "SELECT table_catalog, table_schema, table_name, table_type, is_insertable_into "
        "FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name",
    ),
    (
        "information_schema",
        "SELECT * FROM information_schema.columns WHERE table_schema = 'public' "
        "ORDER BY table_name, ordinal_position",
    ),
    (
        "information_schema",
        "SELECT catalog_name, schema_name, schema_owner FROM information_schema.schemata "
        "ORDER BY schema_name",
    ),
    (
        "information_schema",
        "SELECT * FROM information_schema.table_constraints WHERE table_schema = 'public'",
    ),
    ("information_schema", "SELECT * FROM information_schema.key_column_usage WHERE table_schema = 'public'"),
    ("information_schema", "SELECT * FROM information_schema.views WHERE table_schema = 'public'"),
    ("information_schema", "SELECT * FROM information_schema.routines WHERE routine_schema = 'public'"),
    (
        "information_schema",
        "SELECT count(*) > 100 FROM information_schema.columns WHERE table_schema = 'pg_catalog'",
    ),
    (
        "pg_catalog",
        "SELECT schemaname, tablename, tableowner, tablespace, hasindexes, hasrules, hastriggers, "
        "rowsecurity FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename",
    ),
    ("pg_catalog", "SELECT nspname FROM pg_namespace ORDER BY nspname"),
    ("pg_catalog", "SELECT datname, pg_encoding_to_char(encoding), datallowconn FROM pg_database"),
    (
        "pg_catalog",
        "SELECT relname, relkind, reltuples, relpages, relallvisible, relhasindex, relnatts "
        "FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY relname",
    ),
    (
        "pg_catalog",
        "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "a.atttypid, a.attlen FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 ORDER BY c.relname, a.attnum",
    ),
    ("pg_catalog", "SELECT * FROM pg_stats WHERE schemaname = 'public'"),
    ("pg_catalog", "SELECT * FROM pg_stat_user_tables"),
    ("pg_catalog", "SELECT * FROM pg_statistic"),
    ("pg_catalog", "SELECT count(*) FROM pg_stat_activity WHERE datname = 'nosuchdb'"),
    (
        "pg_catalog",
        "SELECT typname, typlen, typtype, typcategory, typelem, typarray FROM pg_type "
        "WHERE oid IN (16, 20, 21, 23, 25, 700, 701, 1043, 1082, 1114, 1184, 1700) ORDER BY oid",
    ),
    (
        "pg_catalog",
        "SELECT t.typname, t.typtype, t.typrelid = c.oid AS is_row_type FROM pg_type t "
        "JOIN pg_class c ON c.reltype = t.oid WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1",
    ),
    ("pg_catalog", "SELECT rolname, rolsuper, rolcanlogin FROM pg_roles WHERE rolname = current_user"),
    (
        "pg_catalog",
        "SELECT name, setting FROM pg_settings WHERE name IN "
        "('server_version_num', 'max_identifier_length', 'standard_conforming_strings') ORDER BY name",
    ),
    (
        "pg_catalog",
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "ORDER BY 1, 2",
    ),
    (
        "pg_catalog",
        "SELECT c.relname, obj_description(c.oid) FROM pg_class c "
        "WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1",
    ),
    ("pg_catalog", "SELECT * FROM pg_indexes WHERE schemaname = 'public'"),
    ("pg_catalog", "SELECT * FROM pg_views WHERE schemaname = 'public'"),
    ("pg_catalog", "SELECT * FROM pg_matviews"),
    ("pg_catalog", "SELECT * FROM pg_sequences"),
    ("pg_catalog", "SELECT conname FROM pg_constraint WHERE connamespace = 'public'::regnamespace"),
    (
        "pg_catalog",
        "SELECT n.nspname AS schema, c.relname AS name, pg_get_userbyid(c.relowner) AS owner "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = ANY(current_schemas(false)) AND c.relkind = 'r' ORDER BY 2",
    ),
    # DBeaver-style
    (
        "dbeaver",
        "SELECT n.oid, n.*, d.description FROM pg_catalog.pg_namespace n "
        "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid = n.oid AND d.objsubid = 0 "
        "AND d.classoid = 'pg_namespace'::regclass ORDER BY nspname",
    ),
    (
        "dbeaver",
        "SELECT c.oid, c.*, d.description FROM pg_catalog.pg_class c "
        "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid = c.oid AND d.objsubid = 0 "
        "AND d.classoid = 'pg_class'::regclass WHERE c.relnamespace = 2200 AND c.relkind NOT IN ('i', 'I', 'c')",
    ),
    (
        "dbeaver",
        "SELECT c.relname, a.*, pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) AS def_value, "
        "dsc.description FROM pg_catalog.pg_attribute a INNER JOIN pg_catalog.pg_class c ON (a.attrelid = c.oid) "
        "LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid = ad.adrelid AND a.attnum = ad.adnum) "
        "LEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid = dsc.objoid AND a.attnum = dsc.objsubid) "
        "WHERE NOT a.attisdropped AND c.relkind NOT IN ('i', 'I', 'c') AND c.relnamespace = 2200 "
        "AND a.attnum > 0 ORDER BY a.attnum",
    ),
    ("dbeaver", "SELECT db.oid, db.* FROM pg_catalog.pg_database db WHERE datname = current_database()"),
    ("dbeaver", "SELECT * FROM pg_catalog.pg_settings WHERE name = 'standard_conforming_strings'"),
    (
        "dbeaver",
        "SELECT string_agg(word, ',') FROM pg_catalog.pg_get_keywords() WHERE word <> ALL "
        "('{a,abs,absolute,action}'::text[])",
    ),
    # Metabase-style
    (
        "metabase",
        "SELECT nspname AS table_schem FROM pg_namespace WHERE nspname !~ '^pg_' "
        "AND nspname <> 'information_schema' ORDER BY 1",
    ),
    (
        "metabase",
        "SELECT c.relname AS table_name, pg_catalog.obj_description(c.oid, 'pg_class') AS remarks "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1",
    ),
    (
        "metabase",
        "SELECT has_table_privilege(current_user, '\"public\".\"patients\"', 'SELECT') AS select, "
        "has_table_privilege(current_user, '\"public\".\"patients\"', 'INSERT') AS insert",
    ),
    (
        "metabase",
        """
with table_privileges as (
 select NULL as role, t.schemaname as schema, t.objectname as table,
  pg_catalog.has_any_column_privilege(current_user, '"' || replace(t.schemaname, '"', '""') || '"' || '.' || '"' || replace(t.objectname, '"', '""') || '"', 'update') as update,
  pg_catalog.has_table_privilege(current_user, '"' || replace(t.schemaname, '"', '""') || '"' || '.' || '"' || replace(t.objectname, '"', '""') || '"', 'select') as select,
  pg_catalog.has_table_privilege(current_user, '"' || replace(t.schemaname, '"', '""') || '"' || '.' || '"' || replace(t.objectname, '"', '""') || '"', 'insert') as insert,
  pg_catalog.has_table_privilege(current_user, '"' || replace(t.schemaname, '"', '""') || '"' || '.' || '"' || replace(t.objectname, '"', '""') || '"', 'delete') as delete
 from (
  select schemaname, tablename as objectname from pg_catalog.pg_tables
  union
  select schemaname, viewname as objectname from pg_catalog.pg_views
  union
  select schemaname, matviewname as objectname from pg_catalog.pg_matviews
 ) t
 where t.schemaname !~ '^pg_'
  and t.schemaname <> 'information_schema'
  and pg_catalog.has_schema_privilege(current_user, t.schemaname, 'usage')
)
select t.* from table_privileges t order by 2, 3""",
    ),
    (
        "metabase",
        """SELECT c.column_name AS name, c.udt_name AS "database-type", c.ordinal_position - 1 AS "database-position",
 c.table_schema AS "table-schema", c.table_name AS "table-name", pk.column_name IS NOT NULL AS "pk?",
 col_description(CAST(CAST(format('%I.%I', CAST(c.table_schema AS TEXT), CAST(c.table_name AS TEXT)) AS regclass) AS oid), c.ordinal_position) AS "field-comment",
 ((column_default IS NULL) OR (LOWER(column_default) = 'null')) AND (is_nullable = 'NO') AND NOT (((column_default IS NOT NULL) AND (column_default LIKE '%nextval(%')) OR (is_identity <> 'NO')) AS "database-required",
 ((column_default IS NOT NULL) AND (column_default LIKE '%nextval(%')) OR (is_identity <> 'NO') AS "database-is-auto-increment"
FROM information_schema.columns AS c
LEFT JOIN (SELECT tc.table_schema, tc.table_name, kc.column_name FROM information_schema.table_constraints AS tc
  INNER JOIN information_schema.key_column_usage AS kc ON (tc.constraint_name = kc.constraint_name)
  AND (tc.table_schema = kc.table_schema) AND (tc.table_name = kc.table_name)
  WHERE tc.constraint_type = 'PRIMARY KEY') AS pk
 ON (c.table_schema = pk.table_schema) AND (c.table_name = pk.table_name) AND (c.column_name = pk.column_name)
WHERE c.table_name = 'patients' AND c.table_schema = 'public' ORDER BY "database-position" ASC""",
    ),
    # Npgsql (Power BI and other .NET tools) loads every type at connect time.
    (
        "npgsql",
        """SELECT ns.nspname, t.oid, t.typname, t.typtype, t.typnotnull, t.elemtypoid
FROM (
    SELECT
        typ.oid, typ.typnamespace, typ.typname, typ.typtype, typ.typrelid, typ.typnotnull, typ.relkind,
        elemtyp.oid AS elemtypoid, elemtyp.typname AS elemtypname, elemcls.relkind AS elemrelkind,
        CASE WHEN elemproc.proname='array_recv' THEN 'a' ELSE elemtyp.typtype END AS elemtyptype
    FROM (
        SELECT typ.oid, typnamespace, typname, typrelid, typnotnull, relkind, typelem AS elemoid,
            CASE WHEN proc.proname='array_recv' THEN 'a' ELSE typ.typtype END AS typtype,
            CASE
                WHEN proc.proname='array_recv' THEN typ.typelem
                WHEN typ.typtype='r' THEN rngsubtype
                WHEN typ.typtype='m' THEN (SELECT rngtypid FROM pg_range WHERE rngmultitypid = typ.oid)
                WHEN typ.typtype='d' THEN typ.typbasetype
            END AS elemtypoid
        FROM pg_type AS typ
        LEFT JOIN pg_class AS cls ON (cls.oid = typ.typrelid)
        LEFT JOIN pg_proc AS proc ON proc.oid = typ.typreceive
        LEFT JOIN pg_range ON (pg_range.rngtypid = typ.oid)
    ) AS typ
    LEFT JOIN pg_type AS elemtyp ON elemtyp.oid = elemtypoid
    LEFT JOIN pg_class AS elemcls ON (elemcls.oid = elemtyp.typrelid)
    LEFT JOIN pg_proc AS elemproc ON elemproc.oid = elemtyp.typreceive
) AS t
JOIN pg_namespace AS ns ON (ns.oid = typnamespace)
WHERE
    typtype IN ('b', 'r', 'm', 'e', 'd') OR
    (typtype = 'c' AND relkind='c') OR
    (typtype = 'p' AND typname IN ('record', 'void', 'unknown')) OR
    (typtype = 'a' AND (
        elemtyptype IN ('b', 'r', 'm', 'e', 'd') OR
        (elemtyptype = 'p' AND elemtypname IN ('record', 'void')) OR
        (elemtyptype = 'c' AND elemrelkind='c')
    ))
ORDER BY CASE
       WHEN typtype IN ('b', 'e', 'p') THEN 0
       WHEN typtype = 'r' THEN 1
       WHEN typtype = 'm' THEN 2
       WHEN typtype = 'c' THEN 3
       WHEN typtype = 'd' AND elemtyptype <> 'a' THEN 4
       WHEN typtype = 'a' THEN 5
       WHEN typtype = 'd' AND elemtyptype = 'a' THEN 6
END, t.oid""",
    ),
    (
        "npgsql",
        "SELECT typ.oid, att.attname, att.atttypid FROM pg_type AS typ JOIN pg_namespace AS ns "
        "ON (ns.oid = typ.typnamespace) JOIN pg_class AS cls ON (cls.oid = typ.typrelid) JOIN pg_attribute AS att "
        "ON (att.attrelid = typ.typrelid) WHERE (typ.typtype = 'c' AND cls.relkind='c') AND attnum > 0 AND "
        "NOT attisdropped ORDER BY typ.oid, att.attnum",
    ),
    (
        "npgsql",
        "SELECT pg_type.oid, enumlabel FROM pg_enum JOIN pg_type ON pg_type.oid=enumtypid "
        "ORDER BY oid, enumsortorder",
    ),
    # DBeaver
    (
        "dbeaver",
        "SELECT db.oid, db.* FROM pg_catalog.pg_database db WHERE datallowconn AND NOT datistemplate "
        "OR db.datname = 'demo' ORDER BY db.datname",
    ),
    (
        "dbeaver",
        "SELECT c.oid,c.*,t.relname as tabrelname,rn.nspname as tabrelnsp,d.description "
        "FROM pg_catalog.pg_class c LEFT OUTER JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid "
        "LEFT OUTER JOIN pg_catalog.pg_class t ON t.oid = i.inhparent LEFT OUTER JOIN pg_catalog.pg_namespace rn "
        "ON rn.oid = t.relnamespace LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid = c.oid "
        "AND d.objsubid = 0 AND d.classoid = 'pg_class'::regclass WHERE c.relnamespace = 2200 "
        "AND c.relkind not in ('i','I','c') ORDER BY c.relname",
    ),
    (
        "dbeaver",
        "select c.oid,pg_catalog.pg_total_relation_size(c.oid) as total_rel_size,"
        "pg_catalog.pg_relation_size(c.oid) as rel_size FROM pg_class c WHERE c.relnamespace = 2200 ORDER BY 1",
    ),
    (
        "dbeaver",
        "SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,c.reltablespace,tc.relname as "
        "tabrelname,dsc.description,pg_catalog.pg_get_expr(i.indpred, i.indrelid) as pred_expr,"
        "pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as expr,pg_catalog.pg_relation_size(i.indexrelid) "
        "as index_rel_size,pg_catalog.pg_stat_get_numscans(i.indexrelid) as index_num_scans FROM "
        "pg_catalog.pg_index i INNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid INNER JOIN "
        "pg_catalog.pg_class tc ON tc.oid=i.indrelid LEFT OUTER JOIN pg_catalog.pg_description dsc ON "
        "i.indexrelid=dsc.objoid WHERE i.indrelid = 'patients'::regclass ORDER BY tc.relname, c.relname",
    ),
    (
        "dbeaver",
        "SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,d.description, "
        "case when c.contype='c' then \"substring\"(pg_get_constraintdef(c.oid), 7) end as consrc_copy "
        "FROM pg_catalog.pg_constraint c INNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid "
        "LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid LEFT OUTER JOIN pg_catalog.pg_description d "
        "ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_constraint'::regclass WHERE t.relnamespace=2200 "
        "ORDER BY c.oid",
    ),
    (
        "dbeaver",
        "SELECT p.oid,p.*,d.description FROM pg_catalog.pg_proc p LEFT OUTER JOIN "
        "pg_catalog.pg_description d ON d.objoid=p.oid WHERE p.pronamespace=2200 ORDER BY p.proname",
    ),
    (
        "dbeaver",
        "SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as base_type_name, "
        "d.description FROM pg_catalog.pg_type t LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem "
        "LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid LEFT OUTER JOIN pg_catalog.pg_description d "
        "ON t.oid=d.objoid WHERE t.typname IS NOT NULL AND (c.relkind IS NULL OR c.relkind = 'c') AND "
        "(et.typcategory IS NULL OR et.typcategory <> 'C') AND t.typnamespace = 2200",
    ),
    ("dbeaver", "SELECT a.oid,a.* FROM pg_catalog.pg_am a ORDER BY a.oid"),
    (
        "dbeaver",
        "select e.oid, cfg.extname as name, cfg.extversion as version from pg_catalog.pg_extension cfg "
        "join pg_catalog.pg_extension e on e.oid = cfg.oid",
    ),
    ("dbeaver", "SELECT r.oid,r.* FROM pg_catalog.pg_roles r WHERE r.rolname = current_user"),
    ("dbeaver", "select setting from pg_settings where name = 'server_version_num'"),
    # Grafana: tables on the search path.
    (
        "grafana",
        """SELECT table_name FROM information_schema.tables WHERE table_schema IN (
  SELECT CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
  FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1),
                       array_upper(string_to_array(current_setting('search_path'),','),1)) as i,
       string_to_array(current_setting('search_path'),',') s)
ORDER BY table_name""",
    ),
    (
        "grafana",
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'visits' "
        "ORDER BY column_name",
    ),
    # psqlODBC (Tableau, Excel)
    ("psqlodbc", "select oid, typbasetype from pg_type where typname = 'lo'"),
    (
        "psqlodbc",
        "select nspname from pg_namespace n, pg_class c where c.relnamespace=n.oid and c.oid='zip_info'::regclass",
    ),
    (
        "psqlodbc",
        "select relname, nspname, relkind from pg_catalog.pg_class c, pg_catalog.pg_namespace n "
        "where relkind in ('r', 'v', 'm', 'f', 'p') and nspname not in ('pg_catalog', 'information_schema', "
        "'pg_toast', 'pg_temp_1') and n.oid = relnamespace order by nspname, relname",
    ),
    (
        "psqlodbc",
        "select n.nspname, c.relname, a.attname, a.atttypid, t.typname, a.attnum, a.attlen, "
        "a.atttypmod, a.attnotnull, c.relhasrules, c.relkind, c.oid, pg_get_expr(d.adbin, d.adrelid), "
        "case t.typtype when 'd' then t.typbasetype else 0 end, t.typtypmod, '', c.relhassubclass "
        "from (((pg_catalog.pg_class c inner join pg_catalog.pg_namespace n on n.oid = c.relnamespace and "
        "c.relname like 'patients' and n.nspname like 'public') inner join pg_catalog.pg_attribute a on "
        "(not a.attisdropped) and a.attnum > 0 and a.attrelid = c.oid) inner join pg_catalog.pg_type t on "
        "t.oid = a.atttypid) left outer join pg_attrdef d on a.atthasdef and d.adrelid = a.attrelid and "
        "d.adnum = a.attnum order by n.nspname, c.relname, attnum",
    ),
]


def _oid_symbols(conn: psycopg.Connection) -> dict[int, str]:
    symbols: dict[int, str] = {}
    for name in EXPOSED:
        oid, reltype = conn.execute(
            "SELECT oid, reltype FROM pg_class WHERE relname = %s AND relnamespace = 'public'::regnamespace",
            [name],
        ).fetchone()
        array = conn.execute("SELECT typarray FROM pg_type WHERE oid = %s", [reltype]).fetchone()[0]
        symbols[oid] = f"{{oid:{name}}}"
        symbols[reltype] = f"{{oid:{name}.rowtype}}"
        symbols[array] = f"{{oid:{name}.arraytype}}"
    (role,) = conn.execute("SELECT oid FROM pg_roles WHERE rolname = current_user").fetchone()
    (database,) = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    symbols[role] = "{oid:role}"
    symbols[database] = "{oid:database}"
    return symbols


def _symbolise_text(text: str, symbols: dict[int, str]) -> str:
    return re.sub(r"\b(\d{5})\b", lambda m: symbols.get(int(m.group()), m.group()), text)


def _json_value(value: object, symbols: dict[int, str]) -> object:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return symbols.get(value, value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v, symbols) for v in value]
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, float):
        return value
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return {"time": str(value)}
    if isinstance(value, (dict,)):
        return {"json": json.dumps(value, sort_keys=True)}
    if isinstance(value, str):
        return _symbolise_text(value, symbols) if re.fullmatch(r"\d{5}", value) else value
    return str(value)


def _run(conn: psycopg.Connection, sql: str, params: list[str | None]) -> dict[str, object]:
    pgconn = conn.pgconn
    encoded = [None if p is None else p.encode() for p in params]
    prepared = pgconn.prepare(b"", sql.encode(), None)
    if prepared.status != psycopg.pq.ExecStatus.COMMAND_OK:
        sqlstate = prepared.error_field(psycopg.pq.DiagnosticField.SQLSTATE).decode()
        return {"param_oids": [], "error": {"sqlstate": sqlstate, "message": prepared.error_message.decode()}}
    described = pgconn.describe_prepared(b"")
    param_oids = [described.param_type(i) for i in range(described.nparams)]
    result = pgconn.exec_prepared(b"", encoded, result_format=Format.TEXT)
    if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
        message = result.error_message.decode()
        conn.rollback()
        sqlstate = result.error_field(psycopg.pq.DiagnosticField.SQLSTATE).decode()
        return {"param_oids": param_oids, "error": {"sqlstate": sqlstate, "message": message}}
    columns = []
    loaders = []
    for i in range(result.nfields):
        oid = result.ftype(i)
        columns.append(
            {
                "name": result.fname(i).decode(),
                "type_oid": oid,
                "type_size": result.fsize(i),
                "type_modifier": result.fmod(i),
                "table_oid": result.ftable(i),
                "column_number": result.ftablecol(i),
            }
        )
        loaders.append(None if oid in (22, 30) else conn.adapters.get_loader(oid, Format.TEXT))
    rows = []
    for r in range(result.ntuples):
        row = []
        for c in range(result.nfields):
            raw = result.get_value(r, c)
            if raw is None:
                row.append(None)
            elif columns[c]["type_oid"] in (22, 30):
                row.append([int(x) for x in raw.decode().split()])  # int2vector / oidvector
            elif loaders[c] is None:
                row.append(raw.decode())  # no psycopg loader (regtype, regclass …): the text form
            else:
                row.append(loaders[c](columns[c]["type_oid"], conn).load(raw))
        rows.append(row)
    return {"param_oids": param_oids, "columns": columns, "rows": rows}


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    captured = json.loads((HERE / "captured.json").read_text())
    entries: list[dict[str, object]] = []
    seen: set[tuple[str, tuple[str | None, ...]]] = set()
    candidates = [
        (e["client"], e["action"], s, e.get("params") or [])
        for e in captured
        for s in split_statements(e["sql"])
    ] + [("handwritten", group, sql, []) for group, sql in HANDWRITTEN]
    with psycopg.connect(sys.argv[1]) as conn:
        conn.autocommit = True
        symbols = _oid_symbols(conn)
        for client, action, sql, params in candidates:
            try:
                statement = route(sql, EXPOSED)
            except Exception:
                continue
            if statement.kind is not Kind.CATALOG:
                continue
            key = (sql, tuple(params))
            if key in seen:
                continue
            seen.add(key)
            outcome = _run(conn, sql, list(params))
            count = sum(1 for e in entries if e["client"] == client and e["action"] == action)
            entry: dict[str, object] = {
                "id": f"{client}:{action}:{count + 1}",
                "client": client,
                "action": action,
                "sql": _symbolise_text(sql, symbols),
                "params": [None if p is None else _symbolise_text(p, symbols) for p in params],
                "param_oids": outcome["param_oids"],
            }
            if "error" in outcome:
                entry["error"] = outcome["error"]
            else:
                entry["columns"] = outcome["columns"]
                rows = outcome["rows"]
                entry["row_count"] = len(rows)
                # Thousands of rows (pgjdbc's getFunctions lists every built-in function) would
                # only bloat the fixture: those queries' rows are not compared.
                entry["rows"] = [[_json_value(v, symbols) for v in row] for row in rows[:MAX_ROWS]]
            entries.append(entry)
    out = HERE / "expected.json"
    out.write_text("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n")
    print(f"wrote {len(entries)} entries to {out}")


if __name__ == "__main__":
    main()
