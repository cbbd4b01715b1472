"""GROUP BY keys whose values are public knowledge, beyond the policy's `public_values`
(docs/privacy.md §5, "Keys from public knowledge").

A key whose every possible value is known without looking at protected rows is released like a key
with declared `public_values`: every value, zero-filled, with no partition selection. Three sources
of such values, each a function of the policy, the query text and public tables only:

  - **a public table joined in**: a column of a public table on the non-nullable side of the
    relation (`… JOIN airlines a ON f.carrier = a.carrier GROUP BY a.name`), or a protected column
    equated with a public table's column by an inner join's ON (`GROUP BY f.carrier`): its values
    are the public table's distinct values of that column, read when the query is planned (the
    `fetch` callback runs them as a public query, as subqueries over public tables are answered
    first), at most MAX_KEY_VALUES of them (more: partition selection). Such a plan holds public
    data of its moment and is never reused (`GroupKey.fetched`). Without a backend (Describe,
    `explain` without one), nothing is read and the key goes through partition selection, as
    before; explain says so;
  - **a declared date or time range** (`lower`/`upper` of a date, timestamp or timestamptz column):
    `date_trunc(unit, col)` buckets, `extract(field FROM col)` / `date_part` values, the days of
    a date column itself or of `CAST(col AS date)`, and Grafana's `$__timeGroup` buckets
    (`floor(extract(epoch from col)/N)*N`, N whole seconds), enumerated from the range as PostgreSQL
    computes them (ISO weeks start on Monday; the session time zone is UTC), at most MAX_KEY_VALUES;
  - **a declared integer range** (`lower`/`upper` of an integer column): the integers from lower to
    upper when there are at most MAX_RANGE_VALUES of them (an hour 0–23, a month 1–12, a rating
    1–5); a row whose value lies outside is read at the nearer bound, as for a sum;
  - the policy's own `public_values` of a column;
  - **the values the query names**: for a key with none of the above, the constants of a top-level
    `key IN (c1, …)` or `key = c` of the WHERE (several such conjuncts: the values all name) — an
    analyst's key set, as Tumult's KeySet, written in the query and so public; text, integer and
    date keys only (PublicKeys._named);
  - **the results a CASE names**: a key `CASE … THEN c1 … ELSE cn END` whose every result is a
    constant (not NULL) and which has an ELSE takes only those constants, whatever its conditions
    read (`CASE WHEN distance < 500 THEN 'short' … ELSE 'long' END`: bands an analyst wrote);
    text, integer and date keys only (PublicKeys._case).

A LEFT JOIN keeps protected rows without a match, whose key is then NULL: a key read from the
nullable side is not public (partition selection, as before). NULL is never a public value: rows
whose key is NULL are dropped where rows are read (rewrite/select_rows.read_relation keeps only
rows whose public key is one of its values, or within its span when the values are every value the
key can take between two ends: KeyValues.contiguous), as for a column with `public_values`.

**WHERE restricts them.** A conjunct of the top-level WHERE comparing the key's own expression with
constants (`=`, `<>`, `<`, `<=`, `>`, `>=`, `IN`, `NOT IN`, `BETWEEN`), or, for a key computed from
a date column with a declared range, comparing that column with constants (narrowing the range
before the buckets are enumerated), keeps only the values it admits. Anything else — OR, functions,
other columns, constants this module cannot read — restricts nothing: the restriction is
conservative and never drops a value the WHERE admits. A WHERE that admits none of the values
leaves them all (an empty IN list is not SQL).

Keys whose values this module derived are together held to MAX_PUBLIC_GROUPS combinations: beyond,
they go through partition selection. Nothing here reads protected data; `fetch` reads public tables.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from dpproxy.errors import DPProxyError
from dpproxy.sql import date_buckets
from dpproxy.sql.datetimes import epoch_micros, parse_temporal
from dpproxy.sql.nodes import conjuncts, strip_parens
from dpproxy.sql.query import GroupKey, OutputColumn, PublicQuery
from dpproxy.sql.relation import Relation
from dpproxy.sql.rowexpr import Typed, row_expression
from dpproxy.sql.rowexpr.dates import DATE_TRUNC_UNITS
from dpproxy.sql.rowexpr.dates import EXTRACT_FIELDS as ROW_EXTRACT_FIELDS
from dpproxy.sql.scope import RowScope, Source, SourceColumn
from dpproxy.sql.subqueries import PublicRunner
from dpproxy.sql.types import INTEGER_RANGE, PgType

# The most values one key may take from a public table or a declared range; beyond, the key goes
# through partition selection as before.
MAX_KEY_VALUES = 10_000
# The most combinations of keys whose values this module derived (zero-filled groups).
MAX_PUBLIC_GROUPS = 100_000
# The most integers a declared integer range may hold to make its column a public key: beyond, its
# values are as likely to be identifiers (a year of birth over 1900–2030 is 131; a departure time as
# hhmm is 2,401) and most zero-filled groups would be empty.
MAX_RANGE_VALUES = 1_000

# The parts a key over a declared date range may take: every date_trunc unit, and every extract
# field but the epoch (a continuous value, not a bucket).
TRUNC_UNITS = DATE_TRUNC_UNITS
EXTRACT_FIELDS = frozenset(ROW_EXTRACT_FIELDS) - {"epoch"}


@dataclass(frozen=True)
class KeyValues:
    """What is known of one key's values: the public ones (None: partition selection), what explain
    says of where they come from, and whether a public table was read to know them."""

    values: tuple[object, ...] | None
    origin: str | None = None
    fetched: bool = False
    # Every value the key can take between the first and the last of `values` is one of them (the
    # days of a date column, date_trunc buckets, the integers of a declared range): the rewrite keeps
    # the rows whose key lies in that span rather than listing thousands of values
    # (rewrite/select_rows.read_relation).
    contiguous: bool = False


class _Unreadable(Exception):
    """A WHERE constant or comparison this module does not read: the conjunct restricts nothing."""


@dataclass(frozen=True)
class _Temporal:
    """A key computed from a date or time column with a declared range."""

    kind: str  # "trunc", "extract" or "day" (the date column itself)
    part: str  # the unit or field
    source: Source
    column: SourceColumn


class PublicKeys:
    """The public values of a private query's GROUP BY keys (see the module docstring). `fetch` runs
    a query over public tables (the engine's runner of public subqueries); None: no backend."""

    def __init__(self, tree: exp.Select, relation: Relation, fetch: PublicRunner | None) -> None:
        self.tree = tree
        self.relation = relation
        self.fetch = fetch
        self.scope = relation.scope("WHERE")
        where = tree.args.get("where")
        self.conjuncts = conjuncts(where.this) if where is not None else []
        self.derived: set[str] = set()  # texts of the keys whose values this module found

    # -- one key ---------------------------------------------------------------------------------

    def values(self, node: exp.Expression, typed: Typed, text: str) -> KeyValues:
        """The public values of the key written `node` (its typed form and normalised text)."""
        node = strip_parens(node)
        label = node.sql("postgres")
        key_type = PgType.TEXT if typed.type is PgType.UNKNOWN else typed.type
        if isinstance(node, exp.Column):
            _, column = self.scope.resolve(node)
            if column.public_values is not None:
                return self._restricted(KeyValues(column.public_values), text, key_type, label)
        temporal = self._temporal(node, typed)
        found = KeyValues(None)
        if temporal is not None:
            found = self._temporal_values(temporal, text, key_type, label)
        elif isinstance(node, exp.Column):
            found = self._joined_values(node, text, key_type, label)
            if found.values is None and not found.fetched:
                found = self._range_values(node, text, key_type, label) or found
        elif isinstance(node, exp.Case):
            found = self._case(node, text, key_type, label) or found
        if found.values is None:
            named = self._named(text, key_type, label)
            found = replace(named, fetched=found.fetched) if named is not None else found
        if found.values is not None:
            self.derived.add(text)
        return found

    def within_limit(self, keys: list[GroupKey]) -> list[GroupKey]:
        """Keys whose values this module derived, back to partition selection when all keys are
        public and their combinations exceed MAX_PUBLIC_GROUPS."""
        if any(k.public_values is None for k in keys):
            return keys
        if math.prod(len(k.public_values or ()) for k in keys) <= MAX_PUBLIC_GROUPS:
            return keys
        note = f"more than {MAX_PUBLIC_GROUPS:,} combinations with the other keys: partition selection"
        return [
            replace(k, public_values=None, origin=f"{k.origin}; {note}") if k.text in self.derived else k
            for k in keys
        ]

    # -- public tables ---------------------------------------------------------------------------

    def _joined_values(self, node: exp.Column, text: str, key_type: PgType, label: str) -> KeyValues:
        found = self._public_column(node, key_type)
        if found is None:
            return KeyValues(None)
        source, column = found
        table = source.policy.name if source.policy is not None else source.label
        where = f'public table "{table}", column "{column.name}"'
        if self.fetch is None:
            return KeyValues(
                None,
                f"{label}: its values would be read from {where} when the query runs; without a backend "
                "it is shown with partition selection",
            )
        rows = self.fetch(_distinct_values(source, column))
        values = _fetched(rows, key_type)
        if values is None or not values or len(values) > MAX_KEY_VALUES:
            why = (
                "a value that is not one of the key's type"
                if values is None
                else f"more than {MAX_KEY_VALUES:,} distinct values"
                if values
                else "no values"
            )
            return KeyValues(None, f"{label}: {where} has {why}: partition selection", fetched=True)
        origin = f"{label}: the {len(values)} distinct values of {where}, read when the query was planned"
        return replace(self._restricted(KeyValues(values, origin), text, key_type, label), fetched=True)

    def _public_column(self, node: exp.Column, key_type: PgType) -> tuple[Source, SourceColumn] | None:
        """The public table's column whose values the key takes: the key's own column when it is
        one of a public table on the non-nullable side, or a public column an inner join's ON
        equates it with. Only types whose values read back exactly (text, integers, numeric,
        dates, booleans)."""
        if not (key_type.is_text or key_type.is_integer or key_type in _EXACT_TYPES):
            return None
        source, column = self.scope.resolve(node)
        if source.public and source.policy is not None and source.alias not in self.relation.nullable:
            return source, column
        sources = self.relation.sources
        for index, join in enumerate(self.tree.args.get("joins") or [], start=1):
            if join.args.get("side") or (join.args.get("kind") or "").upper() not in ("", "INNER"):
                continue  # only an inner join's ON holds on every row of the relation
            scope = RowScope(sources[: index + 1], "JOIN")
            for left, right in _equalities(join, sources[: index + 1], scope):
                for mine, other in ((left, right), (right, left)):
                    if mine[0] is not source or mine[1] is not column:
                        continue
                    partner, partner_column = other
                    if not partner.public or partner.policy is None:
                        continue
                    same = (
                        partner_column.type == column.type
                        or (partner_column.type.is_text and column.type.is_text)
                        or (partner_column.type.is_integer and column.type.is_integer)
                    )
                    if same:
                        return partner, partner_column
        return None

    # -- declared integer ranges ------------------------------------------------------------------

    def _range_values(self, node: exp.Column, text: str, key_type: PgType, label: str) -> KeyValues | None:
        """The integers of an integer column's declared range (None: not such a column, or more than
        MAX_RANGE_VALUES of them)."""
        _, column = self.scope.resolve(node)
        interval = column.interval
        if not (column.clip and column.type.is_integer and key_type.is_integer):
            return None
        if interval is None or not interval.finite:
            return None
        lo, hi = math.ceil(interval.lo), math.floor(interval.hi)
        if hi < lo or hi - lo + 1 > MAX_RANGE_VALUES:
            return None
        origin = f"{label}: the {hi - lo + 1} integers of {column.name}'s declared range {lo} … {hi}"
        found = KeyValues(tuple(range(lo, hi + 1)), origin, contiguous=True)
        return self._restricted(found, text, key_type, label)

    # -- declared date ranges --------------------------------------------------------------------

    def _temporal(self, node: exp.Expression, typed: Typed) -> _Temporal | None:
        bucket = _epoch_bucket(node)
        if bucket is not None:
            kind, part, inner = "epoch", str(bucket[0]), bucket[1]
        elif isinstance(node, exp.TimestampTrunc):
            kind, part, inner = "trunc", _name(node.args.get("unit")), node.this
        elif isinstance(node, exp.Extract):
            kind, part, inner = "extract", _name(node.this), node.expression
        elif isinstance(node, exp.Column) and typed.type is PgType.DATE:
            kind, part, inner = "day", "day", node
        elif isinstance(node, exp.Cast) and typed.type is PgType.DATE:
            # CAST(x AS date), x::date: the day of a date or time (in UTC for a timestamptz)
            kind, part, inner = "day", "day", node.this
        else:
            return None
        inner = strip_parens(inner)
        if not isinstance(inner, exp.Column):
            return None
        source, column = self.scope.resolve(inner)
        if column.temporal_range is None:
            return None
        if (kind == "trunc" and part not in TRUNC_UNITS) or (
            kind == "extract" and part not in EXTRACT_FIELDS
        ):
            return None
        if kind == "trunc" and column.type is PgType.DATE and part in ("hour", "minute", "second"):
            part = "day"  # a date truncated finer than a day is its midnight
        return _Temporal(kind, part, source, column)

    def _temporal_values(self, key: _Temporal, text: str, key_type: PgType, label: str) -> KeyValues:
        assert key.column.temporal_range is not None
        lo, hi = key.column.temporal_range
        column_type = key.column.type
        declared = f"{_shown(lo, column_type)} … {_shown(hi, column_type)}"
        narrowed = self._narrowed(key, (lo, hi))
        if narrowed is None:
            narrowed = (lo, hi)  # the WHERE admits none of the range: it restricts nothing
        within = declared
        if narrowed != (lo, hi):
            start, end = _shown(narrowed[0], column_type), _shown(narrowed[1], column_type)
            within += f", narrowed by WHERE to {start} … {end}"
        values = _enumerate(key, _utc(narrowed[0]), _utc(narrowed[1]), column_type)
        what = {
            "trunc": f"date_trunc('{key.part}') buckets",
            "extract": f"values of {key.part}",
            "day": "days",
            "epoch": f"{key.part}-second buckets of the epoch",
        }[key.kind]
        if values is None:
            return KeyValues(
                None,
                f"{label}: more than {MAX_KEY_VALUES:,} {what} in {key.column.name}'s range: "
                "partition selection",
            )
        origin = f"{label}: the {len(values)} {what} of {key.column.name}'s declared range {within}"
        # A date is a day, and date_trunc gives bucket starts only: nothing lies between two of them.
        found = KeyValues(values, origin, contiguous=key.kind in ("day", "trunc", "epoch"))
        return self._restricted(found, text, key_type, label)

    def _narrowed(self, key: _Temporal, bounds: tuple[dt.date, dt.date]) -> tuple[dt.date, dt.date] | None:
        """The declared range cut by the WHERE's comparisons of the column with constants (the values
        are clamped into the range where they are read, so WHERE sees them there). None: empty."""
        column_type = key.column.type
        lo, hi = _utc(bounds[0]), _utc(bounds[1])
        for conjunct in self.conjuncts:
            try:
                cut = lo, hi
                for op, constant in self._comparisons(
                    conjunct, lambda n: self._is_column(n, key), column_type
                ):
                    cut = _cut(op, constant, *cut, column_type)
            except _Unreadable:
                continue
            lo, hi = cut
        if lo > hi:
            return None
        return _aware(lo, column_type), _aware(hi, column_type)

    def _is_column(self, node: exp.Expression, key: _Temporal) -> bool:
        node = strip_parens(node)
        if not isinstance(node, exp.Column):
            return False
        try:
            source, column = self.scope.resolve(node)
        except DPProxyError:
            return False
        return source is key.source and column is key.column

    # -- WHERE on the key itself -----------------------------------------------------------------

    def _restricted(self, found: KeyValues, text: str, key_type: PgType, label: str) -> KeyValues:
        """The values the top-level WHERE's comparisons of the key with constants admit."""
        assert found.values is not None
        if key_type.is_float:
            return found  # NaN and signed zeros: no comparison in Python means PostgreSQL's
        kept = list(range(len(found.values)))  # indexes of the values admitted
        for conjunct in self.conjuncts:
            try:
                tests = self._comparisons(conjunct, lambda n: self._is_key(n, text), key_type)
                kept = [i for i in kept if all(_admits(op, _normal(found.values[i]), c) for op, c in tests)]
            except _Unreadable:
                continue
        if not kept or len(kept) == len(found.values):
            return found
        values = [found.values[i] for i in kept]
        if found.origin is None:
            declared = len(found.values)
            origin = f"{label}: {len(values)} of its {declared} declared public values, those WHERE admits"
        else:
            origin = f"{found.origin}; {len(values)} of them admitted by WHERE"
        # A run of consecutive values stays a span; values with gaps are listed.
        contiguous = found.contiguous and kept[-1] - kept[0] == len(kept) - 1
        return replace(found, values=tuple(values), origin=origin, contiguous=contiguous)

    def _named(self, text: str, key_type: PgType, label: str) -> KeyValues | None:
        """The values a top-level `key IN (constants)` or `key = constant` of the WHERE names, for a
        key with no public values otherwise: written in the query, they are public (Tumult's KeySet,
        given in SQL), and no row outside them is kept. Several such conjuncts: the values all name;
        then restricted by the WHERE's other comparisons of the key."""
        if key_type not in _NAMED_TYPES:
            return None
        named: set[object] | None = None
        for conjunct in self.conjuncts:
            node = strip_parens(conjunct)
            try:
                if isinstance(node, exp.In) and self._is_key(node.this, text):
                    constants = _in_list(node)
                elif isinstance(node, exp.EQ) and self._is_key(node.this, text):
                    constants = [node.expression]
                elif isinstance(node, exp.EQ) and self._is_key(node.expression, text):
                    constants = [node.this]
                else:
                    continue
                values = {_key_value(_constant(c, key_type), key_type) for c in constants}
            except _Unreadable:
                continue
            values.discard(None)  # a constant no value of the key can equal (1.5 for an integer)
            named = values if named is None else named & values
        if not named or len(named) > MAX_KEY_VALUES:
            return None
        values = tuple(sorted(named))  # type: ignore[type-var]
        count = f"{len(values)} values" if len(values) > 1 else "value"
        origin = f"{label}: the {count} the WHERE names (public: the query names them)"
        return self._restricted(KeyValues(values, origin), text, key_type, label)

    def _case(self, node: exp.Case, text: str, key_type: PgType, label: str) -> KeyValues | None:
        """The results of a CASE with an ELSE whose every THEN and ELSE is a constant (not NULL): each
        row's key is one of them, whatever the conditions read, and they are written in the query, so
        they are public (bands an analyst names). Then restricted by the WHERE's comparisons of the
        key. Without an ELSE, a row no condition holds for has a NULL key, which is never a public
        value: partition selection, as before, so that such rows' group is not silently dropped."""
        default = node.args.get("default")
        if key_type not in _NAMED_TYPES or default is None:
            return None
        results = [branch.args.get("true") for branch in node.args.get("ifs") or []]
        values: set[object] = set()
        for result in [*results, default]:
            try:
                value = _key_value(_constant(result, key_type), key_type) if result is not None else None
            except _Unreadable:
                return None
            if value is None:  # a result no value of the key equals: not read
                return None
            values.add(value)
        if len(values) > MAX_KEY_VALUES:
            return None
        ordered = tuple(sorted(values))  # type: ignore[type-var]
        origin = f"{label}: the {len(ordered)} results its THEN and ELSE name (public: the query names them)"
        return self._restricted(KeyValues(ordered, origin), text, key_type, label)

    def _is_key(self, node: exp.Expression, text: str) -> bool:
        if isinstance(strip_parens(node), (exp.Literal, exp.Null, exp.Boolean)):
            return False
        try:
            return row_expression(node, self.scope).sql.sql("postgres") == text
        except DPProxyError:
            return False

    def _comparisons(
        self, conjunct: exp.Expression, matches: Callable[[exp.Expression], bool], value_type: PgType
    ) -> list[tuple[str, object]]:
        """The conjunct as (operator, normalised constant) tests on the matched expression; [] when it
        does not compare it with constants; _Unreadable when it does, in a way not read here."""
        node = strip_parens(conjunct)
        if isinstance(node, exp.Not) and isinstance(strip_parens(node.this), exp.In):
            inner = strip_parens(node.this)
            if not matches(inner.this):
                return []
            return [("<>", _constant(v, value_type)) for v in _in_list(inner)]
        if isinstance(node, exp.In):
            if not matches(node.this):
                return []
            return [("in", tuple(_constant(v, value_type) for v in _in_list(node)))]
        if isinstance(node, exp.Between):
            if not matches(node.this):
                return []
            if node.args.get("symmetric"):
                raise _Unreadable
            return [
                (">=", _constant(node.args["low"], value_type)),
                ("<=", _constant(node.args["high"], value_type)),
            ]
        if type(node) in _OPERATORS:
            op = _OPERATORS[type(node)]
            if matches(node.this):
                return [(op, _constant(node.expression, value_type))]
            if matches(node.expression):
                return [(_REVERSED[op], _constant(node.this, value_type))]
        return []


# -- helpers -------------------------------------------------------------------------------------

_EXACT_TYPES = (PgType.NUMERIC, PgType.DATE, PgType.BOOL)

_OPERATORS: dict[type, str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_REVERSED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


# Key types whose values a WHERE can name exactly (a float's NaN and signed zeros, a timestamp's
# time zones are left to partition selection).
_NAMED_TYPES = frozenset({PgType.TEXT, PgType.VARCHAR, PgType.INT2, PgType.INT4, PgType.INT8, PgType.DATE})


def _key_value(constant: object, key_type: PgType) -> object:
    """A normalised WHERE constant as a value of the key's type; None when no value of that type
    equals it; _Unreadable when it is not of the key's kind."""
    if key_type.is_text:
        if not isinstance(constant, str):
            raise _Unreadable
        return constant
    if key_type.is_integer:
        if not isinstance(constant, Decimal) or isinstance(constant, bool):
            raise _Unreadable
        low, high = INTEGER_RANGE[key_type]
        integral = constant == constant.to_integral_value()
        return int(constant) if integral and low <= constant <= high else None
    if isinstance(constant, dt.datetime):  # a date: the midnight of a day names it
        return constant.date() if constant.time() == dt.time() else None
    raise _Unreadable


def _name(node: exp.Expression | None) -> str:
    if isinstance(node, (exp.Var, exp.Literal, exp.Identifier)):
        return str(node.name).lower()
    return ""


def _in_list(node: exp.In) -> list[exp.Expression]:
    if node.args.get("query") is not None or node.args.get("unnest") is not None or node.args.get("field"):
        raise _Unreadable
    return list(node.expressions)


def _equalities(
    join: exp.Join, sources: Sequence[Source], scope: RowScope
) -> Iterator[tuple[tuple[Source, SourceColumn], tuple[Source, SourceColumn]]]:
    """The (source, column) pairs an inner join's condition equates."""
    using = join.args.get("using")
    if using:
        right = sources[-1]
        for identifier in using:
            name = identifier.name.lower()
            left = next((s for s in sources[:-1] if s.column(name) is not None), None)
            mine, theirs = right.column(name), left.column(name) if left is not None else None
            if left is not None and mine is not None and theirs is not None:
                yield (left, theirs), (right, mine)
        return
    on = join.args.get("on")
    if on is None:
        return
    for term in conjuncts(on):
        if not isinstance(term, exp.EQ):
            continue
        a, b = strip_parens(term.this), strip_parens(term.expression)
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            continue
        try:
            yield scope.resolve(a), scope.resolve(b)
        except DPProxyError:
            continue


def _distinct_values(source: Source, column: SourceColumn) -> PublicQuery:
    """SELECT DISTINCT col FROM the public table WHERE col IS NOT NULL LIMIT MAX_KEY_VALUES + 1."""
    value = exp.column(column.name, table=source.alias, quoted=True)
    select = (
        exp.select(value.copy())
        .distinct()
        .from_(source.item.copy())
        .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        .limit(MAX_KEY_VALUES + 1)
    )
    return PublicQuery(select, (OutputColumn(column.name, value, column.type),), select.sql("postgres"))


def _fetched(rows: Sequence[Sequence[object]], key_type: PgType) -> tuple[object, ...] | None:
    """The distinct values read, sorted, as values of the key's type; None when one is not."""
    values = set()
    for row in rows:
        value = row[0]
        if value is None:
            continue
        if key_type.is_text:
            ok = isinstance(value, str)
        elif key_type.is_integer:
            low, high = INTEGER_RANGE[key_type]
            ok = isinstance(value, int) and not isinstance(value, bool)
            if ok and not low <= value <= high:
                continue  # no value of the key's column can equal it
        elif key_type is PgType.NUMERIC:
            ok = isinstance(value, (int, Decimal)) and not isinstance(value, bool)
            ok = ok and Decimal(value).is_finite()
        elif key_type is PgType.DATE:
            ok = isinstance(value, dt.date) and not isinstance(value, dt.datetime)
        elif key_type is PgType.BOOL:
            ok = isinstance(value, bool)
        else:
            ok = False
        if not ok:
            return None
        values.add(value)
    return tuple(sorted(values))  # type: ignore[type-var]


def _constant(node: exp.Expression, value_type: PgType) -> object:
    """A constant of the WHERE as a normalised Python value compared with values of `value_type`
    (an untyped string takes that type, as in PostgreSQL)."""
    node = strip_parens(node)
    try:
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        if isinstance(node, exp.Literal) and not node.is_string:
            return Decimal(node.this)
        if isinstance(node, exp.Neg) and isinstance(strip_parens(node.this), exp.Literal):
            inner = strip_parens(node.this)
            if not inner.is_string:
                return -Decimal(inner.this)
        if isinstance(node, exp.Literal) and node.is_string:
            return _normal(_from_text(node.this, value_type))
        if isinstance(node, exp.Cast) and isinstance(strip_parens(node.this), exp.Literal):
            inner, target = strip_parens(node.this), _cast_type(node.to)
            text = str(inner.this)
            if target is not None and target.is_text and not inner.is_string:
                # A number cast to text is spelled as the backend prints it: CAST(007 AS text) is
                # '7'. A whole number only (a fraction's digits depend on its type).
                number = Decimal(text)
                if number != number.to_integral_value():
                    raise _Unreadable
                return str(int(number))
            if target is not None:
                return _normal(_from_text(text, target))
    except (DPProxyError, ValueError, InvalidOperation, ArithmeticError):
        raise _Unreadable from None
    raise _Unreadable


def _cast_type(to: exp.DataType) -> PgType | None:
    if to.is_type(exp.DataType.Type.DATE):
        return PgType.DATE
    if to.is_type(exp.DataType.Type.TIMESTAMP):
        return PgType.TIMESTAMP
    if to.is_type(exp.DataType.Type.TIMESTAMPTZ):
        return PgType.TIMESTAMPTZ
    if to.is_type(*exp.DataType.TEXT_TYPES):
        return PgType.TEXT
    if to.is_type(*exp.DataType.INTEGER_TYPES, exp.DataType.Type.DECIMAL):
        return PgType.NUMERIC
    return None


def _from_text(text: str, value_type: PgType) -> object:
    if value_type.is_text:
        return text
    if value_type.is_temporal:
        return parse_temporal(text, value_type)
    if value_type.is_integer or value_type is PgType.NUMERIC:
        value = Decimal(text.strip())
        if not value.is_finite():
            raise _Unreadable
        return value
    raise _Unreadable


def _normal(value: object) -> object:
    """Values compared alike: numbers as Decimal, dates and times as naive datetimes in UTC (a date
    at its midnight, as PostgreSQL compares a date with a timestamp), text and booleans as they are."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, Decimal)):
        return Decimal(value)
    if isinstance(value, dt.datetime):
        return _utc(value)
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time())
    raise _Unreadable


def _kind(value: object) -> type:
    return bool if isinstance(value, bool) else type(value)


def _admits(op: str, value: object, constant: object) -> bool:
    if op == "in":
        assert isinstance(constant, tuple)
        return any(_admits("=", value, c) for c in constant)
    if _kind(value) is not _kind(constant):
        raise _Unreadable
    if op == "=":
        return value == constant
    if op == "<>":
        return value != constant
    if isinstance(value, bool):
        raise _Unreadable
    return {"<": value < constant, "<=": value <= constant, ">": value > constant, ">=": value >= constant}[  # type: ignore[operator]
        op
    ]


def _cut(
    op: str, constant: object, lo: dt.datetime, hi: dt.datetime, column_type: PgType
) -> tuple[dt.datetime, dt.datetime]:
    """[lo, hi] (naive UTC; a date column's at midnights) cut by `column op constant`."""
    if op == "in":  # within its least and greatest constants
        assert isinstance(constant, tuple)
        if not constant or not all(isinstance(c, dt.datetime) for c in constant):
            raise _Unreadable
        lo, hi = _cut(">=", min(constant), lo, hi, column_type)
        return _cut("<=", max(constant), lo, hi, column_type)
    if not isinstance(constant, dt.datetime):
        raise _Unreadable
    try:
        least, greatest = _admitted(op, constant, column_type)
    except OverflowError:
        raise _Unreadable from None
    if least is not None:
        lo = max(lo, least)
    if greatest is not None:
        hi = min(hi, greatest)
    return lo, hi


def _admitted(
    op: str, constant: dt.datetime, column_type: PgType
) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The least and the greatest value of the column that `column op constant` admits (a date
    column's values are midnights, a timestamp's are a microsecond apart); None where it sets no
    bound (`<>` sets none)."""
    if column_type is PgType.DATE:
        day = dt.timedelta(days=1)
        midnight = constant.time() == dt.time()
        floor = dt.datetime.combine(constant.date(), dt.time())
        ceiling = floor if midnight else floor + day
        below = floor - day if midnight else floor  # the last midnight before the constant
        if op == ">":
            return floor + day, None
        return {">=": (ceiling, None), "=": (ceiling, floor), "<=": (None, floor), "<": (None, below)}.get(
            op, (None, None)
        )
    tick = dt.timedelta(microseconds=1)
    if op == ">":
        return constant + tick, None
    if op == "<":
        return None, constant - tick
    return {">=": (constant, None), "=": (constant, constant), "<=": (None, constant)}.get(op, (None, None))


def _utc(value: dt.date) -> dt.datetime:
    """A bound as a naive datetime in UTC (a date at its midnight)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value
    return dt.datetime.combine(value, dt.time())


def _aware(value: dt.datetime, column_type: PgType) -> dt.date:
    if column_type is PgType.DATE:
        return value.date()
    return value.replace(tzinfo=dt.UTC) if column_type is PgType.TIMESTAMPTZ else value


def _shown(value: dt.date, column_type: PgType) -> str:
    if column_type is PgType.DATE or not isinstance(value, dt.datetime):
        return value.isoformat()
    return _utc(value).isoformat(sep=" ") + (" UTC" if column_type is PgType.TIMESTAMPTZ else "")


# -- enumerating a range -------------------------------------------------------------------------


def _enumerate(
    key: _Temporal, lo: dt.datetime, hi: dt.datetime, column_type: PgType
) -> tuple[object, ...] | None:
    """The key's values over column values in [lo, hi] (naive UTC), in order; None past MAX_KEY_VALUES."""
    if key.kind == "day":
        days = (hi.date() - lo.date()).days + 1
        if days > MAX_KEY_VALUES:
            return None
        return tuple(lo.date() + dt.timedelta(days=i) for i in range(days))
    if key.kind == "epoch":  # multiples of the width, in seconds since 1970 (UTC), as numbers
        width = int(key.part)
        first, last = (epoch_micros(t) // 1_000_000 // width * width for t in (lo, hi))
        if (last - first) // width + 1 > MAX_KEY_VALUES:
            return None
        return tuple(range(first, last + 1, width))
    if key.kind == "trunc":
        buckets = []
        current: dt.datetime | None = date_buckets.truncate(lo, key.part)
        if date_buckets.bucket_count(current, hi, key.part) > MAX_KEY_VALUES:
            return None
        while current is not None and current <= hi:
            buckets.append(current.replace(tzinfo=dt.UTC) if column_type is PgType.TIMESTAMPTZ else current)
            current = date_buckets.following(current, key.part)
        return tuple(buckets)
    values = date_buckets.extracted(key.part, lo, hi, MAX_KEY_VALUES)
    return None if values is None or len(values) > MAX_KEY_VALUES else tuple(sorted(values))


def _epoch_bucket(node: exp.Expression) -> tuple[int, exp.Expression] | None:
    """Grafana's `$__timeGroup(col, '1h')`, `floor(extract(epoch from col)/3600)*3600`: (the width in
    whole seconds, col); None for any other expression."""
    node = strip_parens(node)
    if not isinstance(node, exp.Mul):
        return None
    floor, width = strip_parens(node.this), strip_parens(node.expression)
    if not isinstance(floor, exp.Floor) or floor.args.get("decimals"):
        return None
    divided = strip_parens(floor.this)
    if not isinstance(divided, exp.Div) or not (isinstance(width, exp.Literal) and width.is_int):
        return None
    epoch, divisor = strip_parens(divided.this), strip_parens(divided.expression)
    if not (isinstance(divisor, exp.Literal) and divisor.is_int and divisor.this == width.this):
        return None
    if not (isinstance(epoch, exp.Extract) and _name(epoch.this) == "epoch") or int(width.this) <= 0:
        return None
    return int(width.this), epoch.expression
