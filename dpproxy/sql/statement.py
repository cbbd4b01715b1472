"""One statement's text: parsing it (PostgreSQL's dialect, exactly one statement), binding its
parameters $1, $2, … to constants before planning, and inferring their types from where they stand,
as PostgreSQL does for an untyped Parse. Nothing here knows the policy's rules or runs SQL."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError

from dpproxy.errors import InvalidParameter, SyntaxProblem
from dpproxy.policy import Policy
from dpproxy.sql import limits, literals, postprocess
from dpproxy.sql.nodes import without_positions
from dpproxy.sql.positions import syntax_problem
from dpproxy.sql.types import PgType, from_column_type, from_sqlglot

_POSTGRES = Dialect.get_or_raise("postgres")


def parse_statement(sql: str) -> exp.Expression:
    """Parse exactly one PostgreSQL statement, held to the statement limits (dpproxy.sql.limits):
    its length before it is read, its tokens before they are parsed, its tree before anything
    analyses it; past any of them, StatementTooComplex (54001)."""
    limits.check_length(sql)
    try:
        tokens = _POSTGRES.tokenize(sql)
        limits.check_sqlglot_tokens(tokens)
        with limits.refuse_deep_recursion():
            statements = [s for s in _POSTGRES.parser().parse(tokens, sql) if s is not None]
    except ParseError as e:
        raise syntax_problem(e, sql, hint="dpproxy reads PostgreSQL's SQL dialect") from None
    except sqlglot.errors.TokenError as e:
        raise SyntaxProblem(f"syntax error: {e}") from None
    if not statements:
        raise SyntaxProblem("empty query")
    if len(statements) > 1:
        raise SyntaxProblem("expected one statement, found several", hint="send statements one at a time")
    statement = _bound_forms(_to_chars(_date_casts(_every(_plain_negations(statements[0])))))
    limits.check_tree(statement, planned=True)
    return without_positions(statement)


def _plain_negations(tree: exp.Expression) -> exp.Expression:
    """`x IS NOT NULL`, `x IS NOT TRUE`, `x NOT LIKE p` and `x NOT ILIKE p` as NOT over the plain
    predicate (`NOT x IS NULL`, the same in PostgreSQL's grammar): sqlglot reads them as one node
    flagged `negate`, and a rewrite that rebuilds the node from its operands drops the flag. It did:
    `WHERE dep_delay IS NOT NULL` counted the rows where dep_delay is NULL."""
    for node in list(tree.find_all(exp.Is, exp.Like, exp.ILike)):
        if not node.args.get("negate"):
            continue
        node.set("negate", None)
        parent = node.parent
        negated = parent if isinstance(parent, exp.Escape) and node.arg_key == "this" else node
        negated.replace(exp.Not(this=negated.copy()))
    return tree


def _every(tree: exp.Expression) -> exp.Expression:
    """`every(b)`, PostgreSQL's SQL-standard name of `bool_and(b)`, as that aggregate (sqlglot reads
    it as an unknown function, which was taken for a raw row value)."""
    for node in list(tree.find_all(exp.Anonymous)):
        if node.name.lower() == "every" and len(node.expressions) == 1:
            node.replace(exp.LogicalAnd(this=node.expressions[0].copy()))
    return tree


def _date_casts(tree: exp.Expression) -> exp.Expression:
    """`date(x)`, PostgreSQL's function of a timestamp or text (what Ibis sends for `.date()`), as the
    cast it is, `CAST(x AS date)`: sqlglot reads it as a node of its own that no rule accepted."""
    for node in list(tree.find_all(exp.Date)):
        if {k for k, v in node.args.items() if v} == {"this"}:
            cast: exp.Expression = exp.Cast(this=node.this.copy(), to=exp.DataType.build("date"))
            if isinstance(node.parent, exp.Select) and node.arg_key == "expressions":
                cast = exp.alias_(cast, "date")  # an output keeps PostgreSQL's name for it
            node.replace(cast)
    return tree


# to_char's numeric date fields (as sqlglot reads them: strftime's), each an extract field padded with
# zeros to its width, and the separators between them.
_TO_CHAR_FIELDS = {
    "%Y": ("year", 4),
    "%m": ("month", 2),
    "%d": ("day", 2),
    "%H": ("hour", 2),
    "%M": ("minute", 2),
}
_TO_CHAR_SEPARATORS = set("-/:. T")


def _to_chars(tree: exp.Expression) -> exp.Expression:
    """`to_char(t, 'YYYY-MM')` (Ibis's `.strftime('%Y-%m')`) of the numeric fields YYYY, MM, DD, HH24
    and MI with separators, as the text PostgreSQL writes: each field's extract, zero-padded, joined
    with `||` (NULL for a NULL t), `right('000' || CAST(CAST(extract(year FROM t) AS integer) AS
    text), 4) || '-' || …`. Other patterns are left as written (and refused)."""
    for node in list(tree.find_all(exp.TimeToStr)):
        pattern = node.args.get("format")
        if not (isinstance(pattern, exp.Literal) and pattern.is_string) or node.args.get("zone"):
            continue
        parts = _to_char_parts(pattern.this, node.this)
        if parts is None:
            continue
        text = parts[0]
        for part in parts[1:]:
            text = exp.DPipe(this=text, expression=part, safe=True)
        replacement: exp.Expression = exp.Paren(this=text)
        if isinstance(node.parent, exp.Select) and node.arg_key == "expressions":
            replacement = exp.alias_(replacement, "to_char")  # PostgreSQL's name for the output
        node.replace(replacement)
    return tree


def _to_char_parts(pattern: str, moment: exp.Expression) -> list[exp.Expression] | None:
    parts: list[exp.Expression] = []
    i = 0
    while i < len(pattern):
        field = _TO_CHAR_FIELDS.get(pattern[i : i + 2])
        if field is not None:
            name, width = field
            extracted = exp.Extract(this=exp.Var(this=name.upper()), expression=moment.copy())
            number = exp.Cast(
                this=exp.Cast(this=extracted, to=exp.DataType.build("int")), to=exp.DataType.build("text")
            )
            padded = exp.DPipe(this=exp.Literal.string("0" * (width - 1)), expression=number, safe=True)
            parts.append(exp.Right(this=padded, expression=exp.Literal.number(width)))
            i += 2
        elif pattern[i] in _TO_CHAR_SEPARATORS:
            parts.append(exp.Literal.string(pattern[i]))
            i += 1
        else:
            return None
    return parts or None


_UNIT_SLOTS = {exp.TimestampTrunc: "unit", exp.DateTrunc: "unit", exp.Extract: "this"}


def _unit_slots(tree: exp.Expression) -> Iterator[tuple[exp.Expression, str, exp.Expression]]:
    """Each date_trunc unit and extract/date_part field: (its call, its argument's name, what stands
    there once parentheses and casts to text are taken off)."""
    for node in tree.find_all(*_UNIT_SLOTS):
        key = _UNIT_SLOTS[type(node)]
        inner = node.args.get(key)
        while isinstance(inner, exp.Paren) or (
            isinstance(inner, exp.Cast) and from_sqlglot(inner.args["to"]).is_text
        ):
            inner = inner.this
        if inner is not None:
            yield node, key, inner


def _plain_units(tree: exp.Expression) -> exp.Expression:
    """`date_trunc('month'::varchar, x)` as `date_trunc('month', x)`: SQLAlchemy over psycopg 3
    writes every string parameter so (`date_trunc(%(p)s::VARCHAR, …)`), and PostgreSQL reads it as
    the text it casts."""
    for node, key, inner in list(_unit_slots(tree)):
        if isinstance(inner, exp.Literal) and inner.is_string and node.args.get(key) is not inner:
            node.set(key, inner.copy())
    return tree


def _any_operand(node: exp.Expression) -> tuple[exp.Expression, exp.DataType | None]:
    """What `= ANY(…)` compares with, parentheses off, and the element type of a cast to an array
    (`$1::text[]`) taken off it (None without one)."""
    inner = node.this
    element = None
    while isinstance(inner, exp.Paren) or (isinstance(inner, exp.Cast) and inner.to.is_type("array")):
        if isinstance(inner, exp.Cast):
            element = inner.to.expressions[0] if inner.to.expressions else None
        inner = inner.this
    return inner, element


def _any_lists(tree: exp.Expression) -> exp.Expression:
    """`x = ANY(ARRAY[a, b])`, and `x = ANY($1)` once a list is bound to $1 (psycopg's way to pass an
    IN list), as `x IN (a, b)`, which PostgreSQL computes alike; an empty array is FALSE (no element
    equals x, even a NULL x). A cast to an array type casts each element."""
    for node in list(tree.find_all(exp.EQ)):
        if not isinstance(node.expression, exp.Any):
            continue
        inner, element = _any_operand(node.expression)
        if not isinstance(inner, exp.Array):
            continue
        items = [item.copy() for item in inner.expressions]
        if element is not None and not from_sqlglot(element).is_text:
            items = [exp.Cast(this=item, to=element.copy()) for item in items]
        node.replace(exp.In(this=node.this.copy(), expressions=items) if items else exp.false())
    return tree


def _starts_with(tree: exp.Expression) -> exp.Expression:
    """`starts_with(x, 'ab')` (PostgreSQL's function, Ibis's `.startswith`) as `left(x, 2) = 'ab'`,
    which PostgreSQL computes alike (NULL for a NULL x), for a constant prefix."""
    for node in list(tree.find_all(exp.StartsWith)):
        prefix = node.expression
        if isinstance(prefix, exp.Literal) and prefix.is_string:
            start = exp.Left(this=node.this.copy(), expression=exp.Literal.number(len(prefix.this)))
            node.replace(exp.Paren(this=exp.EQ(this=start, expression=prefix.copy())))
    return tree


def _bound_forms(tree: exp.Expression) -> exp.Expression:
    """The spellings read as PostgreSQL reads them once constants stand where they go (at parse and
    again after parameters are bound): units cast to text, `= ANY(array)`, `starts_with`."""
    return _starts_with(_any_lists(_plain_units(tree)))


def array_parameters(tree: exp.Expression) -> set[int]:
    """The parameters (0-based) that stand as the array of `x = ANY(…)`: analysed before their values
    are known with a one-element list."""
    operands = (_any_operand(node)[0] for node in tree.find_all(exp.Any))
    return {i for i in map(_parameter_index, operands) if i is not None}


def _parameter_index(node: exp.Expression) -> int | None:
    """$n's index from 0; None for anything else."""
    if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return int(node.this.this) - 1
    return None


def unit_parameters(tree: exp.Expression) -> set[int]:
    """The parameters (0-based) that stand as a date_trunc unit or an extract field: analysed
    before their values are known with one that is valid there (`day`), not any text."""
    return {i for i in (_parameter_index(inner) for _, _, inner in _unit_slots(tree)) if i is not None}


def placeholders(tree: exp.Expression, types: Sequence[PgType], contexts: Sequence[PgType]) -> list[object]:
    """Values to analyse a statement with before its parameters are known: one of each parameter's
    type (literals.placeholder_value, text that parses as its context's type), a unit where a
    date_trunc unit or extract field stands, a one-element list where `= ANY(…)`'s array does."""
    units, arrays = unit_parameters(tree), array_parameters(tree)
    values: list[object] = [
        "day" if i in units else literals.placeholder_value(t, contexts[i] if i < len(contexts) else None)
        for i, t in enumerate(types)
    ]
    return [[value] if i in arrays else value for i, value in enumerate(values)]


def bind_parameters(tree: exp.Expression, params: Sequence[object]) -> exp.Expression:
    """Replace $1, $2, … by constants before planning, so a plan never depends on later values."""

    def substitute(node: exp.Expression) -> exp.Expression:
        position = _parameter_index(node)
        if position is not None:
            index = position + 1
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
    return _bound_forms(tree.transform(substitute, copy=True))


def parameter_count(tree: exp.Expression) -> int:
    """The highest $n the statement uses."""
    return max((i + 1 for i in map(_parameter_index, tree.walk()) if i is not None), default=0)


# Arguments whose type PostgreSQL's signature fixes (a client that types its values from the
# ParameterDescription, asyncpg, sends them so): substring's start and length, left/right's count,
# round's digits, a percentile's fraction.
_ARGUMENT_TYPES: dict[tuple[type[exp.Expression], str], PgType] = {
    (exp.Substring, "start"): PgType.INT4,
    (exp.Substring, "length"): PgType.INT4,
    (exp.Left, "expression"): PgType.INT4,
    (exp.Right, "expression"): PgType.INT4,
    (exp.Round, "decimals"): PgType.INT4,
    (exp.PercentileCont, "this"): PgType.FLOAT8,
    (exp.PercentileDisc, "this"): PgType.FLOAT8,
}


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
        index = _parameter_index(node)
        if index is None or types[index] is not None:
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
        elif isinstance(parent, exp.Cast) and not parent.to.is_type(exp.DataType.Type.ARRAY):
            guess = from_sqlglot(parent.args["to"])
        elif isinstance(parent, exp.Cast) and parent.to.expressions:  # $1::text[]: its elements' type
            guess = from_sqlglot(parent.to.expressions[0])
        elif isinstance(parent, exp.Any):  # = ANY($1): the other side's
            while isinstance(parent, (exp.Any, exp.Paren)):
                parent = parent.parent
            guess = type_of(parent.this) if isinstance(parent, exp.EQ) else None
        else:
            guess = _ARGUMENT_TYPES.get((type(parent), node.arg_key))
        types[index] = guess if guess not in (None, PgType.UNKNOWN) else PgType.TEXT
    return tuple(t or PgType.TEXT for t in types)
