"""Parse, bind, resolve and validate one statement against the policy.

`analyze` turns SQL text into a PrivateQuery (aggregates over one protected table), a PublicQuery
(public tables only) or a ConstantQuery (no FROM), or rejects it. Every rejection depends only on the
query text and the policy, never on data, and says what is allowed instead. Nothing here runs SQL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import ClassVar

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError

from dpproxy.errors import (
    DatatypeMismatch,
    DPProxyError,
    GroupingError,
    InvalidParameter,
    NotSupported,
    PolicyViolation,
    SyntaxProblem,
    UndefinedColumn,
    UndefinedFunction,
    UnresolvedColumn,
)
from dpproxy.policy import DEFAULT_GRID_SCALE, Policy
from dpproxy.sql import literals, postprocess
from dpproxy.sql.inline import expand_ctes, inline
from dpproxy.sql.intervals import Interval
from dpproxy.sql.public import check_public_sql, exposed_table
from dpproxy.sql.query import (
    Aggregate,
    AggregateKind,
    AnalyzedQuery,
    Component,
    ComponentKind,
    ConstantQuery,
    Finish,
    GroupKey,
    Histogram,
    OutputColumn,
    PrivateQuery,
    PublicQuery,
    SortKey,
    aggregate_placeholder,
    key_placeholder,
    output_placeholder,
)
from dpproxy.sql.relation import SchemaFacts, build_relation
from dpproxy.sql.rowexpr import Typed, bytewise_text, constant_value, row_expression
from dpproxy.sql.subqueries import Inlined, PublicRunner, expression_subqueries, inline_public_subqueries
from dpproxy.sql.types import (
    SQLGLOT_SCHEMA_TYPE,
    PgType,
    avg_result,
    from_column_type,
    from_sqlglot,
    sum_result,
)

SUPPORTED_AGGREGATES = (
    "COUNT(*), COUNT(expr), COUNT(DISTINCT expr), SUM, AVG, VAR_POP, VAR_SAMP, STDDEV_POP, STDDEV_SAMP, "
    "MIN, MAX, MEDIAN, PERCENTILE_CONT/PERCENTILE_DISC(f) WITHIN GROUP (ORDER BY x), MODE() WITHIN GROUP"
)


def parse_statement(sql: str) -> exp.Expression:
    """Parse exactly one PostgreSQL statement."""
    try:
        statements = [s for s in sqlglot.parse(sql, read="postgres") if s is not None]
    except ParseError as e:
        detail = e.errors[0]["description"] if e.errors else str(e)
        raise SyntaxProblem(
            f"syntax error: {detail}", hint="dpproxy reads PostgreSQL's SQL dialect"
        ) from None
    except sqlglot.errors.TokenError as e:
        raise SyntaxProblem(f"syntax error: {e}") from None
    if not statements:
        raise SyntaxProblem("empty query")
    if len(statements) > 1:
        raise SyntaxProblem("expected one statement, found several", hint="send statements one at a time")
    return statements[0]


def bind_parameters(tree: exp.Expression, params: Sequence[object]) -> exp.Expression:
    """Replace $1, $2, … by constants before planning, so a plan never depends on later values."""

    def substitute(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            index = int(node.this.this)
            if not 1 <= index <= len(params):
                raise InvalidParameter(
                    f"there is no parameter ${index}",
                    hint=f"the statement was given {len(params)} parameter(s)",
                )
            value = literals.constant(params[index - 1])
            # In parentheses, a number is a value wherever it stands: ORDER BY $1 sorts by a constant
            # in PostgreSQL, where ORDER BY 1 would name the first column.
            return (
                value
                if isinstance(value, exp.Paren) or not isinstance(value, exp.Literal) or value.is_string
                else exp.Paren(this=value)
            )
        if isinstance(node, exp.Placeholder):
            raise InvalidParameter("use $1, $2, … for parameters")
        return node

    if not params and not any(isinstance(n, (exp.Parameter, exp.Placeholder)) for n in tree.walk()):
        return tree
    return tree.transform(substitute, copy=True)


def parameter_count(tree: exp.Expression) -> int:
    """The highest $n the statement uses."""
    numbers = [
        int(n.this.this)
        for n in tree.walk()
        if isinstance(n, exp.Parameter) and isinstance(n.this, exp.Literal) and not n.this.is_string
    ]
    return max(numbers, default=0)


def infer_parameter_types(
    tree: exp.Expression, policy: Policy, given: Sequence[PgType | None] = ()
) -> tuple[PgType, ...]:
    """Types of $1…$n from where they stand, as PostgreSQL infers them for an untyped Parse.

    `age > $1` → the column's type; LIMIT $1 → bigint; LIKE $1 → text; arithmetic → the other
    operand's type; anything else → text. Types the client gave (non-None) are kept.
    """
    count = max(parameter_count(tree), len(given))
    types: list[PgType | None] = [given[i] if i < len(given) else None for i in range(count)]
    tables = [policy.table(t.name.lower()) for t in tree.find_all(exp.Table)]
    columns = {c.name: from_column_type(c.type) for t in tables if t is not None for c in t.columns}

    def type_of(node: exp.Expression | None) -> PgType | None:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Column):
            return columns.get(node.name.lower())
        if isinstance(node, exp.Literal) and not node.is_string:
            return postprocess.literal_type(node)
        if isinstance(node, exp.Cast):
            return from_sqlglot(node.args["to"])
        return None

    for node in tree.walk():
        if not (isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal)):
            continue
        index = int(node.this.this) - 1
        if types[index] is not None:
            continue
        parent = node.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        guess: PgType | None = None
        if isinstance(parent, (exp.Limit, exp.Offset)):
            guess = PgType.INT8
        elif isinstance(parent, (exp.Like, exp.ILike)):
            guess = PgType.TEXT
        elif isinstance(parent, (exp.Between, exp.In)):
            guess = type_of(parent.this)
        elif isinstance(parent, exp.Binary):
            other = parent.right if parent.left is node else parent.left
            guess = type_of(other)
        elif isinstance(parent, exp.Cast):
            guess = from_sqlglot(parent.args["to"])
        types[index] = guess if guess not in (None, PgType.UNKNOWN) else PgType.TEXT
    return tuple(t or PgType.TEXT for t in types)


def answer_subqueries(
    tree: exp.Expression,
    policy: Policy,
    public_columns: Mapping[str, Sequence[tuple[str, PgType]]] | None,
    run: PublicRunner | None,
) -> Inlined:
    """The statement with its IN / EXISTS / scalar subqueries over public tables answered by `run` and
    inlined as constants (placeholders when `run` is None); see dpproxy.sql.subqueries. CTEs are
    expanded first, so a subquery may read one."""
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
) -> AnalyzedQuery:
    """Validate a parsed, parameter-bound statement and reduce it to what the engine runs.

    `public_columns` gives the columns of public tables whose policy does not list them, and
    `unique_columns` the columns the database enforces unique and not NULL, per table (both read
    from the backend's schema at start).
    """
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
        return ConstantQuery(_constant_finish(tree), text)
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
    query = _PrivateAnalyzer(inline(tree), policy, facts, text).run()
    return dataclasses.replace(
        query, unit_unique=query.relation.unit_unique, sample_rows=query.relation.sample_rows
    )


def _constant_finish(tree: exp.Select) -> Finish:
    outputs = []
    for item in tree.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if node.find(exp.Column, exp.Star):
            raise UndefinedColumn(f"{node.sql('postgres')}: there is no table to read columns from")
        pg_type = postprocess.infer_type(node, {})
        outputs.append(
            OutputColumn(
                _output_name(item), node.copy(), PgType.TEXT if pg_type is PgType.UNKNOWN else pg_type
            )
        )
    return Finish(tuple(outputs), None, (), _limit(tree, "limit"), _limit(tree, "offset") or 0)


def _position(node: exp.Literal, clause: str) -> int:
    """A select-list position in GROUP BY or ORDER BY (a bound parameter is a value, not a position:
    bind_parameters writes numbers in parentheses)."""
    if not node.this.isdigit():
        raise SyntaxProblem(
            f"non-integer constant in {clause}: {node.this}", hint=f"{clause} takes positions 1, 2, …"
        )
    return int(node.this)


def _limit(tree: exp.Select, key: str) -> int | None:
    node = tree.args.get(key)
    if node is None:
        return None
    value_node = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node
    if isinstance(value_node, exp.Null):
        return None
    try:
        number = constant_value(value_node)
    except DPProxyError:
        number = None
    if not isinstance(number, Decimal) or number != number.to_integral_value() or number < 0:
        raise InvalidParameter(f"{key.upper()} must be a non-negative integer constant")
    return int(number)


def _output_name(item: exp.Expression) -> str:
    """The column name PostgreSQL would give a select-list item."""
    if isinstance(item, exp.Alias):
        return item.alias
    node = item
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Cast):
        inner = node.this
        if isinstance(inner, (exp.Column, exp.Func)):
            return _output_name(inner)
        target = from_sqlglot(node.args["to"])
        return {
            PgType.INT4: "int4",
            PgType.INT8: "int8",
            PgType.FLOAT8: "float8",
            PgType.NUMERIC: "numeric",
            PgType.TEXT: "text",
        }.get(target, "?column?")
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.WithinGroup):
        return {
            exp.PercentileCont: "percentile_cont",
            exp.PercentileDisc: "percentile_disc",
            exp.Mode: "mode",
        }.get(type(node.this), "?column?")
    if isinstance(node, exp.Func):
        names = {
            exp.Count: "count",
            exp.Sum: "sum",
            exp.Avg: "avg",
            exp.Ceil: "ceil",
            exp.Length: "length",
            exp.Substring: "substring",
            exp.TimestampTrunc: "date_trunc",
            exp.Extract: "extract",
            exp.VariancePop: "var_pop",
            exp.Variance: "var_samp",
            exp.StddevPop: "stddev_pop",
            exp.StddevSamp: "stddev_samp",
            exp.Stddev: "stddev",
        }
        return names.get(type(node), node.sql_name().lower())
    if isinstance(node, exp.Boolean):
        return "bool"
    return "?column?"


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
    try:
        from sqlglot.optimizer.annotate_types import annotate_types
        from sqlglot.optimizer.qualify import qualify

        flat = {name: cols for name, cols in schema.items() if cols}
        for table_node in rewritten.find_all(exp.Table):
            table_node.set("db", None)
        qualified = qualify(
            rewritten, schema=flat, dialect="postgres", validate_qualify_columns=True, quote_identifiers=True
        )
        annotated = annotate_types(qualified, schema=flat, dialect="postgres")
    except OptimizeError as e:
        raise UnresolvedColumn(f"{e}") from None
    for table_node in annotated.find_all(exp.Table):
        table = policy.table(table_node.name)
        if table is not None and table.schema:
            table_node.set("db", exp.to_identifier(table.schema, quoted=True))
    outputs = tuple(
        OutputColumn(_output_name(item), item, _known(from_sqlglot(item.type)))
        for item in annotated.expressions
    )
    return PublicQuery(annotated, outputs, text)


def _known(pg_type: PgType) -> PgType:
    return PgType.TEXT if pg_type is PgType.UNKNOWN else pg_type


def _ancestors(node: exp.Expression, top: exp.Expression):
    parent = node.parent
    while parent is not None and parent is not top:
        yield parent
        parent = parent.parent


class _PrivateAnalyzer:
    """Builds the PrivateQuery of a SELECT over a relation with protected tables."""

    def __init__(self, tree: exp.Select, policy: Policy, facts: SchemaFacts, text: str) -> None:
        self.tree = tree
        self.policy = policy
        self._reject_unsupported_clauses()
        self.relation = build_relation(tree, policy, facts)
        self.scope = self.relation.scope("WHERE")
        self.text = text
        self.components: list[Component] = []
        self.aggregates: list[Aggregate] = []
        self.keys: list[GroupKey] = []
        self.histograms: list[Histogram] = []

    # -- driver ------------------------------------------------------------------------------------

    def run(self) -> PrivateQuery:
        tree = self.tree
        where = tree.args.get("where")
        where_sql = None
        if where is not None:
            typed = row_expression(where.this, self.scope.in_clause("WHERE"))
            if typed.type not in (PgType.BOOL, PgType.UNKNOWN):
                raise DatatypeMismatch(f"argument of WHERE must be boolean, not {typed.type.value}")
            where_sql = typed.sql
        self._group_keys()
        items = tree.expressions
        if any(
            isinstance(i, exp.Star) or isinstance(i.this if isinstance(i, exp.Alias) else i, exp.Star)
            for i in items
        ) or any(isinstance(i, exp.Column) and isinstance(i.this, exp.Star) for i in items):
            raise PolicyViolation(
                f'SELECT * would return raw rows of the protected table "{self.relation.label}"',
                hint=f"ask for aggregates, e.g. SELECT COUNT(*) FROM {self.relation.sources[0].label}",
            )
        if not any(i.find(exp.AggFunc) for i in items) and not self.keys:
            raise PolicyViolation(
                f'this query would return raw rows of the protected table "{self.relation.label}"',
                hint=f"dpproxy only answers aggregates: {SUPPORTED_AGGREGATES}, optionally with GROUP BY",
            )
        outputs = []
        for item in items:
            node = item.this if isinstance(item, exp.Alias) else item
            expression = self._finish_expression(node, "SELECT")
            outputs.append((_output_name(item), expression))
        having = None
        if tree.args.get("having") is not None:
            having = self._finish_expression(tree.args["having"].this, "HAVING")
        order_by = self._order_by([name for name, _ in outputs])
        types = self._placeholder_types()
        typed_outputs = tuple(
            OutputColumn(name, expression, _known(postprocess.infer_type(expression, types)))
            for name, expression in outputs
        )
        if having is not None and postprocess.infer_type(having, types) not in (PgType.BOOL, PgType.UNKNOWN):
            raise DatatypeMismatch("argument of HAVING must be boolean")
        out_types = {f"__out_{i}": o.type for i, o in enumerate(typed_outputs)}
        for key in order_by:
            postprocess.infer_type(key.expression, {**types, **out_types})
        finish = Finish(
            typed_outputs, having, tuple(order_by), _limit(tree, "limit"), _limit(tree, "offset") or 0
        )
        top_k = self._top_k(finish)
        if self._answered_by_randomized_response(where_sql):
            return self._randomized_response(where_sql, finish)
        return PrivateQuery(
            relation=self.relation,
            where=where_sql,
            keys=tuple(self.keys),
            components=tuple(self.components),
            aggregates=tuple(self.aggregates),
            finish=finish,
            text=self.text,
            histograms=tuple(self.histograms),
            top_k=top_k,
        )

    def _answered_by_randomized_response(self, where: exp.Expression | None) -> bool:
        """A table that opts in answers `COUNT(DISTINCT unit) … WHERE p [GROUP BY public keys]` (or
        COUNT(*) where every row is a person) by randomized response."""
        sources = self.relation.sources
        if len(sources) != 1 or sources[0].policy is None or not sources[0].policy.randomized_response:
            return False
        if where is None or len(self.aggregates) != 1 or self.histograms:
            return False
        kind = self.aggregates[0].kind
        counts_persons = kind is AggregateKind.COUNT_UNITS or (
            kind is AggregateKind.COUNT and self.relation.row_level
        )
        if not counts_persons:
            return False
        if any(k.public_values is None for k in self.keys):
            raise NotSupported(
                f'randomized-response counts of "{self.relation.label}" need public GROUP BY keys',
                hint="group by columns with public_values, or count without GROUP BY",
            )
        return True

    def _randomized_response(self, where: exp.Expression, finish: Finish) -> PrivateQuery:
        """Every person of the table reports whether WHERE holds on one of their rows; the count is
        estimated from noisy tallies of the reports (mechanisms.RandomizedResponseCount)."""
        indicator = exp.Case().when(exp.Paren(this=where), exp.Literal.number(1)).else_(exp.Literal.number(0))
        any_units = Component(
            ComponentKind.ANY_UNITS,
            indicator,
            Interval(Decimal(0), Decimal(1)),
            0,
            identity="any_units",
            within_interval=True,
            exact_integer=True,
        )
        units = Component(ComponentKind.UNITS, identity="units")
        aggregate = Aggregate(AggregateKind.COUNT_RESPONSES, (0, 1), PgType.INT8, self.aggregates[0].text)
        return PrivateQuery(
            relation=self.relation,
            where=None,
            keys=tuple(self.keys),
            components=(any_units, units),
            aggregates=(aggregate,),
            finish=finish,
            text=self.text,
            randomized_response=True,
        )

    def _top_k(self, finish: Finish) -> tuple[int, int] | None:
        """`GROUP BY … ORDER BY <count or sum> DESC LIMIT k`: the k groups by report-noisy-top-k."""
        if not self.keys or finish.limit is None or finish.offset or not finish.order_by:
            return None
        first = finish.order_by[0]
        if not first.descending or not isinstance(first.expression, exp.Column):
            return None
        name = first.expression.name
        if name.startswith("__out_"):
            output = finish.outputs[int(name.removeprefix("__out_"))].expression
            name = output.name if isinstance(output, exp.Column) else ""
        if not name.startswith("__agg_"):
            return None
        aggregate = self.aggregates[int(name.removeprefix("__agg_"))]
        if aggregate.kind not in (
            AggregateKind.COUNT,
            AggregateKind.COUNT_UNITS,
            AggregateKind.COUNT_VALUES,
            AggregateKind.SUM,
        ):
            return None
        return aggregate.components[0], finish.limit

    def _reject_unsupported_clauses(self) -> None:
        tree = self.tree
        if tree.find(exp.Window):
            raise NotSupported(
                "window functions are not supported in private queries",
                hint="use GROUP BY with aggregates instead",
            )
        for node in tree.walk():
            if node is tree or not isinstance(node, (exp.Select, exp.Subquery, exp.Exists)):
                continue
            # Expression subqueries over public tables were answered and inlined before analysis
            # (dpproxy.sql.subqueries); whatever subquery is left must be a FROM item.
            allowed = [
                a
                for a in [node, *_ancestors(node, tree)]
                if isinstance(a, exp.Subquery) and isinstance(a.parent, (exp.From, exp.Join))
            ]
            if not allowed:
                raise NotSupported(
                    "subqueries are only supported in FROM (row-level, or grouped by the privacy unit) and "
                    "as uncorrelated IN, EXISTS or scalar subqueries over public tables",
                    hint="filter with WHERE conditions, or join the table",
                )
        if tree.args.get("distinct"):
            raise NotSupported("SELECT DISTINCT is not supported", hint="use GROUP BY with COUNT(*) instead")
        for key in ("qualify", "windows", "into", "locks", "prewhere", "connect", "sample"):
            if tree.args.get(key):
                raise NotSupported(f"{key.upper()} is not supported in private queries")
        if tree.args.get("fetch"):
            raise NotSupported("FETCH FIRST is not supported", hint="use LIMIT")

    # -- GROUP BY ----------------------------------------------------------------------------------

    def _group_keys(self) -> None:
        group = self.tree.args.get("group")
        if group is None:
            return
        for key in ("rollup", "cube", "grouping_sets"):
            if group.args.get(key):
                raise NotSupported(f"GROUP BY {key.replace('_', ' ').upper()} is not supported")
        items = self.tree.expressions
        aliases = {i.alias.lower(): i.this for i in items if isinstance(i, exp.Alias)}
        scope = self.scope.in_clause("GROUP BY")
        for node in group.expressions:
            source = node
            if isinstance(node, exp.Literal) and not node.is_string:
                position = _position(node, "GROUP BY")
                if not 1 <= position <= len(items):
                    raise InvalidParameter(f"GROUP BY position {position} is not in select list")
                item = items[position - 1]
                source = item.this if isinstance(item, exp.Alias) else item
            elif (
                isinstance(node, exp.Column)
                and not node.table
                and not any(src.column(node.name.lower()) for src in self.relation.sources)
                and node.name.lower() in aliases
            ):
                source = aliases[node.name.lower()]
            if source.find(exp.AggFunc):
                raise GroupingError("aggregate functions are not allowed in GROUP BY")
            typed = row_expression(source, scope)
            bare = source.unnest() if isinstance(source, exp.Paren) else source
            if isinstance(bare, exp.Column) and typed.uses_unit:
                raise PolicyViolation(
                    f'GROUP BY the privacy unit "{self.relation.unit_name}" would release one group '
                    "per person",
                    hint=f"group by other columns; COUNT(DISTINCT {self.relation.unit_name}) counts persons",
                )
            text = typed.sql.sql("postgres")
            if any(k.text == text for k in self.keys):
                continue
            public_values = None
            if isinstance(bare, exp.Column):
                _, column = scope.resolve(bare)
                public_values = column.public_values
            # Text keys group byte for byte: under a case-insensitive collation 'A' and 'a' would be
            # one group spelled as whichever row came first (a spelling one person could decide).
            sql = bytewise_text(typed.sql) if typed.type.is_text else typed.sql
            self.keys.append(GroupKey(sql, _known(typed.type), text, public_values))

    # -- select list, HAVING, ORDER BY ---------------------------------------------------------------

    def _placeholder_types(self) -> dict[str, PgType]:
        types = {f"__agg_{i}": a.result_type for i, a in enumerate(self.aggregates)}
        types.update({f"__key_{j}": k.type for j, k in enumerate(self.keys)})
        return types

    def _key_index(self, node: exp.Expression, clause: str) -> int | None:
        if not self.keys or node.find(exp.AggFunc):
            return None
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
            return None
        try:
            typed = row_expression(node, self.scope.in_clause(clause))
        except DPProxyError:
            return None
        text = typed.sql.sql("postgres")
        for j, key in enumerate(self.keys):
            if key.text == text:
                return j
        return None

    def _finish_expression(self, node: exp.Expression, clause: str) -> exp.Expression:
        """Replace aggregates and group keys by placeholders; reject references to raw values."""

        def substitute(n: exp.Expression) -> exp.Expression:
            if isinstance(n, (exp.AggFunc, exp.Filter, exp.WithinGroup)):
                return aggregate_placeholder(self._aggregate(n))
            j = self._key_index(n, clause)
            if j is not None:
                return key_placeholder(j)
            if isinstance(n, exp.Column):
                _, column = self.scope.in_clause(clause).resolve(n)
                if column.is_unit:
                    raise PolicyViolation(
                        f'the privacy unit "{column.name}" cannot be returned',
                        hint=f"COUNT(DISTINCT {column.name}) counts persons",
                    )
                raise GroupingError(
                    f'column "{n.sql("postgres")}" must appear in the GROUP BY clause or be used in an '
                    "aggregate function",
                    hint="dpproxy never returns raw values of a protected table",
                )
            if isinstance(n, exp.Star):
                raise PolicyViolation("SELECT * would return raw rows of a protected table")
            for child in list(n.iter_expressions()):
                replacement = substitute(child)
                if replacement is not child:
                    child.replace(replacement)
            return n

        return substitute(node.copy())

    def _order_by(self, output_names: list[str]) -> list[SortKey]:
        order = self.tree.args.get("order")
        if order is None:
            return []
        keys = []
        for ordered in order.expressions:
            node = ordered.this
            if isinstance(node, exp.Literal) and not node.is_string:
                position = _position(node, "ORDER BY")
                if not 1 <= position <= len(output_names):
                    raise InvalidParameter(f"ORDER BY position {position} is not in select list")
                expression: exp.Expression = output_placeholder(position - 1)
            elif (
                isinstance(node, exp.Column)
                and not node.table
                and node.name in output_names
                and (output_names.count(node.name) == 1)
            ):
                expression = output_placeholder(output_names.index(node.name))
            else:
                expression = self._finish_expression(node, "ORDER BY")
            keys.append(
                SortKey(expression, bool(ordered.args.get("desc")), bool(ordered.args.get("nulls_first")))
            )
        return keys

    # -- aggregates --------------------------------------------------------------------------------

    def _component(self, component: Component) -> int:
        for i, existing in enumerate(self.components):
            if existing.identity == component.identity:
                return i
        self.components.append(component)
        return len(self.components) - 1

    def _add_aggregate(self, aggregate: Aggregate) -> int:
        for i, existing in enumerate(self.aggregates):
            if existing.text == aggregate.text and existing.kind == aggregate.kind:
                return i
        self.aggregates.append(aggregate)
        return len(self.aggregates) - 1

    def _aggregate(self, node: exp.Expression) -> int:
        if isinstance(node, exp.Filter):
            raise NotSupported(
                "aggregate FILTER (WHERE …) is not supported",
                hint="write SUM(CASE WHEN … THEN 1 ELSE 0 END) or move the condition to WHERE",
            )
        if isinstance(node, exp.WithinGroup):
            return self._within_group(node)
        if isinstance(node, (exp.Min, exp.Max)):
            if node.expressions:
                raise NotSupported(f"{node.sql_name()} takes one argument here")
            alpha = Fraction(0) if isinstance(node, exp.Min) else Fraction(1)
            return self._quantile(node.this, alpha, node.sql_name().lower(), continuous=False)
        if isinstance(node, exp.Median):
            return self._quantile(node.this, Fraction(1, 2), "median", continuous=True)
        if isinstance(node, exp.Count):
            return self._count(node)
        if isinstance(node, (exp.Sum, exp.Avg)):
            return self._sum_or_avg(node)
        if type(node) in self._SPREADS:
            return self._spread(node)
        name = node.sql_name().upper() if not isinstance(node, exp.Anonymous) else node.name.upper()
        raise NotSupported(
            f"aggregate {name} is not supported yet", hint=f"supported aggregates: {SUPPORTED_AGGREGATES}"
        )

    def _count(self, node: exp.Count) -> int:
        arg = node.this
        unit = self.relation.unit_name
        if arg is None or isinstance(arg, exp.Star):
            component = self._component(Component(ComponentKind.ROWS, identity="rows"))
            return self._add_aggregate(Aggregate(AggregateKind.COUNT, (component,), PgType.INT8, "count(*)"))
        if isinstance(arg, exp.Distinct):
            # COUNT(DISTINCT (x)) is COUNT(DISTINCT x) (SQLAlchemy writes it so).
            columns = [c.unnest() if isinstance(c, exp.Paren) else c for c in arg.expressions]
            scope = self.scope.in_clause("COUNT(DISTINCT …)")
            if len(columns) == 1 and isinstance(columns[0], exp.Column):
                _, column = scope.resolve(columns[0])
                if unit is not None and column.is_unit:
                    component = self._component(Component(ComponentKind.UNITS, identity="units"))
                    return self._add_aggregate(
                        Aggregate(
                            AggregateKind.COUNT_UNITS, (component,), PgType.INT8, f"count(distinct {unit})"
                        )
                    )
            if len(columns) != 1:
                raise NotSupported("COUNT(DISTINCT …) of several expressions is not supported")
            # Another column: each person adds at most max_rows_per_unit rows to a group, hence at
            # most that many distinct values; computed over the bounded rows (row pipeline).
            typed = row_expression(columns[0], scope)
            text = typed.sql.sql("postgres")
            component = self._component(
                Component(ComponentKind.DISTINCT_VALUES, typed.sql, identity=f"distinct:{text}")
            )
            return self._add_aggregate(
                Aggregate(
                    AggregateKind.COUNT_DISTINCT,
                    (component,),
                    PgType.INT8,
                    f"count(distinct {columns[0].sql('postgres')})",
                )
            )
        typed = row_expression(arg, self.scope.in_clause("COUNT argument"))
        text = typed.sql.sql("postgres")
        component = self._component(Component(ComponentKind.VALUES, typed.sql, identity=f"values:{text}"))
        return self._add_aggregate(
            Aggregate(AggregateKind.COUNT_VALUES, (component,), PgType.INT8, f"count({arg.sql('postgres')})")
        )

    # -- exponential-mechanism aggregates -----------------------------------------------------------

    def _histogram(self, histogram: Histogram) -> int:
        for i, existing in enumerate(self.histograms):
            if existing.identity == histogram.identity:
                return i
        self.histograms.append(histogram)
        return len(self.histograms) - 1

    def _within_group(self, node: exp.WithinGroup) -> int:
        function = node.this
        order = node.expression
        keys = order.expressions if isinstance(order, exp.Order) else []
        if len(keys) != 1:
            raise NotSupported("WITHIN GROUP takes exactly one ORDER BY expression")
        ordered = keys[0]
        descending = bool(ordered.args.get("desc"))
        argument = ordered.this
        if isinstance(function, exp.Mode):
            return self._mode(argument)
        if isinstance(function, (exp.PercentileCont, exp.PercentileDisc)):
            fraction = constant_value(function.this)
            if not isinstance(fraction, Decimal) or not 0 <= fraction <= 1:
                raise InvalidParameter(
                    "the fraction of percentile_cont/percentile_disc must be a constant between 0 and 1"
                )
            alpha = Fraction(str(fraction))
            if descending:
                alpha = 1 - alpha
            continuous = isinstance(function, exp.PercentileCont)
            name = "percentile_cont" if continuous else "percentile_disc"
            return self._quantile(argument, alpha, name, continuous=continuous)
        raise NotSupported(
            f"{function.sql_name()}() WITHIN GROUP is not supported",
            hint="supported: percentile_cont, percentile_disc, mode",
        )

    # Quantile candidates: at most this many points over a column's range (the exponential
    # mechanism's error grows only with the log of their number).
    MAX_CANDIDATES: ClassVar[int] = 1000

    def _quantile(self, arg: exp.Expression, alpha: Fraction, name: str, *, continuous: bool) -> int:
        """MIN (α = 0), MAX (α = 1), MEDIAN and percentiles per group, by the exponential mechanism
        over the argument's bounded range (mechanisms.QuantileSpec)."""
        typed, interval, scale, _within = self._bounded_argument(arg, name.upper())
        lo, hi = interval.on_grid(scale)
        candidates = max(1, min(self.MAX_CANDIDATES, hi - lo + 1))
        text = typed.sql.sql("postgres")
        histogram = self._histogram(
            Histogram(
                typed.sql,
                candidates,
                interval,
                scale,
                identity=f"range:{scale}:{candidates}:{text}",
                double=typed.double,
                exact_integer=typed.exact_integer,
            )
        )
        result = PgType.FLOAT8 if continuous else typed.type
        return self._add_aggregate(
            Aggregate(
                AggregateKind.QUANTILE,
                (),
                result,
                f"{name}({alpha}:{arg.sql('postgres')})",
                interval,
                scale,
                histogram=histogram,
                alpha=alpha,
            )
        )

    def _mode(self, arg: exp.Expression) -> int:
        """MODE() WITHIN GROUP (ORDER BY x) by report-noisy-max over x's public values, or over a
        bounded integer column's values when there are at most MAX_CANDIDATES of them."""
        scope = self.scope.in_clause("MODE argument")
        typed = row_expression(arg, scope)
        if typed.uses_unit:
            raise PolicyViolation(f'the privacy unit "{self.relation.unit_name}" cannot be a MODE argument')
        bare = arg.unnest() if isinstance(arg, exp.Paren) else arg
        column = scope.resolve(bare)[1] if isinstance(bare, exp.Column) else None
        text = typed.sql.sql("postgres")
        if column is not None and column.public_values is not None:
            histogram = Histogram(
                typed.sql, len(column.public_values), values=column.public_values, identity=f"values:{text}"
            )
        elif typed.type.is_integer and typed.interval is not None and typed.interval.finite:
            lo, hi = typed.interval.on_grid(0)
            if hi - lo + 1 > self.MAX_CANDIDATES:
                raise NotSupported(
                    f"MODE over {arg.sql('postgres')} has {hi - lo + 1} possible values; at most "
                    f"{self.MAX_CANDIDATES} are supported",
                    hint="declare public_values for the column, or narrow its bounds",
                )
            histogram = Histogram(
                typed.sql,
                hi - lo + 1,
                typed.interval,
                0,
                identity=f"range:0:{hi - lo + 1}:{text}",
                double=typed.double,
                exact_integer=typed.exact_integer,
            )
        else:
            raise NotSupported(
                f"MODE() over {arg.sql('postgres')} needs the column's public_values, or a bounded "
                "integer column",
                hint="candidates must not come from the data: declare public_values in the policy",
            )
        index = self._histogram(histogram)
        return self._add_aggregate(
            Aggregate(AggregateKind.MODE, (), _known(typed.type), f"mode({text})", histogram=index)
        )

    def _bounded_argument(self, arg: exp.Expression, name: str) -> tuple[Typed, Interval, int, bool]:
        """The checked argument of an aggregate that needs bounds: its range, grid scale, and whether
        it arrives already clipped to that range (a bounded column)."""
        if isinstance(arg, exp.Distinct):
            raise NotSupported(f"{name}(DISTINCT …) is not supported", hint=f"use {name}(expr)")
        self._check_summable(arg, name)
        typed = row_expression(arg, self.scope.in_clause(f"{name} argument"))
        if not typed.type.is_number:
            raise UndefinedFunction(
                f"function {name.lower()}({typed.type.value}) does not exist",
                hint=f"{name} needs a number",
            )
        if typed.uses_unit:
            raise PolicyViolation(
                f'the privacy unit "{self.relation.unit_name}" cannot be aggregated with {name}'
            )
        if typed.interval is not None and not typed.interval.finite:
            raise PolicyViolation(
                f"{name}({arg.sql('postgres')}) has no upper or lower bound (a count per person has none "
                "until it is clamped)",
                hint=f"clamp it, e.g. {name}(LEAST({arg.sql('postgres')}, 20))",
            )
        if typed.interval is None:
            raise PolicyViolation(
                f"{name}({arg.sql('postgres')}) has no bounds: the policy gives no lower/upper for "
                "its columns",
                hint="ask the data owner to declare lower and upper bounds for the column",
            )
        scale = self._grid_scale(arg, typed)
        bare = arg.unnest() if isinstance(arg, exp.Paren) else arg
        # A bounded column arrives clipped to exactly its bounds: no second clip is needed.
        return typed, typed.interval, scale, isinstance(bare, exp.Column)

    def _sum_or_avg(self, node: exp.Expression) -> int:
        name = "SUM" if isinstance(node, exp.Sum) else "AVG"
        arg = node.this
        typed, interval, scale, within = self._bounded_argument(arg, name)
        text = typed.sql.sql("postgres")
        if isinstance(node, exp.Sum):
            component = self._component(
                Component(
                    ComponentKind.SUM,
                    typed.sql,
                    interval,
                    scale,
                    identity=f"sum:{scale}:{text}",
                    within_interval=within,
                    double=typed.double,
                    exact_integer=typed.exact_integer,
                )
            )
            return self._add_aggregate(
                Aggregate(
                    AggregateKind.SUM,
                    (component,),
                    sum_result(typed.type),
                    f"sum({arg.sql('postgres')})",
                    interval,
                    scale,
                )
            )
        lo, hi = interval.on_grid(scale)
        centre = (lo + hi) // 2
        values, centred = self._values_and_centred_sum(typed, interval, scale, centre, within)
        return self._add_aggregate(
            Aggregate(
                AggregateKind.AVG,
                (centred, values),
                avg_result(typed.type),
                f"avg({arg.sql('postgres')})",
                interval,
                scale,
                centre,
            )
        )

    def _values_and_centred_sum(
        self, typed: Typed, interval: Interval, scale: int, centre: int, within: bool
    ) -> tuple[int, int]:
        """The count of non-null values and their sum centred on `centre` (on the grid of `scale`)."""
        sql = typed.sql
        text = sql.sql("postgres")
        values = self._component(Component(ComponentKind.VALUES, sql, identity=f"values:{text}"))
        centred = self._component(
            Component(
                ComponentKind.CENTRED_SUM,
                sql,
                interval,
                scale,
                centre,
                identity=f"centred:{scale}:{centre}:{text}",
                within_interval=within,
                double=typed.double,
                exact_integer=typed.exact_integer,
            )
        )
        return values, centred

    _SPREADS: ClassVar[dict[type[exp.Expression], tuple[AggregateKind, str]]] = {
        exp.VariancePop: (AggregateKind.VAR_POP, "var_pop"),
        exp.Variance: (AggregateKind.VAR_SAMP, "var_samp"),
        exp.StddevPop: (AggregateKind.STDDEV_POP, "stddev_pop"),
        exp.StddevSamp: (AggregateKind.STDDEV_SAMP, "stddev_samp"),
        exp.Stddev: (AggregateKind.STDDEV_SAMP, "stddev_samp"),
    }

    def _spread(self, node: exp.Expression) -> int:
        """VAR/STDDEV from a count, a centred sum and a centred sum of squares, on one grid whose
        squares stay exact in bigint: Var = Σ(x−c)²/n − (Σ(x−c)/n)²."""
        kind, name = self._SPREADS[type(node)]
        arg = node.this
        typed, interval, scale, within = self._bounded_argument(arg, name.upper())
        # Squares of grid values, times the rows one person may add, must stay far inside bigint.
        while True:
            lo, hi = interval.on_grid(scale)
            centre = (lo + hi) // 2
            half_width = max(hi - centre, centre - lo)
            if scale == 0 or self.relation.max_rows * half_width * half_width < 2**52:
                break
            scale -= 1
        if self.relation.max_rows * half_width * half_width >= 2**52:
            raise NotSupported(
                f"the bounds of {arg.sql('postgres')} are too wide for {name.upper()}",
                hint="declare tighter lower/upper bounds in the policy",
            )
        text = typed.sql.sql("postgres")
        values, centred = self._values_and_centred_sum(typed, interval, scale, centre, within)
        squares = self._component(
            Component(
                ComponentKind.CENTRED_SQUARES,
                typed.sql,
                interval,
                scale,
                centre,
                identity=f"squares:{scale}:{centre}:{text}",
                within_interval=within,
                double=typed.double,
                exact_integer=typed.exact_integer,
            )
        )
        return self._add_aggregate(
            Aggregate(
                kind,
                (squares, centred, values),
                PgType.FLOAT8 if typed.type.is_float else PgType.NUMERIC,
                f"{name}({arg.sql('postgres')})",
                interval,
                scale,
                centre,
            )
        )

    def _check_summable(self, arg: exp.Expression, name: str) -> None:
        scope = self.scope.in_clause(f"{name} argument")
        for column_node in arg.find_all(exp.Column):
            source, column = scope.resolve(column_node)
            if not getattr(column, "summable", True):
                raise PolicyViolation(
                    f'column "{column.name}" of table "{source.label}" may not be summed or averaged '
                    "(summable: false in the policy)",
                    hint="it can still be filtered on, grouped by and counted",
                )

    def _grid_scale(self, arg: exp.Expression, typed: Typed) -> int:
        """Digits of the fixed-point grid a sum is computed on: sums are exact integer sums."""
        if typed.type.is_integer:
            return 0
        scope = self.scope.in_clause("aggregate argument")
        scales = [
            column.grid_scale
            for _, column in (scope.resolve(c) for c in arg.find_all(exp.Column))
            if column.fractional
        ]
        scale = max(scales, default=DEFAULT_GRID_SCALE)
        assert typed.interval is not None
        # Every grid value, times the rows one unit may add, must stay far inside a 64-bit integer.
        magnitude = max(typed.interval.magnitude, Decimal(1)) * self.relation.max_rows
        while scale > 0 and magnitude.scaleb(scale) >= Decimal(2) ** 52:
            scale -= 1
        if magnitude >= Decimal(2) ** 52:
            raise NotSupported(
                f"the bounds of {arg.sql('postgres')} are too wide to sum exactly",
                hint="declare tighter lower/upper bounds in the policy",
            )
        return scale
