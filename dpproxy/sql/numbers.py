"""How numbers are computed in the backend, so that every engine computes the same value.

PostgreSQL and DuckDB agree on integer arithmetic, but not on much else: DuckDB divides decimals
in double precision where PostgreSQL stays exact, reads `NUMERIC` without a precision as three
decimal digits, keeps a decimal's width when multiplying it by an integer (and fails on overflow),
rounds doubles half away from zero where PostgreSQL rounds half to even, and converts decimals to
doubles with a double rounding. A row expression that meant different things on the two engines
would select different rows from the same data. So every number a private query computes has one
of three representations, and each operation is written so that both engines perform it alike:

  - integers: bigint, exact (ranges are checked statically, so nothing overflows);
  - exact decimals: `DECIMAL(38, 10)` on both engines as soon as they take part in arithmetic, so
    sums, differences and products are exact and cannot overflow (|value| < 10^27 is checked, and
    10^17 for a product of two decimals, whose scale is 20 before it is rounded back to 10);
  - doubles: float columns, and every quotient of non-integers (division is exact on neither engine
    in general, so it is done in IEEE double precision on both, which they perform bit for bit).
    Decimals become doubles through their exact text, which both engines parse correctly rounded.
    PostgreSQL raises an error when a double product or quotient underflows to 0, where DuckDB
    returns 0; so float columns read values below 1e-100 in magnitude as 0, and the analyzer
    tracks the smallest non-zero magnitude every double can have, refusing a product or quotient
    that could underflow. No such error can then depend on data.

Rounding to an integer grid (the fixed-point values sums are computed on) is explicit too: exact
numbers by a cast to `DECIMAL(38, s)` (half away from zero on both), doubles by floor(x·10^s + 0.5)
in double precision. Functions spelled differently per engine are emitted as markers that `emit`
spells for the backend's dialect. Nothing here reads data.

Spark (run with ANSI mode on, in UTC) differs again, and `emit` spells the difference out rather
than trusting sqlglot's transpilation: `/` of integers is a double there, so PostgreSQL's integer
division is `DIV`; `sum(bigint)` is a bigint that overflows (an error under ANSI) where PostgreSQL
and DuckDB widen, so sums of integers are summed as `DECIMAL(38, 0)` (|value| < 2^63 per row and
fewer than 2^63 rows stay below 10^38); `round` of a double is half-up, so half-to-even is `BROUND`;
its TIMESTAMP is an instant, so PostgreSQL's timestamp (no time zone) is `TIMESTAMP_NTZ`; extract()
numbers days of the week from 1 and names the ISO fields differently; a bare DECIMAL means
DECIMAL(10, 0), so none is ever emitted; its strings compare bytewise by default, which is what
PostgreSQL's COLLATE "C" asks for; its casts to integer types truncate, so a cast of a non-integer
rounds first (`BROUND` for doubles, `ROUND` — half away from zero — for exact numbers).
"""

from __future__ import annotations

import functools
from decimal import Decimal

from sqlglot import exp
from sqlglot.errors import ErrorLevel

from dpproxy.errors import InvalidParameter, NotSupported
from dpproxy.sql.nodes import without_positions

# Decimal arithmetic runs in DECIMAL(38, SCALE): at most 10 fractional digits, 28 integral ones.
DECIMAL_SCALE = 10
DECIMAL_TYPE = f"DECIMAL(38, {DECIMAL_SCALE})"
# |x·y| of two decimals must stay below this: their product has scale 20 before being rounded back.
DECIMAL_PRODUCT_LIMIT = Decimal("1e17")
# Float columns read values below this magnitude as 0, so that products cannot underflow.
SNAP = "1e-100"
SMALLEST_FLOAT = Decimal(SNAP)
# A product or quotient whose non-zero magnitude could fall below this is refused (the smallest
# normal double is about 2.2e-308).
UNDERFLOW_LIMIT = Decimal("1e-300")
# Relative size of one unit in the last place of a double, rounded down.
ULP = Decimal(2) ** -53

# Marker functions, spelled per dialect by `emit`.
ROUND_HALF_EVEN = "__dpproxy_round_half_even"
EPOCH_MICROSECONDS = "__dpproxy_epoch_us"
WIDE_INTEGER = "__dpproxy_wide_integer"
WIDE_DECIMAL = "__dpproxy_wide_decimal"
ROUNDED_INTEGER = "__dpproxy_rounded_integer"
BIGINT_QUOTIENT = "__dpproxy_bigint_quotient"
_MARKERS = (ROUND_HALF_EVEN, EPOCH_MICROSECONDS, WIDE_INTEGER, WIDE_DECIMAL, ROUNDED_INTEGER, BIGINT_QUOTIENT)

# No engine counts more rows than a bigint holds: a sum of values below L in magnitude stays below
# L · 2^63. A sum of decimals is computed in at most 38 digits (DuckDB, and Spark once widened).
MAX_ROWS = 2**63
DECIMAL_SUM_LIMIT = Decimal(10) ** (38 - DECIMAL_SCALE) / MAX_ROWS


@functools.lru_cache(maxsize=256)
def _parsed_type(type_name: str) -> exp.DataType:
    return without_positions(exp.DataType.build(type_name))


def data_type(type_name: str) -> exp.DataType:
    """sqlglot's type for a type's name (a new node, parsed once per name)."""
    return _parsed_type(type_name).copy()


NUMERIC_PRECISION_LIMIT = 38  # DuckDB's and Spark's widest DECIMAL; PostgreSQL's is 1000


def numeric_typmod(to: exp.DataType) -> tuple[int, int] | None:
    """The (precision, scale) written in numeric(p, s) (scale 0 when left out), None for a bare
    numeric. PostgreSQL refuses a precision outside 1..1000 (22023); every backend holds 1..38 with a
    scale from 0 to the precision, so anything else is refused before it reaches one."""
    params = [p for p in to.expressions if isinstance(p, exp.DataTypeParam)]
    if not params:
        return None
    written = f"numeric({', '.join(p.sql('postgres') for p in params)})"
    if len(params) > 2 or not all(isinstance(p.this, exp.Literal) and p.name.isdigit() for p in params):
        raise InvalidParameter(
            f"invalid NUMERIC type modifier in {written}",
            hint="write numeric(precision, scale) with two integer constants",
        )
    precision = int(params[0].name)
    scale = int(params[1].name) if len(params) > 1 else 0
    if not 1 <= precision <= 1000:
        raise InvalidParameter(
            f"NUMERIC precision {precision} must be between 1 and 1000 (in {written})",
            hint=f"write a precision between 1 and {NUMERIC_PRECISION_LIMIT}, or numeric without one",
        )
    if precision > NUMERIC_PRECISION_LIMIT or scale > precision:
        raise NotSupported(
            f"{written} is not supported: a precision above {NUMERIC_PRECISION_LIMIT} or a scale above "
            "the precision does not fit every backend's DECIMAL",
            hint=f"write numeric(p, s) with s <= p <= {NUMERIC_PRECISION_LIMIT}, or numeric alone",
        )
    return precision, scale


def cast(value: exp.Expression, type_name: str) -> exp.Expression:
    return exp.Cast(this=value, to=data_type(type_name))


def as_decimal(value: exp.Expression) -> exp.Expression:
    """An exact number (integer or decimal) as DECIMAL(38, 10)."""
    return cast(value, DECIMAL_TYPE)


def double_from_text(text: str) -> exp.Expression:
    return cast(exp.Literal.string(text), "DOUBLE PRECISION")


def double_constant(value: Decimal) -> exp.Expression:
    """A constant double, parsed from its exact decimal text (correctly rounded on every engine)."""
    return double_from_text(format(value, "f"))


def as_double(value: exp.Expression, *, exact_integer: bool, within: bool = False) -> exp.Expression:
    """An exact number as a double: integers directly (a correctly rounded conversion on both
    engines), decimals through their text, which both engines parse correctly rounded (DuckDB's
    direct conversion divides by a power of ten after converting, rounding twice).

    The conversion never fails: PostgreSQL's numeric holds values a double cannot, and its text
    parser fails on a non-zero magnitude below 4.9e-324 or above 1.8e308, so one stored value would
    fail the query that reads it. Below 1e-100 a decimal reads as 0, as floats do (SNAP); unless
    `within` (its range is known to lie within ±1e300), above 1e308 it reads as ±Infinity, and
    PostgreSQL's numeric NaN stays NaN."""
    if exact_integer:
        return cast(value, "DOUBLE PRECISION")
    ifs = [
        exp.If(
            this=exp.LT(this=exp.Abs(this=value.copy()), expression=exp.Literal.number(SNAP)),
            true=double_from_text("0"),
        )
    ]
    if not within:
        text = cast(value.copy(), "TEXT")
        ifs = [
            exp.If(
                this=exp.EQ(this=text, expression=exp.Literal.string("NaN")), true=double_from_text("NaN")
            ),
            *ifs,
            exp.If(
                this=exp.GT(this=value.copy(), expression=exp.Literal.number(HUGE)),
                true=double_from_text("Infinity"),
            ),
            exp.If(
                this=exp.LT(this=value.copy(), expression=exp.Neg(this=exp.Literal.number(HUGE))),
                true=double_from_text("-Infinity"),
            ),
        ]
    return exp.Case(ifs=ifs, default=cast(cast(value, "TEXT"), "DOUBLE PRECISION"))


# Exact numbers above this magnitude read as ±Infinity when converted to doubles (as_double).
HUGE = "1e308"
WITHIN_DOUBLES = Decimal("1e300")


def snap_tiny(value: exp.Expression) -> exp.Expression:
    """A float column's value, read as 0 below 1e-100 in magnitude (see the module docstring)."""
    tiny = exp.LT(this=exp.Abs(this=value.copy()), expression=double_from_text(SNAP))
    return exp.Case(ifs=[exp.If(this=tiny, true=double_from_text("0"))], default=value.copy())


def smallest_sum(a: Decimal, b: Decimal) -> Decimal:
    """Smallest non-zero |x ± y| of doubles whose non-zero magnitudes are at least a and b: a
    cancellation leaves at least one unit in the last place of the smaller one."""
    return min(a, b) * ULP


def safe_from_underflow(smallest: Decimal) -> bool:
    """Whether a double whose non-zero magnitude is at least `smallest` can never underflow to 0."""
    return smallest >= UNDERFLOW_LIMIT


def round_half_even(value: exp.Expression) -> exp.Expression:
    """round(x) of a double with PostgreSQL's meaning (rint: halves to even) on every engine."""
    return exp.Anonymous(this=ROUND_HALF_EVEN, expressions=[value])


def epoch_microseconds(value: exp.Expression) -> exp.Expression:
    """Microseconds from 1970-01-01 00:00:00 (UTC for a timestamptz) to a timestamp, as a bigint:
    PostgreSQL's exact extract(epoch …) times 10^6, DuckDB's epoch_us (its extract(epoch …) is a
    double, which cannot hold every microsecond of years 1–9999)."""
    return exp.Anonymous(this=EPOCH_MICROSECONDS, expressions=[value])


def summable_integer(value: exp.Expression) -> exp.Expression:
    """An integer (bigint) argument of SUM, widened where the engine's sum of bigints could overflow
    (Spark): SUM(summable_integer(x)) is exact on every engine."""
    return exp.Anonymous(this=WIDE_INTEGER, expressions=[value])


def summable_decimal(value: exp.Expression) -> exp.Expression:
    """An exact-decimal argument of SUM or AVG (|value| < DECIMAL_SUM_LIMIT, checked by the caller),
    summed in DECIMAL(38, 10) where the engine would sum it in fewer digits (Spark: p + 10)."""
    return exp.Anonymous(this=WIDE_DECIMAL, expressions=[value])


def bigint_quotient(dividend: exp.Expression, divisor: exp.Expression) -> exp.Expression:
    """dividend div divisor for non-negative bigints (divisor > 0), in 64-bit arithmetic on every
    engine: PostgreSQL's bigint `/` (its DIV() works in numeric), DuckDB's `//`, Spark's DIV."""
    return exp.Anonymous(this=BIGINT_QUOTIENT, expressions=[dividend, divisor])


def integer_cast(value: exp.Expression, to: exp.DataType, *, double: bool) -> exp.Expression:
    """CAST(value AS an integer type) of a non-integer with PostgreSQL's meaning on every engine: a
    double rounds half to even, an exact number half away from zero (as PostgreSQL and DuckDB cast;
    Spark's cast truncates, so there the value is rounded first)."""
    kind = exp.Literal.string("double" if double else "exact")
    return exp.Anonymous(this=ROUNDED_INTEGER, expressions=[exp.Cast(this=value, to=to), kind])


def grid_integer(value: exp.Expression, scale: int, *, double: bool, integer: bool) -> exp.Expression:
    """round(value · 10^scale) as a bigint, computed identically on every engine.

    Exact numbers: a cast to DECIMAL(p, scale) rounds half away from zero on both engines, and the
    scaled value is then an exact integer. Doubles: floor(x · 10^scale + 0.5) in double precision.
    The value must already be clipped to bounds that keep |value · 10^scale| below 2^52 (the analyzer
    checks it). DuckDB keeps a product of a DECIMAL(18, s) and an integer within 18 digits, and
    computes it in 64 bits: for s <= 2 the product (at most 16 integral digits) fits, and is several
    times faster than in DECIMAL(38, s), whose 128-bit arithmetic larger scales need."""
    if integer and not double:
        # An exact integer is on every grid: round(x · 10^s) = x · 10^s, in bigint.
        whole = cast(value, "BIGINT")
        return whole if scale == 0 else exp.Mul(this=whole, expression=exp.Literal.number(10**scale))
    if double:
        scaled = value if scale == 0 else exp.Mul(this=value, expression=exp.Literal.number(10**scale))
        return cast(exp.Floor(this=exp.Add(this=scaled, expression=double_from_text("0.5"))), "BIGINT")
    precision = 18 if scale <= 2 else 38
    on_scale = cast(value, f"DECIMAL({precision}, {scale})")
    scaled = on_scale if scale == 0 else exp.Mul(this=on_scale, expression=exp.Literal.number(10**scale))
    return cast(scaled, "BIGINT")


def _spell(node: exp.Expression, dialect: str) -> exp.Expression:
    if isinstance(node, exp.Anonymous) and node.name == ROUND_HALF_EVEN:
        (value,) = node.expressions
        if dialect == "duckdb":
            return exp.Anonymous(this="ROUND_EVEN", expressions=[value, exp.Literal.number(0)])
        if dialect == "spark":
            return exp.Anonymous(this="BROUND", expressions=[value, exp.Literal.number(0)])
        # PostgreSQL's round(double precision) is rint(): halves to even.
        return exp.Round(this=value)
    if isinstance(node, exp.Anonymous) and node.name == EPOCH_MICROSECONDS:
        (value,) = node.expressions
        if dialect == "duckdb":
            return exp.Anonymous(this="EPOCH_US", expressions=[value])
        if dialect == "spark":
            # A date or timestamp without time zone read as an instant in UTC (the session's time
            # zone): TIMESTAMPTZ is spelled as Spark's TIMESTAMP, an instant (`_spark_node`).
            return exp.Anonymous(this="UNIX_MICROS", expressions=[cast(value, "TIMESTAMPTZ")])
        seconds = exp.Extract(this=exp.Var(this="EPOCH"), expression=value)
        return cast(exp.Mul(this=seconds, expression=exp.Literal.number(1_000_000)), "BIGINT")
    if isinstance(node, exp.Anonymous) and node.name == WIDE_INTEGER:
        (value,) = node.expressions
        return cast(value, "DECIMAL(38, 0)") if dialect == "spark" else value
    if isinstance(node, exp.Anonymous) and node.name == WIDE_DECIMAL:
        (value,) = node.expressions
        return cast(value, DECIMAL_TYPE) if dialect == "spark" else value
    if isinstance(node, exp.Anonymous) and node.name == BIGINT_QUOTIENT:
        dividend, divisor = node.expressions
        if dialect == "postgres":
            return exp.Paren(this=exp.Div(this=dividend, expression=divisor, typed=True))
        return exp.Paren(this=exp.IntDiv(this=dividend, expression=divisor))
    if isinstance(node, exp.Anonymous) and node.name == ROUNDED_INTEGER:
        integer, kind = node.expressions
        if dialect == "spark":
            value = integer.this
            rounded = (
                exp.Anonymous(this="BROUND", expressions=[value, exp.Literal.number(0)])
                if kind.name == "double"
                else exp.Round(this=value, decimals=exp.Literal.number(0))  # half away from zero
            )
            integer.set("this", rounded)
        return integer
    return node


# PostgreSQL's extract() fields under Spark's names (dow: Spark counts Sunday as 1, PostgreSQL as 0).
_SPARK_EXTRACT = {"ISODOW": "DAYOFWEEK_ISO", "ISOYEAR": "YEAROFWEEK", "DOW": "DAYOFWEEK"}


# Where a condition stands: Spark refuses an untyped NULL there (PostgreSQL reads it as unknown).
_CONDITIONS = ((exp.Where, "this"), (exp.Having, "this"), (exp.If, "this"), (exp.Join, "on"))


def _spark_node(node: exp.Expression) -> exp.Expression:
    """One node of a rewritten tree with PostgreSQL's meaning, in Spark SQL (module docstring)."""
    for kind, arg in _CONDITIONS:
        if isinstance(node, kind) and node.args.get(arg) is not None:
            condition = node.args[arg].unnest()
            if isinstance(condition, exp.Null):
                node.set(arg, cast(exp.Null(), "BOOLEAN"))
    if isinstance(node, exp.Div) and node.args.get("typed"):
        return exp.IntDiv(this=node.this, expression=node.expression)
    if isinstance(node, exp.Sign):
        # Spark's SIGN is a double, NaN's NaN: PostgreSQL's has its argument's type, NaN's 0.
        if _typed_as(node, exp.DataType.Type.DOUBLE):
            nan = exp.Anonymous(this="ISNAN", expressions=[node.this.copy()])
            return exp.Case(ifs=[exp.If(this=nan, true=cast(exp.Literal.number(0), "DOUBLE"))], default=node)
        if _typed_as(node, exp.DataType.Type.DECIMAL):
            return cast(node, DECIMAL_TYPE)
    if isinstance(node, (exp.Floor, exp.Ceil)) and _typed_as(node, exp.DataType.Type.DOUBLE):
        # Spark's FLOOR and CEIL of a double are BIGINTs (capped past 2^63; NaN becomes 0), where
        # PostgreSQL keeps a double: a double, computed below 2^52 only, past which every double
        # is whole already (NaN too: Spark orders it above every number).
        value = node.this
        whole = exp.GTE(this=exp.Abs(this=value.copy()), expression=cast(exp.Literal.number(2**52), "DOUBLE"))
        return exp.Case(ifs=[exp.If(this=whole, true=value.copy())], default=cast(node, "DOUBLE"))
    if isinstance(node, exp.DataType):
        if node.this is exp.DataType.Type.TIMESTAMP:
            return exp.DataType.build("TIMESTAMP_NTZ", dialect="spark")
        if node.this is exp.DataType.Type.TIMESTAMPTZ:
            return exp.DataType.build("TIMESTAMP", dialect="spark")
        if node.this is exp.DataType.Type.DECIMAL and not node.expressions:
            return exp.DataType.build(DECIMAL_TYPE)
    if isinstance(node, (exp.Left, exp.Right)):
        count = _integer_constant(node.expression)
        if count is not None and count < 0:
            # PostgreSQL: all but the last (left) or first (right) |n| characters; Spark: ''.
            if isinstance(node, exp.Right):
                return exp.Substring(this=node.this, start=exp.Literal.number(1 - count))
            kept = exp.Sub(this=exp.Length(this=node.this.copy()), expression=exp.Literal.number(-count))
            return exp.Substring(
                this=node.this,
                start=exp.Literal.number(1),
                length=exp.Greatest(this=kept, expressions=[exp.Literal.number(0)]),
            )
    if isinstance(node, exp.Escape) and isinstance(node.this, exp.Like):
        pattern, escape = node.this.expression, node.expression
        if isinstance(pattern, exp.Literal) and isinstance(escape, exp.Literal) and len(escape.name) == 1:
            node.this.set("expression", exp.Literal.string(_spark_like_pattern(pattern.name, escape.name)))
    if (
        isinstance(node, exp.Cast)
        and node.to.is_type(*exp.DataType.TEXT_TYPES)
        and _typed_as(node.this, exp.DataType.Type.TIMESTAMPTZ)
    ):
        # PostgreSQL writes a timestamptz with its offset (UTC here: +00); Spark writes none.
        return exp.Concat(expressions=[node, exp.Literal.string("+00")], safe=True)
    if isinstance(node, exp.Collate) and node.expression.name.upper() == "C":
        return node.this  # Spark compares strings bytewise (UTF8_BINARY) unless told otherwise
    if isinstance(node, exp.Extract) and isinstance(node.this, exp.Var):
        field = node.this.name.upper()
        if field in _SPARK_EXTRACT:
            spelled = exp.Extract(this=exp.Var(this=_SPARK_EXTRACT[field]), expression=node.expression)
            if field == "DOW":
                return exp.Paren(this=exp.Sub(this=spelled, expression=exp.Literal.number(1)))
            return spelled
    return node


def _integer_constant(node: exp.Expression) -> int | None:
    negative = isinstance(node, exp.Neg)
    literal = node.this if negative else node
    if isinstance(literal, exp.Literal) and literal.is_int:
        return -int(literal.name) if negative else int(literal.name)
    return None


def _spark_like_pattern(pattern: str, escape: str) -> str:
    """A LIKE pattern with PostgreSQL's meaning on Spark, which refuses an escape character before
    anything but a wildcard or itself (PostgreSQL reads it as the character that follows)."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if char == escape and i + 1 < len(pattern):
            following = pattern[i + 1]
            out.append(char + following if following in ("%", "_", escape) else following)
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _typed_as(node: exp.Expression, kind: exp.DataType.Type) -> bool:
    """Whether a node is typed (`typed_node`) as `kind`: TIMESTAMPTZ for PostgreSQL's timestamptz,
    DOUBLE for double precision, DECIMAL for numeric."""
    return node.type is not None and node.type.this is kind


def _spark_tree(tree: exp.Expression) -> exp.Expression:
    """`_spark_node` on every node, children before their parent (so a node replaced keeps its
    subtree spelled too; sqlglot's transform skips the subtree of a node it replaced)."""
    for node in reversed(list(tree.walk())):
        parent, key, index = node.parent, node.arg_key, node.index
        spelled = _spark_node(node)  # may hold `node` itself, which then has a new parent
        if spelled is node:
            continue
        if parent is None:
            tree = spelled
        else:
            parent.set(key, spelled, index)
    return tree


def emit(tree: exp.Expression, dialect: str, *, owned: bool = False, **options: object) -> str:
    """The SQL text of a rewritten tree for a backend's dialect, with marker functions spelled out.

    sqlglot's warnings about constructs that may mean different things per engine are silenced: the
    analyzer emits only constructs whose meaning it fixed (time zones are UTC on every backend),
    and the generated-language tests check that the engines agree on them.

    `owned`: the caller built `tree` for this call alone and never reads it again, so it is spelled and
    generated in place; otherwise it is copied once (never more: sqlglot's own copy is skipped)."""
    markers = [n for n in tree.walk() if isinstance(n, exp.Anonymous) and n.name in _MARKERS]
    if not owned and (markers or dialect == "spark"):
        tree = tree.copy()
        owned = True
        markers = [n for n in tree.walk() if isinstance(n, exp.Anonymous) and n.name in _MARKERS]
    if markers or dialect == "spark":
        # Innermost first (reversed pre-order): a marker may hold another in its argument.
        for marker in reversed(markers):
            marker.replace(_spell(marker, dialect))
        if dialect == "spark":
            tree = _spark_tree(tree)
    return tree.sql(dialect, copy=not owned, unsupported_level=ErrorLevel.IGNORE, **options)
