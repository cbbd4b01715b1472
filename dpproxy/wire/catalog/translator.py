"""Translation: PostgreSQL catalog SQL → SQL the shadow's DuckDB runs, with the result columns typed.

DuckDB's parser reads PostgreSQL's grammar; what its binder lacks is added as macros
(data/macros.sql) and lookup tables (build.py), and what it cannot bind is rewritten here, first
token by token (OPERATOR(pg_catalog.~), COLLATE "default", pg_catalog. prefixes), then on the
sqlglot tree: ::regclass and the other reg* types (OIDs inside, names outside), int2vector, array
literals, format(), scalar functions in FROM, integer division. SQL sqlglot cannot parse still
runs, typed by DuckDB alone. Refused functions are refused first (refusals.py).

Text in, text out: this module never runs SQL, never sees a session and never holds a row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dpproxy.errors import DPProxyError, InvalidParameter, SyntaxProblem, UndefinedParameter
from dpproxy.sql.limits import check_tree, too_deep
from dpproxy.wire.catalog.builtin import PgData
from dpproxy.wire.catalog.functions import (
    RETURNS,
    function_name,
    ident,
    is_table_function,
    names_in,
    param_index,
)
from dpproxy.wire.catalog.pg_types import (
    INTEGER_TYPES,
    OID_LIKE,
    REG_TYPES,
    TEXT_TYPES,
    UNKNOWN,
    duck_type,
    parse_pg_array,
    type_oid_from_name,
)
from dpproxy.wire.catalog.refusals import refuse_internals
from dpproxy.wire.catalog.typer import TypedRelation, Typer
from dpproxy.wire.router import MAX_PARAMETERS, LexError, Token, TokenKind, tokenize
from dpproxy.wire.router.limits import checked_tokens
from dpproxy.wire.router.relations import operator_close


@dataclass(frozen=True)
class InferredColumn:
    """A result column as the typer inferred it: what RowDescription will say of it."""

    name: str
    type_oid: int | None  # None: from DuckDB's result type
    table_oid: int = 0
    column_number: int = 0
    type_modifier: int = -1


@dataclass(frozen=True)
class Translation:
    sql: str  # what DuckDB runs
    columns: tuple[InferredColumn, ...] | None  # None when the query was not understood (DuckDB types)
    param_types: tuple[int, ...]  # inferred PostgreSQL types of $1, $2, … (0: not inferred)
    param_count: int


# Keywords a client may use as a column label after AS; none of them names a type, so quoting
# them cannot change a CAST.
_RESERVED_LABELS = frozenset(
    names_in(
        """select insert update delete table from where group order having limit offset union all with into
        references grant check column constraint create default desc asc distinct do else end except for
        foreign full join left right natural only or and primary some then to unique using when window both
        case fetch in is like ilike user analyse analyze array current_user session_user returning
        symmetric tablesample trailing leading variadic verbose lateral collate"""
    )
)


def normalise_tokens(sql: str) -> str:
    """Rewrite, token by token, what neither sqlglot nor DuckDB reads; keep the rest as written.

    OPERATOR(pg_catalog.~) → ~. COLLATE x → dropped (the shadow compares bytewise, as "C" does).
    pg_catalog.x → x (the shadow's catalog relations and functions are unqualified).
    information_schema.x → pg_information_schema.x, or __x( for its functions (_pg_expandarray).
    ::oid[] → ::__pg_oid[], ::regtype[] → ::__pg_regtype[] (sqlglot cannot parse them).
    AS select → AS "select"; AS collate → AS "collate" (a label, not a COLLATE clause).
    """
    tokens = tokenize(sql)
    out: list[str] = []
    last = 0

    def replace(start: int, text: str, resume: int) -> None:
        nonlocal last
        out.append(sql[last:start])
        out.append(text)
        last = resume

    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        after = tokens[i + 2] if i + 2 < len(tokens) else None
        if token.is_word("operator") and nxt is not None and nxt.text == "(":
            close = operator_close(tokens, i)
            if close is not None:
                replace(token.start, " " + tokens[close - 1].text + " ", tokens[close].end)
                i = close + 1
                continue
        previous = tokens[i - 1] if i else None
        label = previous is not None and previous.is_word("as")
        if token.is_word("collate") and nxt is not None and not label:
            j = i + 1
            while j + 2 < len(tokens) and tokens[j + 1].text == ".":
                j += 2
            replace(token.start, " ", tokens[j].end)
            i = j + 1
            continue
        if _is_name(token, "pg_catalog") and nxt is not None and nxt.text == "." and after is not None:
            array = i + 3 < len(tokens) and tokens[i + 3].text == "["
            cast = previous is not None and (previous.text == "::" or previous.is_word("as"))
            named = after.kind is TokenKind.IDENT and after.value in ("oid", *REG_TYPES.values())
            if array and cast and named:
                # ::pg_catalog.oid[] (pg_dump's table lists) → ::__pg_oid[], as ::oid[] below.
                replace(token.start, "__pg_" + after.value, after.end)
                i += 3
                continue
            replace(token.start, "", after.start)
            i += 2
            continue
        if (
            _is_name(token, "information_schema")
            and nxt is not None
            and nxt.text == "."
            and after is not None
        ):
            call = i + 3 < len(tokens) and tokens[i + 3].text == "("
            if call:
                replace(token.start, "__" + after.value.lstrip("_"), after.end)
                i += 3
            else:
                replace(token.start, "pg_information_schema.", after.start)
                i += 2
            continue
        if (
            token.kind is TokenKind.IDENT
            and token.value in _RESERVED_LABELS
            and previous is not None
            and previous.is_word("as")
            and not (nxt is not None and nxt.text in ("(", "."))
        ):
            replace(token.start, f'"{token.value}"', token.end)
            i += 1
            continue
        if (
            token.kind is TokenKind.IDENT
            and token.value in ("oid", *REG_TYPES.values())
            and previous is not None
            and (previous.text == "::" or previous.is_word("as"))
            and nxt is not None
            and nxt.text == "["
        ):
            replace(token.start, "__pg_" + token.value, token.end)
        i += 1
    out.append(sql[last:])
    return "".join(out)


def _is_name(token: Token, name: str) -> bool:
    return token.kind in (TokenKind.IDENT, TokenKind.QUOTED) and token.value == name


def parameter_count(sql: str) -> int:
    """The highest $n of a query ($n inside a string is text, not a parameter).

    Describe sizes the parameter list by it: `SELECT $100000000` would have the shadow build a list
    of 10⁸ types and values for one Parse. No Bind can carry more than MAX_PARAMETERS values, so a
    higher number is refused, as the router refuses it before a statement reaches the catalog.
    """
    count = max((int(t.text[1:]) for t in tokenize(sql) if t.kind is TokenKind.PARAM), default=0)
    if count > MAX_PARAMETERS:
        raise UndefinedParameter(
            f"there is no parameter ${count}", hint=f"a statement takes at most {MAX_PARAMETERS} parameters"
        )
    return count


def _pg_format(template: str, args: list[exp.Expression]) -> exp.Expression:
    """PostgreSQL's format() with a constant template, as a concat() DuckDB runs.

    %s is the argument as text (NULL → ''), %I a quoted identifier, %L a quoted literal (NULL →
    NULL), %% a percent sign; %n$ picks the nth argument."""
    parts: list[exp.Expression] = []
    position = 0
    for piece in re.split(r"(%(?:\d+\$)?[sIL%])", template):
        match = re.fullmatch(r"%(?:(\d+)\$)?([sIL%])", piece)
        if match is None:
            if piece:
                parts.append(exp.Literal.string(piece))
            continue
        if match.group(2) == "%":
            parts.append(exp.Literal.string("%"))
            continue
        index = int(match.group(1)) - 1 if match.group(1) else position
        position = index + 1
        if index >= len(args):
            raise InvalidParameter("too few arguments for format()")
        arg = exp.Cast(this=args[index].copy(), to=exp.DataType.build(exp.DataType.Type.VARCHAR))
        function = {"I": "quote_ident", "L": "quote_nullable"}.get(match.group(2))
        parts.append(exp.Anonymous(this=function, expressions=[arg]) if function else arg)
    return exp.Anonymous(this="concat", expressions=parts or [exp.Literal.string("")])


# `'text'::regclass` or `name.name::regclass`: a string or a dotted name, each read once (possessive,
# and a name only from its first character), so that a long one costs linear time, not quadratic.
_REG_CAST = re.compile(
    r"('(?:[^']|'')*+'|(?<![\w.])[\w.]++)\s*::\s*(regclass|regtype|regnamespace|regrole|regproc)\b",
    re.IGNORECASE,
)

# SQL keywords sqlglot reads as functions of its own: the shadow's macros answer them.
_SESSION_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.CurrentCatalog: "current_database",
    exp.SessionUser: "session_user",
    exp.CurrentUser: "current_user",
    exp.CurrentSchema: "current_schema",
}


class Translator:
    def __init__(self, data: PgData, relations: Mapping[tuple[str, str], TypedRelation]) -> None:
        self.data = data
        self.relations = relations

    def translate(self, sql: str) -> Translation:
        checked_tokens(sql)  # the statement limits (54001), before anything else reads the text
        try:
            normalised = normalise_tokens(sql)
        except LexError as exc:
            raise SyntaxProblem(str(exc)) from None
        refuse_internals(normalised)
        parameter_count(normalised)  # refuses a $n no client could bind before anything is sized by it
        try:
            trees = sqlglot.parse(normalised, read="postgres")
        except RecursionError:
            raise too_deep() from None
        except Exception:  # sqlglot raises several error types on what it cannot parse
            trees = []
        if len(trees) != 1 or not isinstance(trees[0], (exp.Query, exp.Values)):
            return self.untyped(normalised)
        tree = trees[0]
        check_tree(tree)  # the typer, the rewrite and the generator recurse over it
        typer = Typer(self.relations, self.data)
        try:
            columns = typer.query(tree, None, {})
            rewritten = self.rewrite(tree, typer).sql(dialect="duckdb")
        except DPProxyError:
            raise
        except RecursionError:
            raise too_deep() from None
        except Exception:  # a construct the typer or a rewrite does not know: let DuckDB try
            return self.untyped(normalised)
        count = max((param_index(p) for p in tree.find_all(exp.Parameter)), default=0)
        outputs = tuple(
            InferredColumn(c.name, 25 if c.oid == UNKNOWN else c.oid, c.table_oid, c.attnum, c.typmod)
            for c in columns
        )
        params = tuple(typer.params.get(i, 0) for i in range(1, count + 1))
        return Translation(rewritten, outputs or None, params, count)

    def untyped(self, normalised: str) -> Translation:
        """SQL sqlglot cannot parse: DuckDB runs the normalised text, and types its results."""
        text = _REG_CAST.sub(lambda m: f"__to_{m.group(2).lower()}({m.group(1)})", normalised)
        text = re.sub(r"::\s*__pg_oid\s*\[\s*\]", "::UINTEGER[]", text)
        text = re.sub(r"::\s*oid\b", "::UINTEGER", text, flags=re.IGNORECASE)
        count = parameter_count(text)
        return Translation(text, None, (0,) * count, count)

    # -- rewrites ------------------------------------------------------------------------------

    def rewrite(self, tree: exp.Expression, typer: Typer) -> exp.Expression:
        """The tree with every construct DuckDB reads differently from PostgreSQL replaced."""

        def bottom_up(node: exp.Expression) -> exp.Expression:
            # Children first, so that a cast sees its operand rewritten already; the PostgreSQL
            # type the typer gave a node moves to whatever replaces it.
            for child in list(node.iter_expressions()):
                new = bottom_up(child)
                if new is not child:
                    child.replace(new)
            new = self.visit(node, typer)
            if new is not node and "pg_type" in node.meta:
                new.meta.setdefault("pg_type", node.meta["pg_type"])
            return new

        return bottom_up(tree.copy())

    def visit(self, node: exp.Expression, typer: Typer) -> exp.Expression:
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return self.cast(node)
        if isinstance(node, (exp.EQ, exp.NEQ)):
            # array_column = '{0}': PostgreSQL reads the literal as an array.
            for side, other in ((node.this, node.expression), (node.expression, node.this)):
                oid = side.meta.get("pg_type")
                # x = ANY('{a,b}'): PostgreSQL reads the literal as an array of x's type.
                listed = other.this.unnest() if isinstance(other, exp.Any) else None
                if isinstance(listed, exp.Literal) and listed.is_string and listed.this.startswith("{"):
                    array = self.data.array_of(oid) if oid and oid in self.data.types else None
                    listed.replace(self.array_literal(listed.this, array or 1009))
                    continue
                literal = isinstance(other, exp.Literal) and other.is_string and other.this.startswith("{")
                if literal and oid and self.data.element(oid) is not None:
                    other.replace(self.array_literal(other.this, oid))
            return node
        if (
            isinstance(node, exp.Bracket)
            and node.this.meta.get("pg_type") == 19
            and len(node.expressions) == 1
            and not isinstance(node.expressions[0], exp.Slice)
        ):
            # name[i]: its character at i, counted from 0 (pg_dump's typname[0] = '_'). sqlglot
            # keeps subscripts as 0-based offsets from PostgreSQL's usual 1 (i - 1), substr counts from 1.
            index = exp.Add(this=exp.Paren(this=node.expressions[0]), expression=exp.Literal.number(2))
            return exp.Anonymous(this="substr", expressions=[node.this, index, exp.Literal.number(1)])
        if isinstance(node, exp.Column) and "tableoid" in node.meta:
            return exp.Cast(
                this=exp.Literal.number(node.meta["tableoid"]),
                to=exp.DataType.build("UINTEGER", dialect="duckdb"),
            )
        bare = isinstance(node, exp.Column) and not node.args.get("table")
        if bare and node.meta.get("pg_type") == 19 and ident(node.this) in ("user", "current_role"):
            return exp.Anonymous(this="current_user", expressions=[])
        if type(node) in _SESSION_FUNCTIONS:
            return exp.Anonymous(this=_SESSION_FUNCTIONS[type(node)], expressions=[])
        if isinstance(node, exp.JSONObject):
            args: list[exp.Expression] = []
            for pair in node.expressions:
                args += [pair.this, pair.expression] if isinstance(pair, exp.JSONKeyValue) else [pair]
            return exp.Anonymous(this="json_object", expressions=args)
        if isinstance(node, exp.Anonymous) and str(node.this).lower() == "json_build_object":
            return exp.Anonymous(this="json_object", expressions=node.expressions)
        if isinstance(node, exp.DPipe):
            oid = node.meta.get("pg_type")
            if oid is not None and oid not in (22, 30) and self.data.element(oid) is not None:
                # PostgreSQL's array || treats a NULL array as empty; DuckDB's gives NULL.
                sides = [
                    exp.Coalesce(this=side, expressions=[exp.Array(expressions=[])])
                    for side in (node.this, node.expression)
                ]
                return exp.Anonymous(this="list_concat", expressions=sides)
            return node
        if isinstance(node, exp.Div) and {
            node.this.meta.get("pg_type"),
            node.expression.meta.get("pg_type"),
        } <= (INTEGER_TYPES):
            # PostgreSQL divides integers exactly as integers (7/2 = 3); DuckDB's / would give 3.5.
            return exp.IntDiv(this=node.this, expression=node.expression)
        if isinstance(node, exp.Format) and isinstance(node.this, exp.Literal) and node.this.is_string:
            return _pg_format(node.this.this, list(node.expressions))
        if (
            isinstance(node, exp.Table)
            and isinstance(node.this, exp.Func)
            and not is_table_function(node.this)
        ):
            # PostgreSQL reads a scalar function in FROM as a one-row relation whose one column is
            # named after the alias; DuckDB has only table functions there.
            # `f(…) WITH ORDINALITY AS a(value, n)`: the column names come from the alias list.
            alias_node = node.args.get("alias")
            name = (
                ident(alias_node.this)
                if alias_node is not None and alias_node.this
                else (function_name(node.this) or "f")
            )
            listed = [ident(c) for c in alias_node.columns] if alias_node is not None else []
            value = listed[0] if listed else name
            select = exp.select(exp.alias_(node.this.copy(), value, quoted=True))
            if node.args.get("ordinality"):
                number = exp.Window(this=exp.RowNumber())
                select = exp.select(
                    exp.column(value, quoted=True),
                    exp.alias_(number, listed[1] if len(listed) > 1 else "ordinality", quoted=True),
                ).from_(select.subquery("__f"))
            return exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True)))
        if isinstance(node, exp.Unnest) and isinstance(node.parent, (exp.From, exp.Join)):
            return self.unnest_in_from(node)
        if isinstance(node, exp.Parameter):
            oid = typer.params.get(param_index(node))
            if oid and not isinstance(node.parent, (exp.Cast, exp.TryCast)):
                # A parameter PostgreSQL would type: DuckDB converts the client's value to it.
                return exp.Cast(
                    this=node.copy(), to=exp.DataType.build(duck_type(oid, self.data), dialect="duckdb")
                )
        return node

    def unnest_in_from(self, node: exp.Unnest) -> exp.Expression:
        """unnest(a, b, …) [WITH ORDINALITY] in FROM, as PostgreSQL reads it: the arrays side by side,
        the shorter ones padded with NULLs, then the row number (Django's introspection of indexes,
        `unnest(i.indkey, i.indoption) WITH ORDINALITY koi(key, option, arridx)`). DuckDB's unnest
        takes one list; several unnests in one SELECT list run side by side and pad as PostgreSQL's."""
        ordinality = node.args.get("offset")
        arrays = list(node.expressions)
        if len(arrays) < 2 and not isinstance(ordinality, exp.Identifier):
            return node
        alias = node.args.get("alias")
        name = ident(alias.this) if isinstance(alias, exp.TableAlias) and alias.this else "unnest"
        listed = [ident(c) for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
        names = [listed[i] if i < len(listed) else "unnest" for i in range(len(arrays))]
        items = [
            exp.alias_(exp.Unnest(expressions=[array.copy()]), names[i], quoted=True)
            for i, array in enumerate(arrays)
        ]
        if isinstance(ordinality, exp.Identifier):
            lengths = [
                exp.Coalesce(
                    this=exp.Anonymous(this="len", expressions=[a.copy()]),
                    expressions=[exp.Literal.number(0)],
                )
                for a in arrays
            ]
            longest = (
                exp.Greatest(this=lengths[0], expressions=lengths[1:]) if len(lengths) > 1 else lengths[0]
            )
            numbers = exp.Anonymous(
                this="range",
                expressions=[exp.Literal.number(1), exp.Add(this=longest, expression=exp.Literal.number(1))],
            )
            count = exp.Cast(
                this=exp.Unnest(expressions=[numbers]), to=exp.DataType.build(exp.DataType.Type.BIGINT)
            )
            items.append(exp.alias_(count, ident(ordinality), quoted=True))
        return exp.Subquery(
            this=exp.select(*items), alias=exp.TableAlias(this=exp.to_identifier(name, quoted=True))
        )

    def array_literal(self, text: str, array_oid: int) -> exp.Expression:
        element = self.data.element(array_oid) or 25
        values = [exp.Null() if v is None else exp.Literal.string(v) for v in parse_pg_array(text)]
        duck = duck_type(element, self.data)
        return exp.Cast(
            this=exp.Array(expressions=values), to=exp.DataType.build(duck + "[]", dialect="duckdb")
        )

    def cast(self, node: exp.Cast | exp.TryCast) -> exp.Expression:
        data = self.data
        target = node.meta.get("pg_type") or type_oid_from_name(node.to.sql("postgres"), data)
        inner = node.this
        inner_type = inner.meta.get("pg_type")
        if inner_type is None and isinstance(inner, exp.Anonymous):
            inner_type = RETURNS.get(str(inner.this).lower())
        if target is None:
            return exp.Cast(this=inner, to=exp.DataType.build(exp.DataType.Type.VARCHAR))
        element = data.element(target) if target not in (22, 30) else None
        if element in REG_TYPES:
            # oidvector or oid[] as regtype[] …: OIDs inside, named when cast to text[].
            return exp.Cast(this=inner, to=exp.DataType.build("UINTEGER[]", dialect="duckdb"))
        inner_element = (
            data.element(inner_type) if inner_type is not None and inner_type not in (22, 30) else None
        )
        if inner_element in REG_TYPES and element in TEXT_TYPES:
            return exp.Anonymous(this=f"__{REG_TYPES[inner_element]}_array_out", expressions=[inner])
        if target in REG_TYPES:
            if inner_type in OID_LIKE or inner_type in INTEGER_TYPES:
                # Already an OID: no lookup, and no nested macro (DuckDB would expand it again and again).
                return exp.Cast(this=inner, to=exp.DataType.build("UINTEGER", dialect="duckdb"))
            return exp.Anonymous(this=f"__to_{REG_TYPES[target]}", expressions=[inner])
        if target in TEXT_TYPES and inner_type in REG_TYPES:
            return exp.Anonymous(this=f"__{REG_TYPES[inner_type]}_out", expressions=[inner])
        if target in TEXT_TYPES and inner_type in (22, 30):
            return exp.Anonymous(this="__vector_out", expressions=[inner])
        if target in TEXT_TYPES and inner_type is not None and data.element(inner_type) is not None:
            return exp.Anonymous(this="__array_out", expressions=[inner])
        if target == 18:  # "char": the first character
            text = exp.Cast(this=inner, to=exp.DataType.build(exp.DataType.Type.VARCHAR))
            return exp.Anonymous(this="left", expressions=[text, exp.Literal.number(1)])
        literal = isinstance(inner, exp.Literal) and inner.is_string
        if target in (22, 30) and literal:  # '1 2'::int2vector
            values = [exp.Literal.number(v) for v in inner.this.split()]
            element = "SMALLINT[]" if target == 22 else "UINTEGER[]"
            return exp.Cast(
                this=exp.Array(expressions=values), to=exp.DataType.build(element, dialect="duckdb")
            )
        if literal and target not in (22, 30) and data.element(target) is not None:
            return self.array_literal(inner.this, target)
        if target == 1700:
            to = node.to if node.to.expressions else exp.DataType.build("DECIMAL(38, 10)")
            return exp.Cast(this=inner, to=to)
        duck = duck_type(target, data)
        return exp.Cast(this=inner, to=exp.DataType.build(duck, dialect="duckdb"))
