-- PostgreSQL functions for the shadow catalog's DuckDB (loaded by dpproxy/wire/catalog/build.py).
--
-- Each answers as PostgreSQL 15 would for a database holding only the exposed tables, empty.
-- ${name} placeholders are filled in by build.py. DuckDB macros are not hygienic: an argument is
-- substituted as text into the body, so every table a macro reads is one of the __-prefixed lookup
-- tables, aliased __xN, whose columns are __-prefixed too: an argument referring to the caller's
-- columns can then never bind to the macro's own. Lambda parameters are __-prefixed for the same
-- reason. A macro may only use macros defined above it. And since an argument is copied wherever
-- its parameter appears, string work binds the argument once to a lambda parameter
-- (list_transform([x], lambda __v: …)[1]): nested macros would otherwise multiply its copies.
--
-- Per-session values come from DuckDB variables set before each query: dp_user, dp_database,
-- dp_pid, dp_settings (a map of lower-cased setting names), dp_started.
--
-- Only functions that describe are defined here. One that would act (pg_sleep, random, setseed,
-- pg_cancel_backend, txid_current, nextval, pg_advisory_lock …) must not be: a macro could only
-- pretend, answering a value while nothing happened. refusals.py refuses those by name before
-- DuckDB sees the query, and the session runs SELECT set_config(…) itself. set_config over a
-- catalog relation's rows is the one exception: its macro refuses for each row that reaches it, so
-- that over no row it does nothing, as PostgreSQL does (pg_dump's probe of a setting this server
-- lacks, `SELECT set_config(name, …) FROM pg_settings WHERE name = '…'`).

-- Identity ---------------------------------------------------------------------------------------

CREATE MACRO version() AS '${version}';
CREATE MACRO current_database() AS getvariable('dp_database');
CREATE MACRO current_catalog() AS getvariable('dp_database');
CREATE MACRO current_user() AS getvariable('dp_user');
CREATE MACRO session_user() AS getvariable('dp_user');
CREATE MACRO current_role() AS getvariable('dp_user');
CREATE MACRO "user"() AS getvariable('dp_user');
CREATE MACRO pg_backend_pid() AS CAST(getvariable('dp_pid') AS INTEGER);
CREATE MACRO pg_get_userbyid(r) AS
    CASE WHEN r = ${analyst_role_oid} THEN getvariable('dp_user')
         ELSE coalesce((SELECT __x1.__name FROM main.__role __x1 WHERE __x1.__oid = r),
                       'unknown (OID=' || CAST(r AS VARCHAR) || ')') END;
CREATE MACRO pg_postmaster_start_time() AS getvariable('dp_started');
CREATE MACRO pg_conf_load_time() AS getvariable('dp_started');
CREATE MACRO pg_is_in_recovery() AS false;
CREATE MACRO inet_server_addr() AS CAST(NULL AS VARCHAR);
CREATE MACRO inet_client_addr() AS CAST(NULL AS VARCHAR);
CREATE MACRO inet_server_port() AS CAST(NULL AS INTEGER);
CREATE MACRO inet_client_port() AS CAST(NULL AS INTEGER);
CREATE MACRO pg_my_temp_schema() AS CAST(0 AS UINTEGER);
CREATE MACRO pg_is_other_temp_schema(o) AS false;
CREATE MACRO pg_jit_available() AS false;
CREATE MACRO row_security_active(t) AS false;

-- Text -------------------------------------------------------------------------------------------

CREATE MACRO quote_ident(s) AS list_transform([s], lambda __s:
    CASE WHEN regexp_full_match(__s, '[a-z_][a-z0-9_$]*') AND NOT list_contains([${quoted_keywords}], __s) THEN __s
         ELSE '"' || replace(__s, '"', '""') || '"' END)[1];
CREATE MACRO quote_literal(s) AS '''' || replace(CAST(s AS VARCHAR), '''', '''''') || '''';
CREATE MACRO quote_nullable(s) AS coalesce(quote_literal(s), 'NULL');
CREATE MACRO pg_encoding_to_char(e) AS
    CASE e WHEN 0 THEN 'SQL_ASCII' WHEN 6 THEN 'UTF8' WHEN 8 THEN 'LATIN1' ELSE '' END;
CREATE MACRO pg_char_to_encoding(n) AS
    CASE upper(n) WHEN 'SQL_ASCII' THEN 0 WHEN 'UTF8' THEN 6 WHEN 'LATIN1' THEN 8 ELSE -1 END;
CREATE MACRO pg_client_encoding() AS 'UTF8';
CREATE MACRO getdatabaseencoding() AS 'UTF8';

-- Settings, read only: the session's values, over PostgreSQL's defaults ---------------------------

CREATE MACRO current_setting(n) AS
    coalesce(getvariable('dp_settings')[lower(n)],
             error('dpproxy:42704:unrecognized configuration parameter "' || n || '"')),
    (n, m) AS
    CASE WHEN m THEN getvariable('dp_settings')[lower(n)]
         ELSE coalesce(getvariable('dp_settings')[lower(n)],
                       error('dpproxy:42704:unrecognized configuration parameter "' || n || '"')) END;

CREATE MACRO set_config(n, v, l) AS
    CASE WHEN n IS NULL AND v IS NULL AND l IS NULL THEN NULL ELSE error('dpproxy:refused:set_config') END;

-- Privileges: the built-in defaults of an object owned by role r (pg_dump reads them) ------------

CREATE MACRO acldefault(k, r) AS list_transform([pg_get_userbyid(r)], lambda __u:
    CASE k WHEN 'r' THEN [__u || '=arwdDxt/' || __u]
           WHEN 's' THEN [__u || '=rwU/' || __u]
           WHEN 'n' THEN [__u || '=UC/' || __u]
           WHEN 'd' THEN ['=Tc/' || __u, __u || '=CTc/' || __u]
           WHEN 't' THEN [__u || '=C/' || __u]
           WHEN 'L' THEN [__u || '=rw/' || __u]
           WHEN 'F' THEN [__u || '=U/' || __u]
           WHEN 'S' THEN [__u || '=U/' || __u]
           WHEN 'f' THEN ['=X/' || __u, __u || '=X/' || __u]
           WHEN 'l' THEN ['=U/' || __u, __u || '=U/' || __u]
           WHEN 'T' THEN ['=U/' || __u, __u || '=U/' || __u]
           ELSE error('dpproxy:22023:unrecognized object type abbreviation: ' || k) END)[1];

-- Types and names --------------------------------------------------------------------------------

CREATE MACRO format_type(t, m) AS (
    SELECT CASE WHEN m IS NULL THEN __x2.__fmt_null
                WHEN m < 0 THEN __x2.__fmt_default
                WHEN __x2.__oid = 1700 THEN 'numeric(' || CAST(((m - 4) >> 16) & 65535 AS VARCHAR) || ','
                                            || CAST((m - 4) & 65535 AS VARCHAR) || ')'
                WHEN __x2.__oid = 1043 THEN 'character varying(' || CAST(m - 4 AS VARCHAR) || ')'
                WHEN __x2.__oid = 1042 THEN 'character(' || CAST(m - 4 AS VARCHAR) || ')'
                WHEN __x2.__oid = 1114 THEN 'timestamp(' || CAST(m AS VARCHAR) || ') without time zone'
                WHEN __x2.__oid = 1184 THEN 'timestamp(' || CAST(m AS VARCHAR) || ') with time zone'
                ELSE __x2.__fmt_default END
    FROM main.__typ __x2 WHERE __x2.__oid = t);
CREATE MACRO pg_table_is_visible(o) AS
    (SELECT __x3.__nsp IN (11, 2200) FROM main.__rel __x3 WHERE __x3.__oid = o);
CREATE MACRO pg_type_is_visible(o) AS
    (SELECT __x4.__nsp IN (11, 2200) FROM main.__typ __x4 WHERE __x4.__oid = o);
CREATE MACRO pg_function_is_visible(o) AS (SELECT true FROM main.__proc __x18 WHERE __x18.__oid = o);
CREATE MACRO pg_collation_is_visible(o) AS CASE WHEN o IS NOT NULL THEN true END;
CREATE MACRO pg_opclass_is_visible(o) AS CASE WHEN o IS NOT NULL THEN true END;
CREATE MACRO pg_operator_is_visible(o) AS true;
CREATE MACRO pg_conversion_is_visible(o) AS true;
CREATE MACRO pg_opfamily_is_visible(o) AS true;
CREATE MACRO pg_statistics_obj_is_visible(o) AS true;
CREATE MACRO pg_ts_config_is_visible(o) AS true;
CREATE MACRO pg_ts_dict_is_visible(o) AS true;
CREATE MACRO pg_ts_parser_is_visible(o) AS true;
CREATE MACRO pg_ts_template_is_visible(o) AS true;

-- Names as the reg* types read them: an optional schema, and quotes that keep case.
CREATE MACRO __name_part(s) AS CASE WHEN s LIKE '"%"' THEN replace(s[2:-2], '""', '"') ELSE lower(s) END;
CREATE MACRO __last_name(s) AS list_transform([trim(CAST(s AS VARCHAR))], lambda __t:
    __name_part(regexp_extract(__t, '(("([^"]|"")*")|[^."]+)$', 1)))[1];
CREATE MACRO __relation_key(s) AS list_transform([trim(CAST(s AS VARCHAR))], lambda __t:
    CASE WHEN regexp_matches(__t, '^(("([^"]|"")*")|[^."]+)\.')
         THEN __name_part(regexp_extract(__t, '^(("([^"]|"")*")|[^."]+)\.', 1)) || '.' ELSE '' END
    || __name_part(regexp_extract(__t, '(("([^"]|"")*")|[^."]+)$', 1)))[1];
-- The schemas of the session's search_path that exist, in order ("$user" names none here).
CREATE MACRO __search_path() AS list_filter(
    list_transform(string_split(coalesce(getvariable('dp_settings')['search_path'], ''), ','),
                   lambda __s: __name_part(trim(__s))),
    lambda __s: __s IN ('public', 'pg_catalog', 'information_schema'));
CREATE MACRO current_schemas(implicit) AS list_transform([__search_path()], lambda __p:
    CASE WHEN implicit AND NOT list_contains(__p, 'pg_catalog') THEN list_prepend('pg_catalog', __p)
         ELSE __p END)[1];
CREATE MACRO current_schema() AS __search_path()[1];
CREATE MACRO __relation_oid(s) AS
    (SELECT __x5.__oid FROM main.__relkey __x5 WHERE __x5.__key = __relation_key(s));
-- A type name: words folded and spaced as PostgreSQL's grammar reads them, or quoted parts kept as
-- written (TypeORM's ('"' || udt_schema || '"."' || udt_name || '"')::regtype).
CREATE MACRO __type_oid(s) AS
    (SELECT __x6.__oid FROM main.__typkey __x6
     WHERE __x6.__key = CASE WHEN contains(CAST(s AS VARCHAR), '"') THEN __relation_key(s)
         ELSE lower(regexp_replace(regexp_replace(trim(CAST(s AS VARCHAR)), '^pg_catalog\.', ''),
                                   '\s+', ' ', 'g')) END);
CREATE MACRO __namespace_oid(s) AS
    (SELECT __x7.__oid FROM main.__nsp __x7 WHERE __x7.__name = __last_name(s));
CREATE MACRO __role_oid(s) AS
    CASE WHEN __last_name(s) = getvariable('dp_user') THEN ${analyst_role_oid}
         ELSE (SELECT __x8.__oid FROM main.__role __x8 WHERE __x8.__name = __last_name(s)) END;
CREATE MACRO __proc_oid(s) AS
    (SELECT __x16.__oid FROM main.__prockey __x16
     WHERE __x16.__key = __relation_key(regexp_replace(CAST(s AS VARCHAR), '\(.*$', '')));

-- ::regclass and friends: an OID from an OID, a number or a name (PostgreSQL's errors otherwise):
-- `found` is the OID the name looks up; `sqlstate` and `what` make PostgreSQL's error for a name
-- that names nothing.
CREATE MACRO __to_oid(x, found, sqlstate, what) AS
    coalesce(TRY_CAST(x AS UINTEGER), found,
             CASE WHEN x IS NOT NULL
                  THEN error('dpproxy:' || sqlstate || ':' || what || ' "' || CAST(x AS VARCHAR) || '" does not exist')
             END);
CREATE MACRO __to_regclass(x) AS __to_oid(x, __relation_oid(x), '42P01', 'relation');
CREATE MACRO __to_regtype(x) AS __to_oid(x, __type_oid(x), '42704', 'type');
CREATE MACRO __to_regnamespace(x) AS __to_oid(x, __namespace_oid(x), '42704', 'schema');
CREATE MACRO __to_regrole(x) AS __to_oid(x, __role_oid(x), '42704', 'role');
CREATE MACRO __to_regproc(x) AS __to_oid(x, __proc_oid(x), '42883', 'function');
CREATE MACRO __to_regprocedure(x) AS TRY_CAST(x AS UINTEGER);

-- …and back to text, as ::regclass::text prints them ("-" for OID 0).
CREATE MACRO __regclass_out(o) AS
    CASE WHEN o = 0 THEN '-'
         ELSE coalesce((SELECT __x9.__display FROM main.__rel __x9 WHERE __x9.__oid = o), CAST(o AS VARCHAR)) END;
CREATE MACRO __regtype_out(o) AS
    CASE WHEN o = 0 THEN '-'
         ELSE coalesce((SELECT __x10.__fmt_null FROM main.__typ __x10 WHERE __x10.__oid = o),
                       CAST(o AS VARCHAR)) END;
CREATE MACRO __regnamespace_out(o) AS
    CASE WHEN o = 0 THEN '-'
         ELSE coalesce((SELECT quote_ident(__x11.__name) FROM main.__nsp __x11 WHERE __x11.__oid = o),
                       CAST(o AS VARCHAR)) END;
CREATE MACRO __regrole_out(o) AS
    CASE WHEN o = 0 THEN '-' WHEN o = ${analyst_role_oid} THEN getvariable('dp_user')
         ELSE coalesce((SELECT __x12.__name FROM main.__role __x12 WHERE __x12.__oid = o), CAST(o AS VARCHAR)) END;
CREATE MACRO __regproc_out(o) AS
    CASE WHEN o = 0 THEN '-'
         ELSE coalesce((SELECT __x17.__display FROM main.__proc __x17 WHERE __x17.__oid = o),
                       CAST(o AS VARCHAR)) END;
CREATE MACRO __regprocedure_out(o) AS CAST(o AS VARCHAR);
-- regtype[]::text[] and friends: each OID's name, in order.
CREATE MACRO __regtype_array_out(a) AS
    CASE WHEN a IS NOT NULL THEN coalesce((SELECT list(coalesce(__x23.__fmt_null, CAST(__g.__v AS VARCHAR)) ORDER BY __g.__i)
        FROM (SELECT unnest(a) AS __v, generate_subscripts(a, 1) AS __i) __g
        LEFT JOIN main.__typ __x23 ON __x23.__oid = __g.__v), CAST([] AS VARCHAR[])) END;
CREATE MACRO __regclass_array_out(a) AS
    CASE WHEN a IS NOT NULL THEN coalesce((SELECT list(coalesce(__x24.__display, CAST(__g.__v AS VARCHAR)) ORDER BY __g.__i)
        FROM (SELECT unnest(a) AS __v, generate_subscripts(a, 1) AS __i) __g
        LEFT JOIN main.__rel __x24 ON __x24.__oid = __g.__v), CAST([] AS VARCHAR[])) END;
CREATE MACRO __regproc_array_out(a) AS
    CASE WHEN a IS NOT NULL THEN coalesce((SELECT list(coalesce(__x25.__display, CAST(__g.__v AS VARCHAR)) ORDER BY __g.__i)
        FROM (SELECT unnest(a) AS __v, generate_subscripts(a, 1) AS __i) __g
        LEFT JOIN main.__proc __x25 ON __x25.__oid = __g.__v), CAST([] AS VARCHAR[])) END;

-- Arrays as text (::text, ::varchar), as array_out writes them: {a,"b c",NULL}, each element quoted
-- when it is empty, NULL-like or holds a delimiter, brace, quote, backslash or space; int2vector
-- and oidvector space-separated; booleans t and f. DuckDB's own cast would write [a, b c].
CREATE MACRO __array_out(a) AS list_transform([a], lambda __a:
    '{' || array_to_string(list_transform(__a, lambda __e: list_transform(
        [CASE WHEN typeof(__e) = 'BOOLEAN' THEN left(CAST(__e AS VARCHAR), 1) ELSE CAST(__e AS VARCHAR) END], lambda __t:
        CASE WHEN __t IS NULL THEN 'NULL'
             WHEN __t = '' OR upper(__t) = 'NULL' OR regexp_matches(__t, '[{}",\\\s]')
                  THEN '"' || replace(replace(__t, '\', '\\'), '"', '\"') || '"'
             ELSE __t END)[1]), ',') || '}')[1];
CREATE MACRO __vector_out(a) AS array_to_string(a, ' ');

-- parse_ident('a."B c"') → {a,"B c"}: dot-separated names, unquoted ones folded to lower case.
CREATE MACRO parse_ident(s) AS list_transform(regexp_extract_all(CAST(s AS VARCHAR), '"(?:[^"]|"")*"|[^."]+'),
        lambda __p: __name_part(trim(__p))),
    (s, strict) AS list_transform(regexp_extract_all(CAST(s AS VARCHAR), '"(?:[^"]|"")*"|[^."]+'),
        lambda __p: __name_part(trim(__p)));

CREATE MACRO to_regclass(x) AS __relation_oid(CAST(x AS VARCHAR));
CREATE MACRO to_regtype(x) AS __type_oid(CAST(x AS VARCHAR));
CREATE MACRO to_regnamespace(x) AS __namespace_oid(CAST(x AS VARCHAR));
CREATE MACRO to_regrole(x) AS __role_oid(CAST(x AS VARCHAR));
CREATE MACRO to_regproc(x) AS __proc_oid(CAST(x AS VARCHAR));
CREATE MACRO to_regprocedure(x) AS CAST(NULL AS UINTEGER);

-- Privileges: the analyst may read the exposed tables and the catalog, and do nothing else ------

CREATE MACRO __privileges(p) AS
    list_filter(string_split(upper(replace(p, ' ', '')), ','), lambda __q: __q <> '');
CREATE MACRO __can_read(p) AS
    list_bool_and(list_transform(__privileges(p), lambda __q:
        regexp_replace(__q, 'WITHGRANTOPTION$', '') IN ('SELECT', 'USAGE', 'CONNECT', 'EXECUTE', 'MEMBER')))
    AND NOT list_bool_or(list_transform(__privileges(p), lambda __q: __q LIKE '%WITHGRANTOPTION'));
CREATE MACRO __relation_ref(t) AS coalesce(TRY_CAST(t AS UINTEGER), __relation_oid(t));
CREATE MACRO __table_privilege(t, p) AS
    CASE WHEN __relation_ref(t) IS NULL
         THEN error('dpproxy:42P01:relation "' || CAST(t AS VARCHAR) || '" does not exist')
         ELSE __can_read(p) END;
CREATE MACRO __schema_privilege(s, p) AS
    CASE WHEN coalesce(TRY_CAST(s AS UINTEGER), __namespace_oid(s)) IS NULL
         THEN error('dpproxy:42704:schema "' || CAST(s AS VARCHAR) || '" does not exist')
         ELSE __can_read(p) END;
CREATE MACRO has_table_privilege(t, p) AS __table_privilege(t, p), (u, t, p) AS __table_privilege(t, p);
CREATE MACRO has_any_column_privilege(t, p) AS __table_privilege(t, p), (u, t, p) AS __table_privilege(t, p);
CREATE MACRO has_column_privilege(t, c, p) AS __table_privilege(t, p), (u, t, c, p) AS __table_privilege(t, p);
CREATE MACRO has_sequence_privilege(t, p) AS false, (u, t, p) AS false;
CREATE MACRO has_schema_privilege(s, p) AS __schema_privilege(s, p), (u, s, p) AS __schema_privilege(s, p);
CREATE MACRO has_database_privilege(d, p) AS __can_read(p), (u, d, p) AS __can_read(p);
CREATE MACRO has_function_privilege(f, p) AS __can_read(p), (u, f, p) AS __can_read(p);
CREATE MACRO has_type_privilege(t, p) AS __can_read(p), (u, t, p) AS __can_read(p);
CREATE MACRO has_language_privilege(l, p) AS __can_read(p), (u, l, p) AS __can_read(p);
CREATE MACRO has_tablespace_privilege(s, p) AS false, (u, s, p) AS false;
CREATE MACRO has_foreign_data_wrapper_privilege(s, p) AS false, (u, s, p) AS false;
CREATE MACRO has_server_privilege(s, p) AS false, (u, s, p) AS false;
CREATE MACRO pg_has_role(r, p) AS CAST(r AS VARCHAR) IN (getvariable('dp_user'), '${analyst_role_oid}'),
    (u, r, p) AS CAST(r AS VARCHAR) IN (getvariable('dp_user'), '${analyst_role_oid}');

-- Descriptions and definitions: nothing is stored but descriptions ------------------------------

CREATE MACRO obj_description(o, c) AS
    (SELECT __x13.__text FROM main.__desc __x13
     WHERE __x13.__objoid = o AND __x13.__objsubid = 0 AND __x13.__classoid = __relation_oid(CAST(c AS VARCHAR))),
    (o) AS (SELECT __x14.__text FROM main.__desc __x14 WHERE __x14.__objoid = o AND __x14.__objsubid = 0 LIMIT 1);
CREATE MACRO col_description(t, c) AS
    (SELECT __x15.__text FROM main.__desc __x15
     WHERE __x15.__objoid = t AND __x15.__objsubid = c AND __x15.__classoid = 1259);
CREATE MACRO shobj_description(o, c) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_expr(e, r) AS CAST(NULL AS VARCHAR), (e, r, p) AS CAST(NULL AS VARCHAR);
-- Keys and plain indexes of the exposed tables (structure.py): their definitions as PostgreSQL
-- prints them. pg_get_indexdef(o, n, pretty) is the whole definition for n = 0, else the nth column.
CREATE MACRO pg_get_constraintdef(o) AS
    (SELECT CASE WHEN list_contains(__search_path(), 'public') THEN __x19.__text ELSE __x19.__qualified END
     FROM main.__condef __x19 WHERE __x19.__oid = o),
    (o, p) AS
    (SELECT CASE WHEN list_contains(__search_path(), 'public') THEN __x20.__text ELSE __x20.__qualified END
     FROM main.__condef __x20 WHERE __x20.__oid = o);
CREATE MACRO pg_get_indexdef(o) AS
    (SELECT __x21.__text FROM main.__idxdef __x21 WHERE __x21.__oid = o AND __x21.__n = 0),
    (o, c, p) AS (SELECT __x22.__text FROM main.__idxdef __x22 WHERE __x22.__oid = o AND __x22.__n = c);
CREATE MACRO pg_get_viewdef(v) AS CAST(NULL AS VARCHAR), (v, p) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_triggerdef(o) AS CAST(NULL AS VARCHAR), (o, p) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_ruledef(o) AS CAST(NULL AS VARCHAR), (o, p) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_functiondef(o) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_function_arguments(o) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_function_identity_arguments(o) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_function_result(o) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_statisticsobjdef_columns(o) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_partkeydef(o) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_get_serial_sequence(t, c) AS CAST(NULL AS VARCHAR);
CREATE MACRO pg_relation_is_publishable(o) AS false;
-- No table of the shadow is a partition: none has ancestors or a partition root.
CREATE MACRO pg_partition_ancestors(o) AS unnest(CAST([] AS UINTEGER[]));
CREATE MACRO pg_partition_root(o) AS CAST(NULL AS UINTEGER);
CREATE MACRO pg_tablespace_location(o) AS '';

-- Sizes and statistics of empty tables: any other value would describe the data ----------------

CREATE MACRO pg_table_size(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_relation_size(o) AS CAST(0 AS BIGINT), (o, f) AS CAST(0 AS BIGINT);
CREATE MACRO pg_total_relation_size(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_indexes_size(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_database_size(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_tablespace_size(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_size_pretty(b) AS
    CASE WHEN abs(b) < 10240 THEN CAST(b AS VARCHAR) || ' bytes'
         WHEN abs(b) < 10485760 THEN CAST(round(b / 1024) AS BIGINT) || ' kB'
         WHEN abs(b) < 10737418240 THEN CAST(round(b / 1048576) AS BIGINT) || ' MB'
         ELSE CAST(round(b / 1073741824) AS BIGINT) || ' GB' END;
CREATE MACRO pg_stat_get_numscans(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_tuples_returned(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_tuples_fetched(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_tuples_inserted(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_tuples_updated(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_tuples_deleted(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_tuples_hot_updated(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_live_tuples(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_dead_tuples(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_blocks_fetched(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_blocks_hit(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_mod_since_analyze(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_ins_since_vacuum(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_vacuum_count(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_analyze_count(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_autovacuum_count(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_autoanalyze_count(o) AS CAST(0 AS BIGINT);
CREATE MACRO pg_stat_get_last_vacuum_time(o) AS CAST(NULL AS TIMESTAMPTZ);
CREATE MACRO pg_stat_get_last_autovacuum_time(o) AS CAST(NULL AS TIMESTAMPTZ);
CREATE MACRO pg_stat_get_last_analyze_time(o) AS CAST(NULL AS TIMESTAMPTZ);
CREATE MACRO pg_stat_get_last_autoanalyze_time(o) AS CAST(NULL AS TIMESTAMPTZ);

-- Arrays (one-dimensional, lower bound 1) and set-returning helpers -----------------------------

CREATE MACRO array_upper(a, d) AS CASE WHEN d = 1 AND len(a) > 0 THEN CAST(len(a) AS INTEGER) END;
CREATE MACRO array_lower(a, d) AS CASE WHEN d = 1 AND len(a) > 0 THEN 1 END;
CREATE MACRO array_ndims(a) AS CASE WHEN len(a) > 0 THEN 1 END;
CREATE MACRO cardinality(a) AS CAST(len(a) AS INTEGER);
-- information_schema._pg_expandarray(a): one row (x, n) per element.
CREATE MACRO __pg_expandarray(a) AS
    unnest(list_transform(range(1, len(a) + 1), lambda __i: {'x': a[__i], 'n': CAST(__i AS INTEGER)}));
-- pg_options_to_table(reloptions): one row (option_name, option_value) per 'name=value' element.
CREATE MACRO pg_options_to_table(o) AS TABLE
    SELECT split_part(__o, '=', 1) AS option_name, substr(__o, strpos(__o, '=') + 1) AS option_value
    FROM (SELECT unnest(o) AS __o);
CREATE MACRO pg_get_keywords() AS TABLE
    SELECT word, catcode, barelabel, catdesc, baredesc FROM main.__keywords;
