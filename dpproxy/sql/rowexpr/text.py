"""Text functions in row expressions: lower/upper (ASCII letters only), length, substring (with
PostgreSQL's meaning for starts below 1), trim, left/right, concat and ||, replace, strpos."""

from __future__ import annotations

from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import InvalidParameter, NotSupported, UndefinedFunction
from dpproxy.sql.intervals import Interval
from dpproxy.sql.rowexpr.constants import int_argument, string_argument
from dpproxy.sql.rowexpr.typed import Typed, number_literal, typed_node
from dpproxy.sql.types import INTEGER_RANGE, PgType

_ASCII_UPPER_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_ASCII_LOWER_LETTERS = "abcdefghijklmnopqrstuvwxyz"

ASCII_LOWER_TABLE = str.maketrans(_ASCII_UPPER_LETTERS, _ASCII_LOWER_LETTERS)

# The most a text expression may grow (Typed.growth): 64 times the longest column value or constant
# of the statement. Concatenating a few columns, or replacing a separator by a slightly longer one,
# stays far below it; nested replaces by long texts, which build gigabytes from one character, do not.
TEXT_GROWTH_LIMIT = 64


def _ascii_case(value: exp.Expression, *, lower: bool) -> exp.Expression:
    """lower() or upper() of ASCII letters only, through TRANSLATE, which both engines have."""
    letters = (_ASCII_UPPER_LETTERS, _ASCII_LOWER_LETTERS)
    source, target = letters if lower else letters[::-1]
    return exp.Anonymous(
        this="TRANSLATE", expressions=[value, exp.Literal.string(source), exp.Literal.string(target)]
    )


def ascii_lower(value: exp.Expression) -> exp.Expression:
    return _ascii_case(value, lower=True)


class TextRules:
    """The text rules of RowExpressionChecker (a mixin: `check` and `scope` are the checker's)."""

    def _text(self, node: exp.Expression | None, what: str) -> Typed:
        return self.argument(node, what, "text", lambda t: t.is_text)

    def _text_to_text(self, node: exp.Expression) -> Typed:
        name = node.sql_name().lower()
        if isinstance(node, exp.Initcap):
            raise NotSupported(
                f"initcap() is not supported ({self.scope.clause}): the engines split words differently",
                hint="use lower() or upper()",
            )
        if node.args.get("expression") is not None:
            raise NotSupported(f"{name}() takes one argument here")
        inner = self._text(node.this, f"{name}()")
        # ASCII letters only, alike on every engine: PostgreSQL maps other letters by its
        # collation's locale (or not at all under "C"), DuckDB by Unicode.
        sql = _ascii_case(inner.sql, lower=isinstance(node, exp.Lower))
        return Typed(sql, PgType.TEXT, None, inner.uses_unit, inner.constant, growth=inner.growth)

    def _length(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "length()")
        return Typed(
            typed_node(exp.Length(this=inner.sql), PgType.INT4),
            PgType.INT4,
            Interval(Decimal(0), Decimal(INTEGER_RANGE[PgType.INT4][1])),
            inner.uses_unit,
            inner.constant,
        )

    def _substring(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "substring()")
        start = int_argument(node.args.get("start"), "the start of substring()")
        length: int | None = None
        if node.args.get("length") is not None:
            length = int_argument(node.args.get("length"), "the length of substring()")
            if length < 0:
                raise InvalidParameter("the length of substring() must not be negative")
        if start < 1:
            # PostgreSQL counts characters before the first one (substring('abc', 0, 2) is 'a');
            # DuckDB counts a start below 1 from the end. Written from position 1, they agree.
            length = None if length is None else max(0, length + start - 1)
            start = 1
        args: dict[str, exp.Expression] = {"this": inner.sql, "start": exp.Literal.number(start)}
        if length is not None:
            args["length"] = exp.Literal.number(length)
        return Typed(
            exp.Substring(**args), PgType.TEXT, None, inner.uses_unit, inner.constant, growth=inner.growth
        )

    def _trim(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "trim()")
        args: dict[str, object] = {"this": inner.sql}
        if node.args.get("expression") is not None:
            args["expression"] = exp.Literal.string(
                string_argument(node.expression, "the characters of trim()")
            )
        if node.args.get("position"):
            args["position"] = node.args["position"]
        return Typed(
            exp.Trim(**args), PgType.TEXT, None, inner.uses_unit, inner.constant, growth=inner.growth
        )

    def _left_right(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, f"{node.sql_name().lower()}()")
        count = int_argument(node.expression, f"the length of {node.sql_name().lower()}()")
        sql = type(node)(this=inner.sql, expression=number_literal(count))
        return Typed(sql, PgType.TEXT, None, inner.uses_unit, inner.constant, growth=inner.growth)

    def _concat(self, node: exp.Expression) -> Typed:
        args = node.expressions if isinstance(node, exp.Concat) else [node.this, node.expression]
        parts = [self.check(a) for a in args]
        for part, arg in zip(parts, args, strict=True):
            if not (
                part.type.is_text or part.type.is_number or part.type.is_temporal or part.type is PgType.BOOL
            ):
                raise UndefinedFunction(f"cannot concatenate {arg.sql('postgres')}")
            if part.type.is_number and not part.exact_integer:
                raise NotSupported(
                    f"concatenating {part.type.value} values is not supported ({self.scope.clause}): the "
                    "engines write fractional numbers differently",
                    hint="round it to an integer first, e.g. CAST(ROUND(x) AS integer)",
                )
        casted = [
            p.sql if p.type.is_text else exp.Cast(this=p.sql, to=exp.DataType.build(exp.DataType.Type.TEXT))
            for p in parts
        ]
        if isinstance(node, exp.Concat):
            sql: exp.Expression = exp.Concat(expressions=casted, safe=True, coalesce=True)
        else:
            sql = exp.DPipe(this=casted[0], expression=casted[1], safe=True)
        growth = self._bounded_growth(
            sum(p.growth for p in parts), "concat()" if isinstance(node, exp.Concat) else "||"
        )
        uses_unit, constant = any(p.uses_unit for p in parts), all(p.constant for p in parts)
        return Typed(sql, PgType.TEXT, None, uses_unit, constant, growth=growth)

    def _replace(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "replace()")
        find = string_argument(node.expression, "the search text of replace()")
        replacement = string_argument(node.args.get("replacement"), "the replacement of replace()")
        sql = exp.Replace(
            this=inner.sql, expression=exp.Literal.string(find), replacement=exp.Literal.string(replacement)
        )
        # Each occurrence of the search text becomes the replacement: the text grows by their ratio
        # at most (an empty search text finds nothing on either engine).
        ratio = -(-len(replacement) // len(find)) if find else 1
        growth = self._bounded_growth(inner.growth * max(1, ratio), "replace()")
        return Typed(sql, PgType.TEXT, None, inner.uses_unit, inner.constant, growth=growth)

    def _bounded_growth(self, growth: int, what: str) -> int:
        """`growth` (Typed.growth) when at most TEXT_GROWTH_LIMIT, else refused: a text built longer
        than the backend can hold fails (PostgreSQL past 1 GB, DuckDB past 4 GiB, and DuckDB's
        database is then unusable), and whether it does would depend on the rows a CASE lets
        through — one person's value decided by a query's success (an adversarial review
        read an age in seven queries so)."""
        if growth > TEXT_GROWTH_LIMIT:
            raise NotSupported(
                f"{what} could build a text {growth} times as long as a column value or constant of "
                f"the statement ({self.scope.clause}); at most {TEXT_GROWTH_LIMIT} times is accepted, "
                "so that no row's text outgrows what the database can hold",
                hint="concatenate fewer values, or replace with a text no longer than the one searched",
            )
        return growth

    def _strpos(self, node: exp.Expression) -> Typed:
        inner = self._text(node.this, "strpos()")
        needle = string_argument(node.args.get("substr"), "the search text of strpos()")
        if node.args.get("position") is not None:
            raise NotSupported("strpos() takes two arguments")
        sql = exp.StrPosition(this=inner.sql, substr=exp.Literal.string(needle))
        return Typed(
            typed_node(sql, PgType.INT4),
            PgType.INT4,
            Interval(Decimal(0), Decimal(INTEGER_RANGE[PgType.INT4][1])),
            inner.uses_unit,
            inner.constant,
        )
