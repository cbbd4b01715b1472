"""PostgreSQL functions as the typer needs them: what they return and take, what PostgreSQL names
their result columns, which are table functions; and small readers of sqlglot's call nodes.

Tables and lookups only: this module never types a whole query (typer.py) or rewrites one
(translator.py), and which functions are refused is refusals.py's.
"""

from __future__ import annotations

from sqlglot import exp

from dpproxy.wire.catalog.pg_types import REG_TYPES


def names_in(text: str) -> list[str]:
    """The names of a whitespace-separated list."""
    return text.split()


RETURNS: dict[str, int] = {
    **dict.fromkeys(
        names_in(
            """version format_type pg_get_expr pg_get_constraintdef pg_get_indexdef pg_get_viewdef
            pg_get_triggerdef pg_get_functiondef pg_get_function_arguments pg_get_function_result
            pg_get_function_identity_arguments pg_get_statisticsobjdef_columns pg_get_partkeydef
            pg_get_ruledef pg_get_serial_sequence obj_description col_description shobj_description
            current_setting set_config pg_size_pretty array_to_string quote_ident quote_literal
            quote_nullable string_agg listagg upper lower btrim ltrim rtrim trim substr substring replace
            concat concat_ws left right lpad rpad initcap repeat reverse split_part regexp_replace
            translate md5 to_char format pg_tablespace_location textcat chr encode host text"""
        ),
        25,
    ),
    **dict.fromkeys(
        names_in(
            """current_database current_schema current_user session_user current_role user
            current_catalog pg_get_userbyid pg_encoding_to_char pg_client_encoding getdatabaseencoding"""
        ),
        19,
    ),
    **dict.fromkeys(
        names_in(
            """pg_table_is_visible pg_type_is_visible pg_function_is_visible pg_collation_is_visible
            pg_opclass_is_visible pg_operator_is_visible pg_conversion_is_visible pg_opfamily_is_visible
            pg_ts_config_is_visible pg_ts_dict_is_visible pg_ts_parser_is_visible pg_ts_template_is_visible
            pg_statistics_obj_is_visible has_table_privilege has_schema_privilege has_database_privilege
            has_column_privilege has_any_column_privilege has_function_privilege has_sequence_privilege
            has_type_privilege has_language_privilege has_tablespace_privilege
            has_foreign_data_wrapper_privilege has_server_privilege pg_has_role pg_is_in_recovery
            pg_relation_is_publishable pg_is_other_temp_schema pg_jit_available row_security_active
            bool_and bool_or every regexp_like starts_with"""
        ),
        16,
    ),
    **dict.fromkeys(
        names_in(
            """pg_backend_pid array_upper array_lower array_length cardinality array_ndims
            generate_subscripts length char_length character_length octet_length position strpos
            inet_server_port inet_client_port pg_char_to_encoding pg_encoding_max_length ascii"""
        ),
        23,
    ),
    **dict.fromkeys(
        names_in(
            """pg_table_size pg_relation_size pg_total_relation_size pg_indexes_size pg_database_size
            count row_number rank dense_rank ntile pg_stat_get_numscans
            pg_stat_get_tuples_returned pg_stat_get_tuples_fetched pg_stat_get_tuples_inserted
            pg_stat_get_tuples_updated pg_stat_get_tuples_deleted pg_stat_get_tuples_hot_updated
            pg_stat_get_live_tuples pg_stat_get_dead_tuples pg_stat_get_blocks_fetched pg_stat_get_blocks_hit
            pg_stat_get_mod_since_analyze pg_stat_get_ins_since_vacuum pg_stat_get_vacuum_count
            pg_stat_get_analyze_count pg_stat_get_autovacuum_count pg_stat_get_autoanalyze_count"""
        ),
        20,
    ),
    **dict.fromkeys(
        names_in("json_build_object json_object json_agg to_json row_to_json array_to_json"), 114
    ),
    **dict.fromkeys(names_in("jsonb_build_object jsonb_agg to_jsonb"), 3802),
    **dict.fromkeys(
        names_in(
            """now statement_timestamp transaction_timestamp clock_timestamp pg_postmaster_start_time
            pg_conf_load_time pg_stat_get_last_vacuum_time pg_stat_get_last_autovacuum_time
            pg_stat_get_last_analyze_time pg_stat_get_last_autoanalyze_time"""
        ),
        1184,
    ),
    **dict.fromkeys(names_in("regexp_match regexp_split_to_array string_to_array parse_ident"), 1009),
    **dict.fromkeys(names_in("inet_server_addr inet_client_addr"), 869),
    "current_schemas": 1003,
    "to_regtype": 2206,
    "pg_typeof": 2206,
    "to_regclass": 2205,
    "pg_partition_ancestors": 2205,
    "pg_partition_root": 2205,
    "to_regproc": 24,
    "to_regprocedure": 2202,
    "to_regnamespace": 4089,
    "to_regrole": 4096,
    "pg_my_temp_schema": 26,
    "acldefault": 1034,  # aclitem[]
    **{f"__to_{name}": oid for oid, name in REG_TYPES.items()},
}

# Argument types, for parameters standing as a function's argument ($n with no type of its own).
ARGUMENTS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        names_in("to_regtype to_regclass to_regproc to_regnamespace to_regrole to_regprocedure"), (25,)
    ),
    **dict.fromkeys(names_in("quote_ident quote_literal upper lower length"), (25,)),
    **dict.fromkeys(names_in("pg_table_size pg_relation_size pg_total_relation_size"), (2205,)),
    **dict.fromkeys(names_in("array_upper array_lower array_length"), (2277, 23)),
    **dict.fromkeys(names_in("pg_table_is_visible pg_type_is_visible pg_get_userbyid"), (26,)),
    "current_setting": (25, 16),
    "format_type": (26, 23),
    "pg_get_expr": (194, 26, 16),
    "pg_get_constraintdef": (26, 16),
    "pg_get_indexdef": (26, 23, 16),
    "pg_get_viewdef": (26, 16),
    "obj_description": (26, 19),
    "col_description": (26, 23),
    "shobj_description": (26, 19),
    "pg_encoding_to_char": (23,),
    "generate_subscripts": (2277, 23),
    "generate_series": (23, 23, 23),
    "pg_size_pretty": (20,),
    "has_table_privilege": (25, 25, 25),
    "has_schema_privilege": (25, 25, 25),
    "pg_get_serial_sequence": (25, 25),
    "current_schemas": (16,),
    "array_to_string": (2277, 25, 25),
}

# sqlglot's classes for functions → the name PostgreSQL gives them (return types, column names).
_FUNCTION_NAMES: dict[type[exp.Expression], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Max: "max",
    exp.Min: "min",
    exp.ArrayAgg: "array_agg",
    exp.GroupConcat: "string_agg",
    exp.Coalesce: "coalesce",
    exp.Nullif: "nullif",
    exp.Greatest: "greatest",
    exp.Least: "least",
    exp.Upper: "upper",
    exp.Lower: "lower",
    exp.Length: "length",
    exp.Substring: "substring",
    exp.Trim: "btrim",
    exp.Concat: "concat",
    exp.ConcatWs: "concat_ws",
    exp.RowNumber: "row_number",
    exp.Unnest: "unnest",
    exp.CurrentUser: "current_user",
    exp.SessionUser: "session_user",
    exp.CurrentSchema: "current_schema",
    exp.CurrentCatalog: "current_catalog",
    exp.CurrentVersion: "version",
    exp.CurrentTimestamp: "now",
    exp.CurrentDate: "current_date",
    exp.ExplodingGenerateSeries: "generate_series",
    exp.GenerateSeries: "generate_series",
    exp.LogicalAnd: "bool_and",
    exp.LogicalOr: "bool_or",
    exp.ArrayToString: "array_to_string",
    exp.Round: "round",
    exp.Abs: "abs",
    exp.Left: "left",
    exp.Right: "right",
    exp.StrPosition: "strpos",
    exp.RegexpReplace: "regexp_replace",
    exp.Replace: "replace",
    exp.Pad: "lpad",
    exp.Initcap: "initcap",
    exp.JSONObject: "json_build_object",
    exp.ToChar: "to_char",
    exp.SplitPart: "split_part",
    exp.ArraySize: "array_length",
    exp.StringToArray: "string_to_array",
    exp.Format: "format",
}

# Functions PostgreSQL reads as relations in FROM (the others are one-row relations there).
_TABLE_FUNCTIONS = frozenset(
    names_in(
        """generate_series unnest generate_subscripts pg_get_keywords __pg_expandarray json_each
        json_each_text jsonb_each jsonb_each_text regexp_matches json_array_elements jsonb_array_elements
        pg_options_to_table aclexplode"""
    )
)

PREDICATES = (
    exp.Predicate,
    exp.Connector,
    exp.Not,
    exp.Exists,
    exp.In,
    exp.Between,
    exp.Is,
    exp.Any,
    exp.All,
    exp.RegexpLike,
    exp.RegexpILike,
    exp.Like,
    exp.ILike,
    exp.SimilarTo,
)


def function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    for cls in type(node).__mro__:
        if cls in _FUNCTION_NAMES:
            return _FUNCTION_NAMES[cls]
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def is_table_function(node: exp.Expression) -> bool:
    if isinstance(node, (exp.Unnest, exp.ExplodingGenerateSeries, exp.GenerateSeries)):
        return True
    return (function_name(node) or "") in _TABLE_FUNCTIONS


def call_arguments(node: exp.Expression) -> list[exp.Expression]:
    return list(node.expressions) if isinstance(node, exp.Anonymous) else list(node.iter_expressions())


def ident(node: exp.Expression | None) -> str:
    """An identifier as PostgreSQL folds it: unquoted to lower case."""
    if isinstance(node, exp.Identifier):
        return node.this if node.quoted else node.this.lower()
    return node.name.lower() if node is not None else ""


def param_index(node: exp.Parameter) -> int:
    value = node.this
    return int(value.this if isinstance(value, exp.Literal) else str(value))
