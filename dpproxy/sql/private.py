"""The analyzer of private queries: from a SELECT over protected tables to a PrivateQuery — the
relation read, the WHERE condition, the group keys, the aggregates (dpproxy.sql.aggregates) and the
post-processing over released values (select list, HAVING, ORDER BY, LIMIT). Every rejection depends
on the query text and the policy only. Nothing here runs SQL."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import (
    AmbiguousColumn,
    DatatypeMismatch,
    DPProxyError,
    GroupingError,
    InvalidParameter,
    NotSupported,
    PolicyViolation,
)
from dpproxy.policy import Policy
from dpproxy.sql import postprocess
from dpproxy.sql.aggregates import SUPPORTED_AGGREGATES, AggregateRules, known_type
from dpproxy.sql.intervals import Interval
from dpproxy.sql.postprocess import intervals
from dpproxy.sql.probes import aggregate_view
from dpproxy.sql.public_keys import PublicKeys, PublicRunner
from dpproxy.sql.query import (
    Aggregate,
    AggregateKind,
    Component,
    ComponentKind,
    GroupKey,
    Histogram,
    OutputColumn,
    PostProcessing,
    PrivateQuery,
    SortKey,
    aggregate_placeholder,
    key_placeholder,
    output_placeholder,
)
from dpproxy.sql.relation import SchemaFacts, build_relation
from dpproxy.sql.rowexpr import bytewise_text, row_condition, row_expression
from dpproxy.sql.scope import refuse_output_alias
from dpproxy.sql.select_list import limit_of, output_name, select_position
from dpproxy.sql.types import PgType


def _ancestors(node: exp.Expression, top: exp.Expression):
    parent = node.parent
    while parent is not None and parent is not top:
        yield parent
        parent = parent.parent


class PrivateAnalyzer(AggregateRules):
    """Builds the PrivateQuery of a SELECT over a relation with protected tables."""

    def __init__(
        self,
        tree: exp.Select,
        policy: Policy,
        facts: SchemaFacts,
        text: str,
        fetch_key_values: PublicRunner | None = None,
    ) -> None:
        self.tree = tree
        self.policy = policy
        # Reads a public table's distinct values of a GROUP BY key (None: no backend, Describe).
        self.fetch_key_values = fetch_key_values
        self._reject_unsupported_clauses()
        self.relation = build_relation(tree, policy, facts)
        self.scope = self.relation.scope("WHERE")
        self.text = text
        self.components: list[Component] = []
        self.aggregates: list[Aggregate] = []
        self.keys: list[GroupKey] = []
        self.histograms: list[Histogram] = []
        # What each placeholder stands for, as written: messages about post-processing name it.
        self.originals: dict[str, exp.Expression] = {}

    def run(self) -> PrivateQuery:
        tree = self.tree
        intervals.refuse_misplaced(tree)
        where = tree.args.get("where")
        where_sql = None
        if where is not None:
            where_sql = row_condition(where.this, self.scope.in_clause("WHERE")).sql
        self._group_keys()
        items = tree.expressions
        if any(
            isinstance(i, exp.Star) or isinstance(i.this if isinstance(i, exp.Alias) else i, exp.Star)
            for i in items
        ) or any(isinstance(i, exp.Column) and isinstance(i.this, exp.Star) for i in items):
            raise PolicyViolation(
                f'SELECT * would return raw rows of the protected table "{self.relation.label}"',
                hint=aggregate_view(self.relation),
            )
        if not any(i.find(exp.AggFunc) for i in items) and not self.keys:
            raise PolicyViolation(
                f'this query would return raw rows of the protected table "{self.relation.label}"',
                hint=f"{aggregate_view(self.relation)} (dpproxy answers {SUPPORTED_AGGREGATES}, optionally "
                "with GROUP BY)",
            )
        outputs = []
        for item in items:
            node = item.this if isinstance(item, exp.Alias) else item
            expression = self._finish_expression(node, "SELECT")
            outputs.append((output_name(item), expression))
        having = None
        if tree.args.get("having") is not None:
            having = self._finish_expression(tree.args["having"].this, "HAVING")
        order_by = self._order_by([name for name, _ in outputs])
        types = self._placeholder_types()
        for _, expression in outputs:
            postprocess.check_comparisons(expression, types, "SELECT", self.originals)
        typed_outputs = tuple(
            OutputColumn(name, expression, known_type(self._infer_type(expression, types)))
            for name, expression in outputs
        )
        if having is not None:
            postprocess.check_comparisons(having, types, "HAVING", self.originals)
            if self._infer_type(having, types) not in (PgType.BOOL, PgType.UNKNOWN):
                raise DatatypeMismatch("argument of HAVING must be boolean")
        out_types = {f"__out_{i}": o.type for i, o in enumerate(typed_outputs)}
        self.originals.update({f"__out_{i}": exp.column(name) for i, (name, _) in enumerate(outputs)})
        for key in order_by:
            postprocess.check_comparisons(key.expression, {**types, **out_types}, "ORDER BY", self.originals)
            self._infer_type(key.expression, {**types, **out_types})
        post = PostProcessing(
            typed_outputs, having, tuple(order_by), limit_of(tree, "limit"), limit_of(tree, "offset") or 0
        )
        if self._answered_by_randomized_response(where_sql):
            return self._randomized_response(where_sql, post)
        return PrivateQuery(
            relation=self.relation,
            where=where_sql,
            keys=tuple(self.keys),
            components=tuple(self.components),
            aggregates=tuple(self.aggregates),
            post_processing=post,
            text=self.text,
            histograms=tuple(self.histograms),
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

    def _randomized_response(self, where: exp.Expression, post: PostProcessing) -> PrivateQuery:
        """Every person of the table reports whether WHERE holds on one of their rows; the count is
        estimated from noisy tallies of the reports (dpproxy.privacy.responses.RandomizedResponseCount)."""
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
            post_processing=post,
            text=self.text,
            randomized_response=True,
        )

    def _reject_unsupported_clauses(self) -> None:
        tree = self.tree
        if tree.find(exp.Window):
            raise NotSupported(
                "window functions are not supported over rows of a protected table",
                hint="a window function may read the aggregates and GROUP BY keys of its SELECT, e.g. "
                "SELECT k, COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () FROM t GROUP BY k",
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
        public = PublicKeys(self.tree, self.relation, self.fetch_key_values)
        for node in group.expressions:
            source = node
            if isinstance(node, exp.Literal) and not node.is_string:
                position = select_position(node, "GROUP BY")
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
            # Values known without protected data: declared, of a joined public table, of a declared
            # date range; restricted by the WHERE (dpproxy.sql.public_keys).
            found = public.values(bare, typed, text)
            # Text keys group byte for byte: under a case-insensitive collation 'A' and 'a' would be
            # one group spelled as whichever row came first (a spelling one person could decide).
            sql = bytewise_text(typed.sql) if typed.type.is_text else typed.sql
            self.keys.append(
                GroupKey(
                    sql,
                    known_type(typed.type),
                    text,
                    found.values,
                    found.origin,
                    found.fetched,
                    contiguous=found.contiguous,
                    double=typed.double,
                )
            )
        self.keys = public.within_limit(self.keys)

    def _infer_type(self, expression: exp.Expression, types: Mapping[str, PgType]) -> PgType:
        """The type of an expression over released values; a refusal names what the analyst wrote
        (the aggregate or output behind each placeholder), never a placeholder."""
        try:
            return postprocess.infer_type(expression, types)
        except DPProxyError as error:
            for name, original in sorted(self.originals.items(), key=lambda kv: -len(kv[0])):
                written = original.sql("postgres")
                error.message = error.message.replace(f'"{name}"', written).replace(name, written)
            raise

    def _placeholder_types(self) -> dict[str, PgType]:
        types = {f"__agg_{i}": a.result_type for i, a in enumerate(self.aggregates)}
        types.update(intervals.interval_types([a.result_type for a in self.aggregates]))
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
            end = intervals.interval_end(n)
            if end is not None:
                assert isinstance(n, exp.Anonymous)
                return self._interval(n, end, substitute(intervals.interval_argument(n, self._output_alias)))
            if isinstance(n, (exp.AggFunc, exp.Filter, exp.WithinGroup)):
                placeholder = aggregate_placeholder(self._aggregate(n))
                self.originals.setdefault(placeholder.name, n.copy())
                return placeholder
            j = self._key_index(n, clause)
            if j is not None:
                placeholder = key_placeholder(j)
                self.originals.setdefault(placeholder.name, n.copy())
                return placeholder
            if isinstance(n, exp.Column):
                self._check_not_alias(n, clause)
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

    def _interval(self, call: exp.Anonymous, end: str, argument: exp.Expression) -> exp.Expression:
        """`dp_interval_low/high(argument)`: the argument (over one aggregate's placeholder, already
        checked to be monotone forms of it) over the placeholder of that end of its interval."""
        (placeholder,) = [c for c in argument.find_all(exp.Column) if c.name.startswith("__agg_")]
        index = int(placeholder.name.removeprefix("__agg_"))
        aggregate = self.aggregates[index]
        # A quantile's interval is two more picks (dpproxy.release.requests); MIN, MAX and MODE have
        # none: their 95% bound is on ranks or counts.
        if aggregate.kind is AggregateKind.MODE or (
            aggregate.kind is AggregateKind.QUANTILE and aggregate.alpha in (0, 1)
        ):
            raise intervals.refuse_exponential(call, self.originals[placeholder.name].sql())
        replacement = intervals.interval_placeholder(index, end)
        self.originals.setdefault(replacement.name, call.copy())
        if placeholder is argument:
            return replacement
        placeholder.replace(replacement)
        return argument

    def _output_alias(self, node: exp.Column) -> exp.Expression | None:
        """The select-list expression a bare name stands for inside dp_interval_*(…) (Snowflake's
        form names the aggregate's output alias), unless an input column has that name (as SQL
        resolves names: the column first)."""
        name = node.name if node.this.quoted else node.name.lower()
        if node.table or any(s.column(name) for s in self.relation.sources):
            return None
        items = [i for i in self.tree.expressions if isinstance(i, exp.Alias) and output_name(i) == name]
        if len(items) > 1:
            raise AmbiguousColumn(f'output alias "{name}" is ambiguous in dp_interval_low/high')
        return items[0].this if items else None

    def _check_not_alias(self, node: exp.Column, clause: str) -> None:
        """An output alias is not a column: in HAVING, or inside an ORDER BY expression, PostgreSQL
        answers 42703 (only a bare `ORDER BY alias` and `GROUP BY alias` may name one)."""
        aliases = [output_name(i) for i in self.tree.expressions if isinstance(i, exp.Alias)]
        where = "in HAVING" if clause == "HAVING" else f"inside an expression in {clause}"
        name = node.name if node.this.quoted else node.name.lower()
        hint = (
            f"an output alias may stand alone in ORDER BY or GROUP BY (ORDER BY {name}); elsewhere "
            "repeat its expression, e.g. HAVING COUNT(*) > 5"
        )
        refuse_output_alias(node, aliases, self.relation.sources, clause, where, hint)

    def _order_by(self, output_names: list[str]) -> list[SortKey]:
        order = self.tree.args.get("order")
        if order is None:
            return []
        keys = []
        for ordered in order.expressions:
            node = ordered.this
            if isinstance(node, exp.Literal) and not node.is_string:
                position = select_position(node, "ORDER BY")
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
