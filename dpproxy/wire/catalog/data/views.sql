-- The computed relations of the shadow catalog's DuckDB (loaded by dpproxy/wire/catalog/build.py):
-- the catalog relations PostgreSQL computes from the session or from other relations.
--
-- Each is written `CREATE VIEW schema.name AS SELECT <expression> AS <column>, … [FROM … | WHERE …]`,
-- with PostgreSQL's schema and relation names. The loader gives every view exactly PostgreSQL's
-- columns in PostgreSQL's order, each cast to the type the shadow keeps it as: a column the SELECT
-- does not name is NULL, a later item overrides an earlier one, and `b.*` stands for every column
-- of b (for a passthrough of the stored table behind a computed relation, main.__base_<name>). A
-- label that is not one of the relation's columns is an error at start. No comment inside an item.
--
-- Placeholders (a name in braces after a dollar sign) are filled in by build.py, and one it does not
-- know is an error at start. The one named dumped_database stands for the items of the one
-- pg_database row of the PostgreSQL 15 dump (data/pg15.json), `<constant> AS <column>` each.
-- Per-session values come from DuckDB variables (see macros.sql): dp_user, dp_database,
-- dp_settings.
--
-- The views before the line `-- @macros` read stored tables only; the macros (macros.sql) are
-- created there, and the views after it call them.

-- The exposed tables' ACL names the session's analyst: SELECT granted by the owner.
CREATE VIEW pg_catalog.pg_class AS SELECT
    b.*,
    CASE WHEN b.relnamespace = ${public_namespace_oid} THEN
        ['${owner}=arwdDxt/${owner}', getvariable('dp_user') || '=r/${owner}'] ELSE b.relacl END AS relacl
FROM main.__base_pg_class b;

CREATE VIEW pg_catalog.pg_roles AS SELECT
    b.*
FROM (SELECT * FROM main.__base_pg_roles UNION ALL SELECT getvariable('dp_user'), false, true, false, false, true, false, -1, '********', NULL, false, NULL, ${analyst_role_oid}::UINTEGER) b;

CREATE VIEW pg_catalog.pg_user AS SELECT
    rolname AS usename,
    oid AS usesysid,
    rolcreatedb AS usecreatedb,
    rolsuper AS usesuper,
    rolreplication AS userepl,
    rolbypassrls AS usebypassrls,
    '********' AS passwd,
    rolvaliduntil AS valuntil,
    rolconfig AS useconfig
FROM main.pg_roles WHERE rolcanlogin;

CREATE VIEW pg_catalog.pg_database AS SELECT
    ${dumped_database},
    ${database_oid} AS oid,
    getvariable('dp_database') AS datname,
    ${bootstrap_role_oid} AS datdba,
    NULL AS datacl;

CREATE VIEW pg_catalog.pg_settings AS SELECT
    s.name AS name,
    s.unit AS unit,
    s.category AS category,
    s.short_desc AS short_desc,
    s.extra_desc AS extra_desc,
    s.context AS context,
    s.vartype AS vartype,
    s.min_val AS min_val,
    s.max_val AS max_val,
    s.enumvals AS enumvals,
    s.boot_val AS boot_val,
    coalesce(getvariable('dp_settings')[lower(s.name)], s.boot_val) AS setting,
    coalesce(getvariable('dp_settings')[lower(s.name)], s.boot_val) AS reset_val,
    'default' AS source,
    false AS pending_restart
FROM main.__settings s;

CREATE VIEW information_schema.information_schema_catalog_name AS SELECT
    getvariable('dp_database') AS catalog_name;

CREATE VIEW information_schema.enabled_roles AS SELECT
    getvariable('dp_user') AS role_name;

-- Every column NULL, and no row.
CREATE VIEW information_schema.applicable_roles AS SELECT
WHERE false;

CREATE VIEW information_schema.character_sets AS SELECT
    'UTF8' AS character_set_name,
    'UCS' AS character_repertoire,
    'UTF8' AS form_of_use,
    getvariable('dp_database') AS default_collate_catalog,
    'pg_catalog' AS default_collate_schema,
    'C' AS default_collate_name;

CREATE VIEW information_schema.table_privileges AS SELECT
    '${owner}' AS grantor,
    getvariable('dp_user') AS grantee,
    getvariable('dp_database') AS table_catalog,
    'public' AS table_schema,
    c.relname AS table_name,
    'SELECT' AS privilege_type,
    'NO' AS is_grantable,
    'YES' AS with_hierarchy
FROM main.pg_class c WHERE c.relnamespace = ${public_namespace_oid};

-- The grants to the roles the analyst holds: its own role's, so table_privileges' rows.
CREATE VIEW information_schema.role_table_grants AS SELECT
    p.*
FROM pg_information_schema.table_privileges p;

-- @macros

CREATE VIEW pg_catalog.pg_tables AS SELECT
    n.nspname AS schemaname,
    c.relname AS tablename,
    pg_get_userbyid(c.relowner) AS tableowner,
    c.relhasindex AS hasindexes,
    c.relhasrules AS hasrules,
    c.relhastriggers AS hastriggers,
    c.relrowsecurity AS rowsecurity
FROM main.pg_class c JOIN main.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p');

CREATE VIEW pg_catalog.pg_views AS SELECT
    n.nspname AS schemaname,
    c.relname AS viewname,
    pg_get_userbyid(c.relowner) AS viewowner
FROM main.pg_class c JOIN main.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'v';

CREATE VIEW information_schema.schemata AS SELECT
    getvariable('dp_database') AS catalog_name,
    n.nspname AS schema_name,
    pg_get_userbyid(n.nspowner) AS schema_owner
FROM main.pg_namespace n WHERE n.nspname <> 'pg_toast';

CREATE VIEW information_schema.tables AS SELECT
    getvariable('dp_database') AS table_catalog,
    n.nspname AS table_schema,
    c.relname AS table_name,
    CASE WHEN c.relkind IN ('r', 'p') THEN 'BASE TABLE'
         WHEN c.relkind = 'v' THEN 'VIEW'
         WHEN c.relkind = 'f' THEN 'FOREIGN' END AS table_type,
    CASE WHEN c.relkind IN ('r', 'p') THEN 'YES' ELSE 'NO' END AS is_insertable_into,
    'NO' AS is_typed
FROM main.pg_class c JOIN main.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'f');

CREATE VIEW information_schema.views AS SELECT
    getvariable('dp_database') AS table_catalog,
    n.nspname AS table_schema,
    c.relname AS table_name,
    'NONE' AS check_option,
    'NO' AS is_updatable,
    'NO' AS is_insertable_into,
    'NO' AS is_trigger_updatable,
    'NO' AS is_trigger_deletable,
    'NO' AS is_trigger_insertable_into
FROM main.pg_class c JOIN main.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'v';

-- information_schema.columns as PostgreSQL's view computes it, for the types the shadow holds.
CREATE VIEW information_schema.columns AS SELECT
    getvariable('dp_database') AS table_catalog,
    n.nspname AS table_schema,
    c.relname AS table_name,
    a.attname AS column_name,
    a.attnum AS ordinal_position,
    CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS is_nullable,
    CASE WHEN t.typtype = 'd' THEN CASE WHEN bt.typcategory = 'A' THEN 'ARRAY'
         WHEN bt.typnamespace = 11 THEN format_type(bt.oid, NULL) ELSE 'USER-DEFINED' END
         WHEN t.typcategory = 'A' THEN 'ARRAY' WHEN t.typnamespace = 11 THEN format_type(t.oid, NULL)
         ELSE 'USER-DEFINED' END AS data_type,
    CASE WHEN bt.oid IN (1042, 1043) AND a.atttypmod > 0
         THEN a.atttypmod - 4 END AS character_maximum_length,
    CASE WHEN bt.oid IN (25, 1042, 1043) THEN CASE WHEN a.atttypmod > 0
         THEN (a.atttypmod - 4) * 4 ELSE 1073741824 END END AS character_octet_length,
    CASE bt.oid WHEN 21 THEN 16 WHEN 23 THEN 32 WHEN 20 THEN 64 WHEN 700 THEN 24
         WHEN 701 THEN 53 WHEN 1700 THEN CASE WHEN a.atttypmod > 0
         THEN ((a.atttypmod - 4) >> 16) & 65535 END END AS numeric_precision,
    CASE WHEN bt.oid IN (21, 23, 20, 700, 701) THEN 2
         WHEN bt.oid = 1700 THEN 10 END AS numeric_precision_radix,
    CASE WHEN bt.oid IN (21, 23, 20) THEN 0 WHEN bt.oid = 1700 AND a.atttypmod > 0
         THEN (a.atttypmod - 4) & 65535 END AS numeric_scale,
    CASE WHEN bt.oid = 1082 THEN 0 WHEN bt.oid IN (1083, 1114, 1184, 1266, 1186)
         THEN CASE WHEN a.atttypmod < 0 THEN 6 ELSE a.atttypmod END END AS datetime_precision,
    CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
         THEN getvariable('dp_database') END AS collation_catalog,
    CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
         THEN 'pg_catalog' END AS collation_schema,
    CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN
         (SELECT collname FROM main.pg_collation co WHERE co.oid = a.attcollation) END AS collation_name,
    CASE WHEN t.typtype = 'd' THEN getvariable('dp_database') END AS domain_catalog,
    CASE WHEN t.typtype = 'd' THEN (SELECT nspname FROM main.pg_namespace dn
         WHERE dn.oid = t.typnamespace) END AS domain_schema,
    CASE WHEN t.typtype = 'd' THEN t.typname END AS domain_name,
    getvariable('dp_database') AS udt_catalog,
    (SELECT nspname FROM main.pg_namespace un WHERE un.oid = bt.typnamespace) AS udt_schema,
    bt.typname AS udt_name,
    CAST(a.attnum AS VARCHAR) AS dtd_identifier,
    'NO' AS is_self_referencing,
    'NO' AS is_identity,
    'NO' AS identity_cycle,
    'NEVER' AS is_generated,
    CASE WHEN c.relkind IN ('r', 'p') THEN 'YES' ELSE 'NO' END AS is_updatable
FROM main.pg_attribute a JOIN main.pg_class c ON c.oid = a.attrelid
JOIN main.pg_namespace n ON n.oid = c.relnamespace JOIN main.pg_type t ON t.oid = a.atttypid
LEFT JOIN main.pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'f');

CREATE VIEW pg_catalog.pg_indexes AS SELECT
    n.nspname AS schemaname,
    c.relname AS tablename,
    i.relname AS indexname,
    NULL AS tablespace,
    pg_get_indexdef(i.oid) AS indexdef
FROM main.pg_index x JOIN main.pg_class c ON c.oid = x.indrelid JOIN main.pg_class i ON i.oid = x.indexrelid
JOIN main.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'm', 'p') AND i.relkind IN ('i', 'I');

-- The constraint views of information_schema, as PostgreSQL 15 computes them. One difference on
-- purpose: PostgreSQL shows a table's constraints only to its owner or to a role holding a privilege
-- other than SELECT on it; the shadow shows the exposed tables' keys to the analyst, who reads them
-- in pg_constraint anyway. NOT NULL columns appear as CHECK constraints named
-- <namespace oid>_<table oid>_<column number>_not_null, as in PostgreSQL.
CREATE VIEW information_schema.table_constraints AS SELECT
    getvariable('dp_database') AS constraint_catalog,
    'public' AS constraint_schema,
    k.constraint_name AS constraint_name,
    getvariable('dp_database') AS table_catalog,
    'public' AS table_schema,
    r.relname AS table_name,
    k.constraint_type AS constraint_type,
    k.is_deferrable AS is_deferrable,
    k.initially_deferred AS initially_deferred,
    'YES' AS enforced,
    k.nulls_distinct AS nulls_distinct
FROM (SELECT c.conname AS constraint_name, c.conrelid AS relid,
             CASE c.contype WHEN 'p' THEN 'PRIMARY KEY' WHEN 'u' THEN 'UNIQUE' WHEN 'f' THEN 'FOREIGN KEY' END AS constraint_type,
             CASE WHEN c.condeferrable THEN 'YES' ELSE 'NO' END AS is_deferrable,
             CASE WHEN c.condeferred THEN 'YES' ELSE 'NO' END AS initially_deferred,
             CASE WHEN c.contype IN ('p', 'u') THEN 'YES' END AS nulls_distinct
      FROM main.pg_constraint c
      UNION ALL
      SELECT CAST(${public_namespace_oid} AS VARCHAR) || '_' || CAST(a.attrelid AS VARCHAR) || '_' || CAST(a.attnum AS VARCHAR) || '_not_null',
             a.attrelid, 'CHECK', 'NO', 'NO', NULL
      FROM main.pg_attribute a JOIN main.pg_class ar ON ar.oid = a.attrelid
      WHERE a.attnotnull AND a.attnum > 0 AND NOT a.attisdropped AND ar.relkind IN ('r', 'p')
            AND ar.relnamespace = ${public_namespace_oid}) k
JOIN main.pg_class r ON r.oid = k.relid;

CREATE VIEW information_schema.check_constraints AS SELECT
    getvariable('dp_database') AS constraint_catalog,
    'public' AS constraint_schema,
    CAST(${public_namespace_oid} AS VARCHAR) || '_' || CAST(a.attrelid AS VARCHAR) || '_' || CAST(a.attnum AS VARCHAR) || '_not_null' AS constraint_name,
    quote_ident(a.attname) || ' IS NOT NULL' AS check_clause
FROM main.pg_attribute a JOIN main.pg_class ar ON ar.oid = a.attrelid
WHERE a.attnotnull AND a.attnum > 0 AND NOT a.attisdropped AND ar.relkind IN ('r', 'p')
      AND ar.relnamespace = ${public_namespace_oid};

CREATE VIEW information_schema.key_column_usage AS SELECT
    getvariable('dp_database') AS constraint_catalog,
    'public' AS constraint_schema,
    c.conname AS constraint_name,
    getvariable('dp_database') AS table_catalog,
    'public' AS table_schema,
    r.relname AS table_name,
    a.attname AS column_name,
    k.n AS ordinal_position,
    CASE WHEN c.contype = 'f' THEN (SELECT CAST(p.n AS INTEGER) FROM main.pg_index ix,
         (SELECT unnest(ix.indkey) AS attnum, generate_subscripts(ix.indkey, 1) AS n) p
         WHERE ix.indexrelid = c.conindid AND p.attnum = c.confkey[k.n]) END AS position_in_unique_constraint
FROM main.pg_constraint c
JOIN (SELECT cc.oid AS oid, unnest(cc.conkey) AS attnum, generate_subscripts(cc.conkey, 1) AS n
      FROM main.pg_constraint cc) k ON k.oid = c.oid
JOIN main.pg_class r ON r.oid = c.conrelid
JOIN main.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
WHERE c.contype IN ('p', 'u', 'f');

CREATE VIEW information_schema.referential_constraints AS SELECT
    getvariable('dp_database') AS constraint_catalog,
    'public' AS constraint_schema,
    c.conname AS constraint_name,
    CASE WHEN u.conname IS NOT NULL THEN getvariable('dp_database') END AS unique_constraint_catalog,
    CASE WHEN u.conname IS NOT NULL THEN 'public' END AS unique_constraint_schema,
    u.conname AS unique_constraint_name,
    CASE c.confmatchtype WHEN 'f' THEN 'FULL' WHEN 'p' THEN 'PARTIAL' ELSE 'NONE' END AS match_option,
    CASE c.confupdtype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' WHEN 'd' THEN 'SET DEFAULT'
         WHEN 'r' THEN 'RESTRICT' ELSE 'NO ACTION' END AS update_rule,
    CASE c.confdeltype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' WHEN 'd' THEN 'SET DEFAULT'
         WHEN 'r' THEN 'RESTRICT' ELSE 'NO ACTION' END AS delete_rule
FROM main.pg_constraint c
LEFT JOIN main.pg_constraint u ON u.conindid = c.conindid AND u.contype IN ('p', 'u') AND u.conrelid = c.confrelid
WHERE c.contype = 'f';

-- A key's own columns; a foreign key's referenced columns (in the referenced table).
CREATE VIEW information_schema.constraint_column_usage AS SELECT
    getvariable('dp_database') AS table_catalog,
    'public' AS table_schema,
    r.relname AS table_name,
    a.attname AS column_name,
    getvariable('dp_database') AS constraint_catalog,
    'public' AS constraint_schema,
    k.conname AS constraint_name
FROM (SELECT c.conname AS conname, CASE WHEN c.contype = 'f' THEN c.confrelid ELSE c.conrelid END AS relid,
             unnest(CASE WHEN c.contype = 'f' THEN c.confkey ELSE c.conkey END) AS attnum
      FROM main.pg_constraint c WHERE c.contype IN ('p', 'u', 'f')) k
JOIN main.pg_class r ON r.oid = k.relid
JOIN main.pg_attribute a ON a.attrelid = k.relid AND a.attnum = k.attnum;
