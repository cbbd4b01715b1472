"""Conditions and conditional values in row expressions: comparisons, AND/OR/NOT, IS, IN, BETWEEN,
LIKE, CASE, COALESCE, GREATEST, LEAST and NULLIF — their operands written in one representation both
engines compare alike (exact numbers or doubles; text under COLLATE "C" when ordered)."""

from __future__ import annotations

from decimal import Decimal

from sqlglot import exp

from dpproxy.errors import DatatypeMismatch, InvalidText, NotSupported
from dpproxy.sql.intervals import hull
from dpproxy.sql.rowexpr.arithmetic import extreme_interval
from dpproxy.sql.rowexpr.constants import check_castable_text, string_argument, typed_constant
from dpproxy.sql.rowexpr.text import ASCII_LOWER_TABLE, ascii_lower
from dpproxy.sql.rowexpr.typed import Typed, typed_node
from dpproxy.sql.types import PgType, arithmetic_result, check_comparable, type_family


class PredicateRules:
    """The condition rules of RowExpressionChecker (a mixin: `check` and `scope` are the checker's)."""

    def _comparable(self, left: Typed, right: Typed, node: exp.Expression) -> None:
        for one, other in ((left, right), (right, left)):
            if (
                one.type is PgType.UNKNOWN
                and isinstance(one.sql, exp.Literal)
                and other.type is not PgType.UNKNOWN
            ):
                check_castable_text(one.sql.this, other.type)
                return
        check_comparable(left.type, right.type, node, self.scope.clause)

    def _typed_constants(self, parts: list[Typed]) -> list[Typed]:
        """Untyped string constants next to typed values, as constants of that type written from
        their value ('2024-01-31' beside a date becomes DATE '2024-01-31'), so no engine guesses."""
        known = [p.type for p in parts if p.type is not PgType.UNKNOWN and not isinstance(p.sql, exp.Null)]
        if not known:
            return parts
        target = known[0]
        return [typed_constant(p, target) if p.type is PgType.UNKNOWN else p for p in parts]

    def _operands(self, parts: list[Typed], *, ordered: bool) -> list[exp.Expression]:
        """The SQL of values compared or merged together, in one representation: numbers as
        _exact_or_double makes them, text under the "C" collation when it is ordered (PostgreSQL
        orders text by the database's collation, DuckDB by code point)."""
        if any(p.type.is_number for p in parts):
            sqls, _ = self._exact_or_double(parts)
            return sqls
        values = [p for p in parts if not isinstance(p.sql, exp.Null)]
        if ordered and values and all(p.type.is_text for p in values):
            return [p.sql if isinstance(p.sql, exp.Null) else bytewise_text(p.sql) for p in parts]
        return [p.sql for p in parts]

    def _comparison(self, node: exp.Expression) -> Typed:
        left, right = self.check(node.left), self.check(node.right)
        self._comparable(left, right, node)
        left, right = self._typed_constants([left, right])
        ordered = isinstance(node, (exp.GT, exp.GTE, exp.LT, exp.LTE))
        lsql, rsql = self._operands([left, right], ordered=ordered)
        return Typed(
            type(node)(this=_operand(lsql), expression=_operand(rsql)),
            PgType.BOOL,
            None,
            left.uses_unit or right.uses_unit,
            left.constant and right.constant,
        )

    def _boolean(self, node: exp.Expression) -> Typed:
        """A condition (WHERE, ON, HAVING, CASE WHEN, AND/OR/NOT, IS TRUE): boolean, or an untyped
        string constant read as one now, as PostgreSQL reads 't' or 'yes' ('abc': 22P02 whatever
        the data). Sent as written, DuckDB would cast it only when a row reaches it: an error
        that says whether anyone is there."""
        typed = self.check(node)
        if typed.type is PgType.UNKNOWN:
            return typed_constant(typed, PgType.BOOL)
        if typed.type is not PgType.BOOL:
            raise DatatypeMismatch(
                f"argument of {self.scope.clause} must be boolean, not {typed.type.value}: "
                f"{node.sql('postgres')}"
            )
        return typed

    def condition(self, node: exp.Expression) -> Typed:
        return self._boolean(node)

    def _logical(self, node: exp.Expression) -> Typed:
        left, right = self._boolean(node.left), self._boolean(node.right)
        return Typed(
            type(node)(this=left.sql, expression=right.sql),
            PgType.BOOL,
            None,
            left.uses_unit or right.uses_unit,
            left.constant and right.constant,
        )

    def _not(self, node: exp.Expression) -> Typed:
        inner = self._boolean(node.this)
        return Typed(exp.Not(this=inner.sql), PgType.BOOL, None, inner.uses_unit, inner.constant)

    def _is(self, node: exp.Expression) -> Typed:
        target = node.expression
        if not isinstance(target, (exp.Null, exp.Boolean)):
            raise NotSupported(f"IS {target.sql('postgres')} is not supported; use IS [NOT] NULL/TRUE/FALSE")
        inner = self._boolean(node.this) if isinstance(target, exp.Boolean) else self.check(node.this)
        return Typed(
            exp.Is(this=inner.sql, expression=target.copy()),
            PgType.BOOL,
            None,
            inner.uses_unit,
            inner.constant,
        )

    def _in(self, node: exp.Expression) -> Typed:
        if node.args.get("unnest") is not None or node.args.get("query") is not None:
            # IN (SELECT …) over public tables arrives here answered, as a list of constants.
            raise self._unsupported(exp.Subquery())
        inner = self.check(node.this)
        if not node.expressions:
            # An inlined subquery that returned no rows: x IN (empty) is false, even for NULL x.
            return Typed(exp.false(), PgType.BOOL, None, inner.uses_unit, inner.constant)
        items = [self.check(e) for e in node.expressions]
        for item in items:
            self._comparable(inner, item, node)
        parts = self._typed_constants([inner, *items])
        sqls = self._operands(parts, ordered=False)
        return Typed(
            exp.In(this=sqls[0], expressions=sqls[1:]),
            PgType.BOOL,
            None,
            inner.uses_unit or any(i.uses_unit for i in items),
            inner.constant and all(i.constant for i in items),
        )

    def _between(self, node: exp.Expression) -> Typed:
        if node.args.get("symmetric"):
            raise NotSupported(
                f"BETWEEN SYMMETRIC is not supported ({self.scope.clause})", hint="write the bounds in order"
            )
        inner, low, high = self.check(node.this), self.check(node.args["low"]), self.check(node.args["high"])
        self._comparable(inner, low, node)
        self._comparable(inner, high, node)
        parts = self._typed_constants([inner, low, high])
        sqls = self._operands(parts, ordered=True)
        sql = exp.Between(this=sqls[0], low=sqls[1], high=sqls[2])
        return Typed(sql, PgType.BOOL, None, inner.uses_unit or low.uses_unit or high.uses_unit)

    def _like(self, node: exp.Expression, escape: exp.Expression | None = None) -> Typed:
        inner = self._text(node.this, "LIKE")  # dpproxy.sql.rowexpr.text
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise NotSupported(
                f"the pattern of {type(node).__name__.upper()} must be a string constant "
                f"({self.scope.clause})"
            )
        escape_char = "\\"
        if escape is not None:
            escape_char = string_argument(escape, "the ESCAPE of LIKE")
            if len(escape_char) != 1:
                raise InvalidText("the ESCAPE of LIKE must be one character")
        text = pattern.this
        trailing = len(text) - len(text.rstrip(escape_char))
        if trailing % 2 == 1:
            raise InvalidText(
                f"LIKE pattern {text!r} must not end with the escape character",
                hint="escape it twice to match it literally",
            )
        value = inner.sql
        if isinstance(node, exp.ILike):
            # Case-insensitive as ASCII letters only, alike on every engine (PostgreSQL folds other
            # letters by its collation's locale, DuckDB by Unicode).
            value, text = ascii_lower(value), text.translate(ASCII_LOWER_TABLE)
        # The escape character is always written: PostgreSQL's default is a backslash, DuckDB has none.
        sql = exp.Escape(
            this=exp.Like(this=value, expression=exp.Literal.string(text)),
            expression=exp.Literal.string(escape_char),
        )
        return Typed(sql, PgType.BOOL, None, inner.uses_unit)

    def _escape(self, node: exp.Expression) -> Typed:
        like = node.this
        if not isinstance(like, (exp.Like, exp.ILike)):
            raise self._unsupported(node)
        return self._like(like, node.expression)

    def _merge_types(self, parts: list[Typed], node: exp.Expression) -> PgType:
        known = [p.type for p in parts if p.type is not PgType.UNKNOWN]
        if not known:
            return PgType.TEXT
        families = {type_family(t) for t in known}
        if len(families) > 1:
            raise DatatypeMismatch(
                f"{node.sql('postgres')} mixes {' and '.join(sorted(families))} values ({self.scope.clause})"
            )
        result = known[0]
        for t in known[1:]:
            if result.is_number:
                result = arithmetic_result(result, t)
            elif result != t:
                result = PgType.TEXT if result.is_text else PgType.TIMESTAMP
        for p in parts:
            if p.type is PgType.UNKNOWN and isinstance(p.sql, exp.Literal):
                check_castable_text(p.sql.this, result)
        return result

    def _merged(
        self, parts: list[Typed], node: exp.Expression, *, ordered: bool = False
    ) -> tuple[list[exp.Expression], PgType, bool, Decimal, bool]:
        """Values of CASE branches and of COALESCE/GREATEST/LEAST/NULLIF arguments in one
        representation: their SQL, their PostgreSQL type, whether doubles, smallest magnitude, and
        whether DECIMAL(38, 10) (`Typed.wide`)."""
        pg_type = self._merge_types(parts, node)
        parts = self._typed_constants(parts)
        if pg_type.is_number:
            sqls, double = self._exact_or_double(parts)
            smallest = min(self._smallest(p) for p in parts) if double else Decimal(1)
            return sqls, pg_type, double, smallest, not double and any(p.wide for p in parts)
        return self._operands(parts, ordered=ordered), pg_type, False, Decimal(1), False

    def _case(self, node: exp.Expression) -> Typed:
        operand = node.args.get("this")
        operand_typed = self.check(operand) if operand is not None else None
        conditions: list[Typed] = []
        values: list[Typed] = []
        for branch in node.args.get("ifs") or []:
            cond = self.check(branch.this) if operand_typed is not None else self._boolean(branch.this)
            if operand_typed is not None:
                self._comparable(operand_typed, cond, node)
            conditions.append(cond)
            values.append(self.check(branch.args["true"]))
        default = node.args.get("default")
        default_typed = self.check(default) if default is not None else None
        all_values = values + ([default_typed] if default_typed is not None else [])
        sqls, pg_type, double, smallest, wide = self._merged(all_values, node)
        number_values = [v for v in all_values if not isinstance(v.sql, exp.Null)]
        interval = hull([v.interval for v in number_values]) if pg_type.is_number and number_values else None
        condition_sqls = [c.sql for c in conditions]
        operand_sql = None
        if operand_typed is not None:
            # CASE x WHEN a …: the operand is compared with each WHEN value, in one representation.
            compared = self._operands(self._typed_constants([operand_typed, *conditions]), ordered=False)
            operand_sql, condition_sqls = compared[0], compared[1:]
        # Copies of the branches (as Case.when makes), without copying the whole CASE at each WHEN.
        case = exp.Case(
            this=operand_sql,
            ifs=[
                exp.If(this=condition.copy(), true=value.copy())
                for condition, value in zip(condition_sqls, sqls[: len(values)], strict=True)
            ],
        )
        if default_typed is not None:
            case.set("default", sqls[-1].copy())
        parts = [*conditions, *all_values] + ([operand_typed] if operand_typed else [])
        return Typed(
            typed_node(case, pg_type),
            pg_type,
            interval,
            any(p.uses_unit for p in parts),
            double=double,
            smallest=smallest,
            wide=wide,
            growth=max(v.growth for v in all_values),
        )

    def _variadic_same_type(self, node: exp.Expression) -> Typed:
        args = [node.this, *node.expressions]
        parts = [self.check(a) for a in args]
        extreme = isinstance(node, (exp.Greatest, exp.Least))
        sqls, pg_type, double, smallest, wide = self._merged(parts, node, ordered=extreme)
        non_null = [p for p in parts if not isinstance(p.sql, exp.Null)]
        interval = hull([p.interval for p in non_null]) if pg_type.is_number and non_null else None
        if extreme and pg_type.is_number and non_null:
            interval = extreme_interval([p.interval for p in non_null], least=isinstance(node, exp.Least))
        # ignore_nulls: NULL arguments are skipped, as PostgreSQL and DuckDB both do (sqlglot would
        # otherwise spell a NULL-propagating CASE for DuckDB).
        kwargs = {"ignore_nulls": True} if extreme else {}
        sql = type(node)(this=sqls[0], expressions=sqls[1:], **kwargs)
        return Typed(
            typed_node(sql, pg_type),
            pg_type,
            interval,
            any(p.uses_unit for p in parts),
            all(p.constant for p in parts),
            double=double,
            smallest=smallest,
            wide=wide,
            growth=max(p.growth for p in parts),
        )

    def _nullif(self, node: exp.Expression) -> Typed:
        first, second = self.check(node.this), self.check(node.expression)
        self._comparable(first, second, node)
        sqls, _, double, smallest, wide = self._merged([first, second], node)
        return Typed(
            typed_node(exp.Nullif(this=sqls[0], expression=sqls[1]), first.type),
            first.type,
            first.interval,
            first.uses_unit or second.uses_unit,
            double=double,
            smallest=smallest,
            wide=wide,
            growth=first.growth,
        )


def _operand(sql: exp.Expression) -> exp.Expression:
    """An operand of a comparison, in parentheses when it is an operation itself: a <= b <> c is
    written as (a <= b) <> c, which both engines read (neither chains comparisons)."""
    if isinstance(sql, (exp.Binary, exp.Unary, exp.Predicate)):
        return exp.Paren(this=sql)
    return sql


def bytewise_text(value: exp.Expression) -> exp.Expression:
    """Text compared byte for byte, so ordered by code point, on every engine (COLLATE "C").
    Parenthesised: PostgreSQL's grammar takes no COLLATE in a BETWEEN's lower bound. An expression
    is cast to text first: DuckDB types `'a' || NULL` as NULL, which takes no collation."""
    if not (isinstance(value, exp.Column) or (isinstance(value, exp.Literal) and value.is_string)):
        value = exp.Cast(this=value, to=exp.DataType.build(exp.DataType.Type.TEXT))
    return exp.Paren(this=exp.Collate(this=value, expression=exp.Identifier(this="C", quoted=True)))
