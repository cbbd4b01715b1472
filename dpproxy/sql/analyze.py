"""Analyze one statement against the policy: a PrivateQuery (aggregates over protected tables), a
PublicQuery (public tables only), a ConstantQuery (no FROM), an EmptyQuery (a zero-row probe over
protected tables: dpproxy.sql.probes), or a refusal.

`analyze` takes a parsed statement whose parameters are bound (dpproxy.sql.statement) and whose
subqueries over public tables are answered (`answer_subqueries`); private queries go to the
analyzer of dpproxy.sql.private. Every rejection depends only on the query text and the policy,
never on data, and says what is allowed instead. Nothing here runs SQL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import OptimizeError

from dpproxy.errors import NotSupported, PolicyViolation, UndefinedColumn, UnresolvedColumn
from dpproxy.policy import Policy
from dpproxy.sql import postprocess
from dpproxy.sql.aggregates import known_type
from dpproxy.sql.bounds import contribution_bounds
from dpproxy.sql.folding import fold_constants
from dpproxy.sql.inline import expand_ctes, inline
from dpproxy.sql.names import qualify_names
from dpproxy.sql.private import PrivateAnalyzer
from dpproxy.sql.probes import EmptyQuery, distinct_as_group_by, empty_query, existence_probe
from dpproxy.sql.public import check_public_sql, exposed_table
from dpproxy.sql.query import AnalyzedQuery, ConstantQuery, OutputColumn, PostProcessing, PublicQuery
from dpproxy.sql.relation import SchemaFacts
from dpproxy.sql.select_list import limit_of, output_name, repeated_name
from dpproxy.sql.stars import expand_subquery_stars
from dpproxy.sql.statement import bind_parameters, infer_parameter_types, parameter_count, parse_statement
from dpproxy.sql.subqueries import Inlined, PublicRunner, expression_subqueries, inline_public_subqueries
from dpproxy.sql.types import SQLGLOT_SCHEMA_TYPE, PgType, from_column_type, from_sqlglot

__all__ = [
    "analyze",
    "analyze_public",
    "answer_subqueries",
    "bind_parameters",
    "infer_parameter_types",
    "parameter_count",
    "parse_statement",
]


def answer_subqueries(
    tree: exp.Expression,
    policy: Policy,
    public_columns: Mapping[str, Sequence[tuple[str, PgType]]] | None,
    run: PublicRunner | None,
    database: str | None = None,
) -> Inlined:
    """The statement with its IN / EXISTS / scalar subqueries over public tables answered by `run` and
    inlined as constants (placeholders when `run` is None); see dpproxy.sql.subqueries. CTEs are
    expanded first, so a subquery may read one. Qualified names are resolved first (`qualify_names`;
    `database` is the served database's name, when known)."""
    tree = fold_constants(qualify_names(tree, policy, database))
    tree = expand_subquery_stars(tree, policy, public_columns or {}, database)
    if not expression_subqueries(tree):
        return Inlined(tree, 0, False)
    return inline_public_subqueries(
        expand_ctes(tree),
        policy,
        lambda select: analyze_public(select, policy, public_columns or {}),
        run,
    )


def analyze(
    tree: exp.Expression,
    policy: Policy,
    public_columns: Mapping[str, Sequence[tuple[str, PgType]]] | None = None,
    unique_columns: Mapping[str, Collection[str]] | None = None,
    database: str | None = None,
    *,
    probes: bool = True,
    fetch_key_values: PublicRunner | None = None,
) -> AnalyzedQuery | EmptyQuery:
    """Validate a parsed, parameter-bound statement and reduce it to what the engine runs.

    `public_columns` gives the columns of public tables whose policy does not list them, and
    `unique_columns` the columns the database enforces unique and not NULL, per table (both read
    from the backend's schema at start); `database` the served database's name (what
    `current_database()` answers), which a `db.schema.table` name must give. Functions of
    constants (to_date('2020-01-01', 'YYYY-MM-DD'), now(), current_date - 30) are folded into
    constants and aggregate FILTERs rewritten first (dpproxy.sql.folding).
    `fetch_key_values` reads a public table's distinct values of a GROUP BY key joined to it
    (dpproxy.sql.public_keys); None (no backend) leaves such keys to partition selection.
    """
    tree = fold_constants(qualify_names(tree, policy, database))
    if isinstance(tree, (exp.Union, exp.Intersect, exp.Except)):
        raise NotSupported(
            "set operations (UNION, INTERSECT, EXCEPT) are not supported",
            hint="send each SELECT as its own query",
        )
    if not isinstance(tree, exp.Select):
        if isinstance(
            tree,
            (
                exp.Insert,
                exp.Update,
                exp.Delete,
                exp.Create,
                exp.Drop,
                exp.Alter,
                exp.Merge,
                exp.TruncateTable,
                exp.Copy,
            ),
        ):
            raise PolicyViolation("dpproxy answers SELECT queries only; the data cannot be modified")
        raise NotSupported(
            f"{tree.key.upper()} statements are not supported",
            hint="dpproxy answers SELECT queries with aggregates",
        )
    text = tree.sql("postgres")
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None:
        if tree.args.get("where") or tree.args.get("group") or tree.args.get("with_"):
            raise NotSupported("WHERE, GROUP BY and WITH need a FROM clause")
        return ConstantQuery(_constant_post_processing(tree), text)
    facts = SchemaFacts(public_columns or {}, unique_columns or {})
    ctes = {c.alias.lower() for c in tree.find_all(exp.CTE)}
    read = [
        exposed_table(t, policy)
        for t in tree.find_all(exp.Table)
        if isinstance(t.parent, (exp.From, exp.Join))
        and not (t.args.get("db") is None and t.name.lower() in ctes)
    ]
    if all(table.public for table in read):
        if ctes:
            raise NotSupported("WITH over public tables only is not supported", hint="write a plain SELECT")
        return analyze_public(tree, policy, public_columns or {}, text)
    if probes:
        # A probe (no rows by its text alone) is answered with its columns only; see sql/probes.py.
        def inner(select: exp.Select) -> AnalyzedQuery | EmptyQuery:
            return analyze(select, policy, public_columns, unique_columns, database, probes=False)

        empty = empty_query(tree, policy, facts, inner)
        if empty is not None:
            return empty
        exists = existence_probe(tree, policy, facts, inner)
        if exists is not None:  # one row of its constants, whatever the data (sql/probes.py)
            return ConstantQuery(_constant_post_processing(exists), text)
    query = PrivateAnalyzer(inline(distinct_as_group_by(tree)), policy, facts, text, fetch_key_values).run()
    query = dataclasses.replace(
        query, unit_unique=query.relation.unit_unique, sample_rows=query.relation.sample_rows
    )
    return dataclasses.replace(query, bounds=contribution_bounds(query))


def _constant_post_processing(tree: exp.Select) -> PostProcessing:
    outputs = []
    for item in tree.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if node.find(exp.Column, exp.Star):
            raise UndefinedColumn(f"{node.sql('postgres')}: there is no table to read columns from")
        pg_type = postprocess.infer_type(node, {})
        outputs.append(
            OutputColumn(
                output_name(item), node.copy(), PgType.TEXT if pg_type is PgType.UNKNOWN else pg_type
            )
        )
    return PostProcessing(tuple(outputs), None, (), limit_of(tree, "limit"), limit_of(tree, "offset") or 0)


def analyze_public(
    tree: exp.Select,
    policy: Policy,
    public_columns: Mapping[str, Sequence[tuple[str, PgType]]],
    text: str | None = None,
) -> PublicQuery:
    """A SELECT over public tables only, qualified and typed against their columns: a column that is
    not one of its tables' (a typo, or a name from an enclosing query) is 42703."""
    text = tree.sql("postgres") if text is None else text
    check_public_sql(tree, policy)
    schema: dict[str, dict[str, str]] = {}
    rewritten = tree.copy()
    for table_node in rewritten.find_all(exp.Table):
        table = exposed_table(table_node, policy)
        columns: Sequence[tuple[str, PgType]] = [
            (c.name, from_column_type(c.type)) for c in table.columns
        ] or public_columns.get(table.name, ())
        if not columns:
            raise UndefinedColumn(
                f'the columns of public table "{table.name}" are not known',
                hint="list them in the policy, or give a backend so dpproxy can read them",
            )
        schema[table.name] = {name: SQLGLOT_SCHEMA_TYPE.get(t, "TEXT") for name, t in columns}
        table_node.set("db", exp.to_identifier(table.schema) if table.schema else None)
        if table.schema:
            schema.setdefault(table.schema, {})
    flat = {name: cols for name, cols in schema.items() if cols}
    for table_node in rewritten.find_all(exp.Table):
        table_node.set("db", None)
    annotated, outputs = typed_select(rewritten, flat)
    for table_node in annotated.find_all(exp.Table):
        table = policy.table(table_node.name)
        if table is not None and table.schema:
            table_node.set("db", exp.to_identifier(table.schema, quoted=True))
    return PublicQuery(annotated, outputs, text)


def _duplicate_subquery_column(select: exp.Select) -> str | None:
    """What a refusal says of a subquery with two columns of one name (None: there is none)."""
    for subquery in select.find_all(exp.Subquery):
        body = subquery.this
        if not isinstance(body, exp.Select):
            continue
        twice = repeated_name(output_name(item) for item in body.expressions)
        if twice is not None:
            return f'subquery {subquery.alias or "(unnamed)"} has two columns named "{twice}"'
    return None


def _postgres_sum(annotator: Any, node: exp.Expression) -> exp.Expression:
    """SUM's type as PostgreSQL gives it: bigint of smallint and integer, numeric of bigint and
    numeric, the float's own of floats. sqlglot's is the argument's, so `n / SUM(n) OVER ()` of a
    bigint count divided integers (0 where PostgreSQL gives 0.37)."""
    argument = node.this.type if node.this is not None else None
    if argument is not None and argument.is_type(*exp.DataType.INTEGER_TYPES):
        small = argument.is_type(exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.TINYINT)
        return annotator._set_type(node, exp.DataType.Type.BIGINT if small else exp.DataType.Type.DECIMAL)
    return annotator._annotate_by_args(node, "this", "expressions", promote=True)


_POSTGRES_TYPES = {
    **Dialect.get_or_raise("postgres").EXPRESSION_METADATA,
    exp.Sum: {"annotator": _postgres_sum},
}


def typed_select(
    select: exp.Select, schema: Mapping[str, Mapping[str, str]]
) -> tuple[exp.Select, tuple[OutputColumn, ...]]:
    """`select` qualified and typed against `schema` (table → column → sqlglot type), with its
    output columns named as PostgreSQL names them: a column none of its tables has is 42703."""
    # Names as PostgreSQL gives them (`count`, `avg`), taken before qualify aliases unnamed items
    # `_col_1`…; with a `*` the expanded columns name themselves.
    stars = any(item.find(exp.Star) is not None for item in select.expressions if not item.find(exp.Func))
    written_names = None if stars else [output_name(item) for item in select.expressions]
    try:
        from sqlglot.optimizer.annotate_types import annotate_types
        from sqlglot.optimizer.qualify import qualify

        qualified = qualify(
            select,
            schema=dict(schema),
            dialect="postgres",
            validate_qualify_columns=True,
            quote_identifiers=True,
        )
        annotated = annotate_types(
            qualified, schema=dict(schema), dialect="postgres", expression_metadata=_POSTGRES_TYPES
        )
    except OptimizeError as e:
        raise UnresolvedColumn(f"{e}") from None
    except AssertionError:
        # sqlglot's qualify asserts on what it cannot expand (found by the random language batch:
        # `SELECT * FROM (SELECT COUNT(*) AS n, COUNT(*) AS n …) w ORDER BY 1`): refused, never a crash.
        raise NotSupported(
            _duplicate_subquery_column(select) or "the columns of this statement could not be resolved",
            hint="name each column of a subquery with AS, and select them by name",
        ) from None
    names = (
        written_names
        if written_names is not None and len(written_names) == len(annotated.expressions)
        else None
    )
    outputs = tuple(
        OutputColumn(
            names[i] if names is not None else output_name(item), item, known_type(from_sqlglot(item.type))
        )
        for i, item in enumerate(annotated.expressions)
    )
    return annotated, outputs  # type: ignore[return-value]
