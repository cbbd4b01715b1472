"""Typing a catalog query: the name, type OID and origin PostgreSQL would give each output column,
and the type it would infer for each untyped parameter ($n), over the catalog's column types.

DuckDB's own result types cannot tell name from text or regclass from oid, so RowDescription
comes from here. The typer reads sqlglot's tree and marks nodes (node.meta["pg_type"]) for the
translator; it never rewrites a tree, runs SQL or sees a session.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpproxy.wire.catalog.builtin import PgData
from dpproxy.wire.catalog.functions import (
    ARGUMENTS,
    PREDICATES,
    RETURNS,
    call_arguments,
    function_name,
    ident,
    param_index,
)
from dpproxy.wire.catalog.pg_types import INTEGER_TYPES, UNKNOWN, type_oid_from_name


@dataclass
class TypedColumn:
    """A column as the typer sees it: in a relation, a CTE, a subquery or a query's output."""

    name: str
    oid: int | None
    table_oid: int = 0  # RowDescription's origin of a column read unchanged from a catalog relation
    attnum: int = 0
    typmod: int = -1


@dataclass(frozen=True)
class TypedRelation:
    """A catalog relation or an exposed table, with its columns' PostgreSQL types."""

    oid: int
    columns: tuple[TypedColumn, ...]


class _Scope:
    """The relations a SELECT reads, by alias, and the scope around it (correlated subqueries)."""

    def __init__(self, parent: _Scope | None = None) -> None:
        self.parent = parent
        self.sources: list[tuple[str, list[TypedColumn]]] = []

    def resolve(self, table: str | None, name: str) -> TypedColumn | None:
        scope: _Scope | None = self
        while scope is not None:
            for alias, columns in scope.sources:
                if table is not None and alias != table:
                    continue
                for column in columns:
                    if column.name == name:
                        return column
                if table is not None:
                    return None  # a relation's name used as a row value: not typed here
            scope = scope.parent
        return None

    def relation_oid(self, table: str | None) -> int:
        """The pg_class OID of the relation `table` names (or of the only one, when None); 0 when
        it is not one relation of the catalog or of the policy."""
        if table is None:
            if len(self.sources) != 1:
                return 0
            columns: list[TypedColumn] | None = self.sources[0][1]
        else:
            columns = self.source(table)
        oids = {c.table_oid for c in columns or ()}
        return oids.pop() if len(oids) == 1 else 0

    def source(self, table: str) -> list[TypedColumn] | None:
        scope: _Scope | None = self
        while scope is not None:
            for alias, columns in scope.sources:
                if alias == table:
                    return columns
            scope = scope.parent
        return None


class Typer:
    """Types every expression it visits (node.meta["pg_type"]) and infers parameter types."""

    def __init__(self, relations: Mapping[tuple[str, str], TypedRelation], data: PgData) -> None:
        self.relations = relations
        self.data = data
        self.params: dict[int, int] = {}
        self.ctes: Mapping[str, list[TypedColumn]] = {}  # the CTEs visible where the typer is

    def relation(self, schema: str | None, name: str) -> TypedRelation | None:
        if schema in ("pg_information_schema", "information_schema"):
            return self.relations.get(("information_schema", name))
        if schema is not None:
            return self.relations.get((schema, name))
        return self.relations.get(("pg_catalog", name)) or self.relations.get(("public", name))

    # -- queries -------------------------------------------------------------------------------

    def query(
        self, node: exp.Expression, outer: _Scope | None, ctes: Mapping[str, list[TypedColumn]]
    ) -> list[TypedColumn]:
        """The output columns of a query."""
        if isinstance(node, (exp.Subquery, exp.Paren)):
            return self.query(node.this, outer, ctes)
        ctes = self.with_clause(node, outer, ctes)
        enclosing, self.ctes = self.ctes, ctes
        try:
            return self._query(node, outer, ctes)
        finally:
            self.ctes = enclosing

    def _query(
        self, node: exp.Expression, outer: _Scope | None, ctes: Mapping[str, list[TypedColumn]]
    ) -> list[TypedColumn]:
        if isinstance(node, exp.SetOperation):
            left = self.query(node.left, outer, ctes)
            right = self.query(node.right, outer, ctes)
            merged = []
            for i, column in enumerate(left):
                oid = column.oid
                other = right[i].oid if i < len(right) else None
                if oid in (None, UNKNOWN) and other not in (None, UNKNOWN):
                    oid = other
                merged.append(TypedColumn(column.name, oid))
            return merged
        if isinstance(node, exp.Values):
            first = node.expressions[0] if node.expressions else None
            items = first.expressions if isinstance(first, exp.Tuple) else []
            return [TypedColumn(f"column{i + 1}", self.type(e, _Scope(outer))) for i, e in enumerate(items)]
        if not isinstance(node, exp.Select):
            return []
        scope = _Scope(outer)
        from_ = node.args.get("from_") or node.args.get("from")
        if from_ is not None:
            self.add_source(from_.this, scope, ctes)
        for join in node.args.get("joins") or []:
            self.add_source(join.this, scope, ctes)
        columns: list[TypedColumn] = []
        for projection in node.expressions:
            if isinstance(projection, exp.Star):
                for _, cols in scope.sources:
                    columns.extend(TypedColumn(c.name, c.oid, c.table_oid, c.attnum, c.typmod) for c in cols)
            elif isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
                cols = scope.source(ident(projection.args.get("table"))) or []
                columns.extend(TypedColumn(c.name, c.oid, c.table_oid, c.attnum, c.typmod) for c in cols)
            else:
                oid = self.type(projection, scope)
                origin = self.origin(projection, scope) or TypedColumn("", None)
                columns.append(
                    TypedColumn(
                        self.column_name(projection), oid, origin.table_oid, origin.attnum, origin.typmod
                    )
                )
        # Type the rest of the SELECT too: rewrites (casts of reg* values, array literals) and
        # parameter inference rely on it.
        for key in ("where", "having", "qualify"):
            clause = node.args.get(key)
            if clause is not None:
                self.type(clause.this, scope)
        for join in node.args.get("joins") or []:
            if join.args.get("on") is not None:
                self.type(join.args["on"], scope)
        for key in ("group", "order"):
            clause = node.args.get(key)
            for item in clause.expressions if clause is not None else []:
                self.type(item.this if isinstance(item, exp.Ordered) else item, scope)
        for param in node.find_all(exp.Parameter):
            if param.find_ancestor(exp.Select) is node:
                self.param_context(param, scope)
        return columns

    def with_clause(
        self, node: exp.Expression, outer: _Scope | None, ctes: Mapping[str, list[TypedColumn]]
    ) -> Mapping[str, list[TypedColumn]]:
        with_ = node.args.get("with_") or node.args.get("with")
        if with_ is None:
            return ctes
        known = dict(ctes)
        for cte in with_.expressions:
            alias = cte.args.get("alias")
            name = ident(alias.this) if alias is not None else cte.alias_or_name
            names = [ident(c) for c in alias.columns] if alias is not None and alias.columns else None
            body = cte.this
            if names:
                # A recursive CTE refers to itself: its names first, its types from the first branch.
                known[name] = [TypedColumn(n, None) for n in names]
                if isinstance(body, exp.SetOperation):
                    body = body.left
            columns = self.query(body, outer, known)
            if names:
                columns = [
                    TypedColumn(n, columns[i].oid if i < len(columns) else None) for i, n in enumerate(names)
                ]
            known[name] = columns
        return known

    def add_source(
        self, source: exp.Expression, scope: _Scope, ctes: Mapping[str, list[TypedColumn]]
    ) -> None:
        alias_node = source.args.get("alias")
        alias = ident(alias_node.this) if isinstance(alias_node, exp.TableAlias) and alias_node.this else ""
        renames = [ident(c) for c in alias_node.columns] if isinstance(alias_node, exp.TableAlias) else []
        if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
            name = ident(source.this)
            schema = ident(source.args.get("db")) if source.args.get("db") else None
            if schema is None and name in ctes:
                columns = [TypedColumn(c.name, c.oid) for c in ctes[name]]
            else:
                relation = self.relation(schema, name)
                columns = [
                    TypedColumn(c.name, c.oid, c.table_oid, c.attnum, c.typmod)
                    for c in (relation.columns if relation else ())
                ]
            alias = alias or name
        elif isinstance(source, exp.Table):
            columns = self.function_columns(source.this, scope, alias)
        elif isinstance(source, exp.Unnest):
            columns = self.function_columns(source, scope, alias)
        elif isinstance(source, exp.Subquery) and _is_join_group(source):
            self.add_source(source.this, scope, ctes)
            for join in source.args.get("joins") or []:
                self.add_source(join.this, scope, ctes)
            return
        elif isinstance(source, exp.Subquery):
            columns = self.query(source.this, scope, ctes)
        elif isinstance(source, exp.Lateral):
            self.add_source(source.this, scope, ctes)
            return
        else:
            columns = []
        for i, rename in enumerate(renames[: len(columns)]):
            columns[i] = TypedColumn(rename, columns[i].oid)
        scope.sources.append((alias, columns))
        for join in source.args.get("joins") or [] if isinstance(source, exp.Table) else []:
            self.add_source(join.this, scope, ctes)

    def function_columns(self, function: exp.Expression, scope: _Scope, alias: str) -> list[TypedColumn]:
        name = function_name(function) or ""
        args = call_arguments(function)
        if name == "generate_series":
            start = self.type(function.args.get("start") or (args[0] if args else None), scope)
            return [TypedColumn(alias or name, start if start in INTEGER_TYPES else 23)]
        if name == "unnest" and args:
            # unnest(a, b, …): one column per array (Django's unnest(i.indkey, i.indoption)), each
            # named after the function when the alias names none.
            columns = [TypedColumn(alias or name, self.element(self.type(arg, scope))) for arg in args]
            ordinality = function.args.get("offset") if isinstance(function, exp.Unnest) else None
            if isinstance(ordinality, exp.Identifier):  # WITH ORDINALITY AS t(…, n)
                columns.append(TypedColumn(ident(ordinality), 20))
            return columns
        if name == "__pg_expandarray" and args:
            return [TypedColumn("x", self.element(self.type(args[0], scope))), TypedColumn("n", 23)]
        if name == "pg_options_to_table":
            return [TypedColumn("option_name", 25), TypedColumn("option_value", 25)]
        if name == "pg_get_keywords":
            return [
                TypedColumn(n, o)
                for n, o in (
                    ("word", 25),
                    ("catcode", 18),
                    ("barelabel", 16),
                    ("catdesc", 25),
                    ("baredesc", 25),
                )
            ]
        for arg in args:
            self.type(arg, scope)
        return [TypedColumn(alias or name, RETURNS.get(name))]

    # -- column names --------------------------------------------------------------------------

    def column_name(self, node: exp.Expression) -> str:
        """PostgreSQL's FigureColname: an alias, a column's or function's name, or ?column?."""
        if isinstance(node, exp.Alias):
            return ident(node.args.get("alias"))
        name, _ = self._figure(node)
        return name or "?column?"

    def _figure(self, node: exp.Expression) -> tuple[str | None, int]:
        """(name, strength): 2 for a column or function name, 1 for a type name or "case"."""
        if isinstance(node, exp.Column):
            return ident(node.this), 2
        if isinstance(node, exp.Dot):
            return ident(node.expression), 2
        if isinstance(node, (exp.Paren, exp.Bracket, exp.Window, exp.Filter)):
            return self._figure(node.this)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            name, strength = self._figure(node.this)
            if strength > 1:
                return name, strength
            row = self.data.types.get(node.meta.get("pg_type", -1))
            return (row.name if row is not None else node.to.sql("postgres").lower()), 1
        if isinstance(node, exp.Subquery):
            inner = node.this
            if isinstance(inner, exp.Select) and inner.expressions:
                return self.column_name(inner.expressions[0]), 2
            return None, 0
        if isinstance(node, exp.Array):
            return "array", 2
        if isinstance(node, exp.Exists):
            return "exists", 2
        if isinstance(node, exp.Case):
            default = node.args.get("default")
            if default is not None:
                name, strength = self._figure(default)
                if strength > 1:
                    return name, strength
            return "case", 1
        name = function_name(node)
        if name is not None and not isinstance(node, (exp.Binary, exp.Unary)):
            return name.removeprefix("__"), 2
        return None, 0

    # -- types ---------------------------------------------------------------------------------

    def element(self, oid: int | None) -> int | None:
        return self.data.element(oid) if oid is not None else None

    def origin(self, node: exp.Expression, scope: _Scope) -> TypedColumn | None:
        if isinstance(node, exp.Alias):
            node = node.this
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            table = ident(node.args.get("table")) if node.args.get("table") else None
            column = scope.resolve(table, ident(node.this))
            if column is not None and column.table_oid:
                return column
        return None

    def type(self, node: exp.Expression | None, scope: _Scope) -> int | None:
        if node is None:
            return None
        oid = self._type(node, scope)
        if oid is not None:
            node.meta["pg_type"] = oid
        return oid

    def _type(self, node: exp.Expression, scope: _Scope) -> int | None:
        if isinstance(node, (exp.Alias, exp.Paren, exp.Window, exp.Filter, exp.Neg)):
            return self.type(node.this, scope)
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                return None
            table = ident(node.args.get("table")) if node.args.get("table") else None
            name = ident(node.this)
            column = scope.resolve(table, name)
            if column is not None:
                return self.data.base_type(column.oid) if column.oid is not None else None
            if table is None and name in ("user", "current_role", "current_user", "session_user"):
                return 19
            if name == "tableoid":
                # The system column (psql's \dd, \dL join pg_description on it): the OID of
                # the relation the row is in, which the rewrite puts in as a constant.
                relation_oid = scope.relation_oid(table)
                if relation_oid:
                    node.meta["tableoid"] = relation_oid
                    return 26
            return None
        if isinstance(node, (exp.Cast, exp.TryCast)):
            self.type(node.this, scope)
            oid = type_oid_from_name(node.to.sql("postgres"), self.data)
            return self.data.base_type(oid) if oid is not None else None
        if isinstance(node, exp.Literal):
            if node.is_string:
                return UNKNOWN
            if re.fullmatch(r"\d+", node.this):
                value = int(node.this)
                return 23 if value < 2**31 else 20 if value < 2**63 else 1700
            return 1700
        if isinstance(node, (exp.RawString, exp.UnicodeString, exp.National, exp.HexString, exp.Null)):
            return UNKNOWN
        if isinstance(node, exp.Boolean):
            return 16
        if isinstance(node, exp.Parameter):
            return self.params.get(param_index(node)) or UNKNOWN
        if isinstance(node, exp.DPipe):
            sides = (self.type(node.this, scope), self.type(node.expression, scope))
            arrays = [
                s for s in sides if s is not None and s not in (22, 30) and self.data.element(s) is not None
            ]
            return arrays[0] if arrays else 25
        if isinstance(node, PREDICATES):
            for child in node.iter_expressions():
                self.type(child, scope)
            return 16
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.BitwiseAnd, exp.BitwiseOr)):
            return _arithmetic(self.type(node.this, scope), self.type(node.expression, scope))
        if isinstance(node, exp.Case):
            self.type(node.this, scope)
            for branch in node.args.get("ifs") or []:
                self.type(branch.this, scope)
            results = [branch.args.get("true") for branch in node.args.get("ifs") or []]
            return self.first_known([*results, node.args.get("default")], scope)
        if isinstance(node, exp.If):
            return self.first_known([node.args.get("true"), node.args.get("false")], scope)
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            return self.first_known([node.this, *node.expressions], scope)
        if isinstance(node, exp.Nullif):
            self.type(node.expression, scope)
            return self.first_known([node.this], scope)
        if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
            columns = self.query(node, scope, self.ctes)
            return columns[0].oid if columns else None
        if isinstance(node, exp.Array):
            items = node.expressions
            if len(items) == 1 and isinstance(items[0], (exp.Select, exp.Subquery, exp.SetOperation)):
                columns = self.query(items[0], scope, self.ctes)
                element = columns[0].oid if columns else None
            else:
                element = self.first_known(items, scope)
            return self.data.array_of(25 if element == UNKNOWN else element) if element is not None else None
        if isinstance(node, exp.Bracket):
            base = self.type(node.this, scope)
            for item in node.expressions:
                self.type(item, scope)
            slicing = bool(node.expressions) and isinstance(node.expressions[0], exp.Slice)
            return base if slicing else self.element(base)
        if isinstance(node, exp.Dot):
            inner = node.this.this if isinstance(node.this, exp.Paren) else node.this
            if function_name(inner) == "__pg_expandarray":
                args = call_arguments(inner)
                field_name = ident(node.expression)
                return 23 if field_name == "n" else self.element(self.type(args[0] if args else None, scope))
            return None
        if isinstance(node, exp.Count):
            for child in node.iter_expressions():
                self.type(child, scope)
            return 20
        if isinstance(node, (exp.Max, exp.Min, exp.Abs, exp.Round)):
            return self.type(node.this, scope)
        if isinstance(node, exp.Sum):
            arg = self.type(node.this, scope)
            return 20 if arg in (21, 23) else 701 if arg in (700, 701) else 1700 if arg is not None else None
        if isinstance(node, exp.Avg):
            arg = self.type(node.this, scope)
            return 701 if arg in (700, 701) else 1700 if arg is not None else None
        if isinstance(node, exp.ArrayAgg):
            target = node.this.this if isinstance(node.this, exp.Order) else node.this
            arg = self.type(target, scope)
            return self.data.array_of(25 if arg == UNKNOWN else arg) if arg is not None else None
        if isinstance(node, exp.Unnest):
            return self.element(self.type(node.expressions[0], scope)) if node.expressions else None
        if isinstance(node, (exp.ExplodingGenerateSeries, exp.GenerateSeries)):
            start = self.type(node.args.get("start"), scope)
            self.type(node.args.get("end"), scope)
            return start if start in INTEGER_TYPES else 23
        name = function_name(node)
        if name is None:
            return None
        args = call_arguments(node)
        for arg in args:
            self.type(arg, scope)
        if name == "unnest" and args:
            return self.element(args[0].meta.get("pg_type"))
        return RETURNS.get(name)

    def first_known(self, nodes: Sequence[exp.Expression | None], scope: _Scope) -> int | None:
        """PostgreSQL's select_common_type, simply: the first typed branch; text if all are literals."""
        result: int | None = None
        for node in nodes:
            oid = self.type(node, scope)
            if result is None and oid not in (None, UNKNOWN):
                result = oid
        if result is None and any(n is not None for n in nodes):
            return 25
        return result

    # -- parameters ----------------------------------------------------------------------------

    def param_context(self, param: exp.Parameter, scope: _Scope) -> None:
        """The type PostgreSQL infers for an untyped parameter from where it stands."""
        index = param_index(param)
        if index in self.params:
            return
        node: exp.Expression = param
        parent = node.parent
        while isinstance(parent, exp.Paren):
            node, parent = parent, parent.parent
        oid: int | None = None
        if isinstance(parent, (exp.Cast, exp.TryCast)):
            oid = type_oid_from_name(parent.to.sql("postgres"), self.data)
        elif isinstance(parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ)):
            other = parent.expression if parent.this is node else parent.this
            oid = None if isinstance(other, (exp.Any, exp.All)) else self.type(other, scope)
        elif isinstance(parent, exp.In):
            oid = self.type(parent.this, scope)
        elif isinstance(parent, (exp.Limit, exp.Offset)):
            oid = 20
        elif isinstance(parent, (exp.Like, exp.ILike, exp.DPipe, exp.RegexpLike, exp.RegexpILike)):
            oid = 25
        elif isinstance(parent, (exp.Any, exp.All)):
            comparison = parent.parent
            if isinstance(comparison, exp.Binary):
                element = self.type(comparison.this, scope)
                oid = self.data.array_of(element) if element is not None else None
        elif isinstance(parent, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
            oid = self.type(parent.expression if parent.this is node else parent.this, scope)
        elif isinstance(parent, exp.Func):
            args = call_arguments(parent)
            types = ARGUMENTS.get(function_name(parent) or "", ())
            if node in args and args.index(node) < len(types):
                oid = types[args.index(node)]
        if oid not in (None, UNKNOWN):
            self.params[index] = oid  # type: ignore[assignment]


def _arithmetic(left: int | None, right: int | None) -> int | None:
    known = [t for t in (left, right) if t not in (None, UNKNOWN)]
    if not known:
        return None
    if any(t in (700, 701) for t in known):
        return 701
    if 1700 in known:
        return 1700
    ranks = {21: 0, 23: 1, 20: 2}
    if all(t in ranks for t in known):
        return max(known, key=lambda t: ranks[t])  # type: ignore[index]
    return known[0]


def _is_join_group(node: exp.Subquery) -> bool:
    """((a JOIN b ON …) JOIN c ON …): parentheses around joins rather than a subquery."""
    inner = node.this
    return isinstance(inner, exp.Table) or (isinstance(inner, exp.Subquery) and _is_join_group(inner))
