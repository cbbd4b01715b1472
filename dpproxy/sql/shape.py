"""Statement shapes for the plan cache: a parsed, parameter-bound statement with the constants that
are mere values of its row filter abstracted, so that a dashboard asking the same question with new
constants reuses the analysed plan and only re-binds those values (docs/architecture.md §2).

A constant is abstracted (a *slot*) only where the analyser reads nothing of it but its type: an
integer numeral of at most nine digits without a leading zero (so of PostgreSQL's `integer` type,
and re-emitted by the analyser with exactly its own digits), alone on one side of a comparison
(`=`, `<>`, `<`, `<=`, `>`, `>=`, `BETWEEN`) whose other side is a column that is not a group key,
reached from the top-level WHERE through AND / OR / NOT / parentheses only, in a statement with no
subquery, CTE or set operation. Every other constant stays in the shape's key. Two lookups find a
learned shape: the parsed tree with its slots marked (`statement_shape`: its SQL *and* its
structure, since sqlglot spells some different trees alike), or, for a statement sent without
parameters, its tokens (`token_shape`: equal tokens but for slot numerals give equal trees but for
those literals, so the hit path never parses). A hit's SQL is the learned template's text with the
new numerals put at offsets found once (`Template`), never a search over the text.

Why a slot's value cannot change anything but where it is written (read against the analyser):
- Typing (rowexpr/constants.literal_number): every slot value is an INT4 constant with a point
  interval; digits checks pass for all of them. Nothing that refuses a statement depends on which
  nine-digit integer stands in a slot, so a hit is never an answer a cold analysis would refuse.
- Comparisons and BETWEEN (rowexpr/predicates `_comparison`, `_between`, arithmetic
  `_exact_or_double`): the representation chosen (bigint, DECIMAL(38, 10), double) depends on the
  operands' types, `double`, `wide`, `constant` and whether an interval exists — never on the
  interval's value. The constant is written from its value as plain digits (`number_literal`,
  `double_constant`'s `format(value, "f")`), which for these numerals are the numeral's own text.
  Intervals of constants are read only by arithmetic, CASE / COALESCE / GREATEST merges and
  division-by-zero checks, none of which can hold a slot (a slot's parent is the comparison).
- Probes (sql/probes.never_true) fold only comparisons of constants with constants; a slot is
  compared with a column, which is "could be true" whatever the number. LIMIT, OFFSET, HAVING,
  ORDER BY positions, IN lists, casts, arithmetic and negative numbers are not slots.
- Group keys and public values: a filter on a group key's column stays in the key (conservative:
  the analyser reads the WHERE only as one typed condition, placed in `PrivateQuery.where`).
- Randomized response (private.py) moves the WHERE into a component's argument: the sentinels then
  stand outside the text and row filter, so the shape is not learned (below).
- Subqueries, CTEs and set operations (answered first, or analysed as queries of their own) are
  excluded; so are bound parameters from the token lookup (their values are not in the text).
The engine also confirms each shape once, when it learns it (`Engine._learn_shape`): the statement
is analysed again with sentinel numbers in the slots (same salt), and the shape is cached only if
that analysis is the original one with the sentinels in place of the values, in the row filter,
text and emitted SQL only — a check of the argument above on every shape, and what keeps a future
rule that reads a constant structurally from being cached silently. tests/test_plan_cache.py checks
hits against cold analyses over the language generator's batch and generated dashboard statements.
Nothing here knows the policy or runs SQL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from dpproxy.errors import DPProxyError
from dpproxy.sql import literals

_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
_CONNECTIVES = (exp.And, exp.Or, exp.Not, exp.Paren)
_INTEGER = re.compile(r"0|[1-9][0-9]{0,8}")  # as the analyser re-emits it: no leading zero
# The marker a slot's constant is replaced by in the shape's text (not valid SQL: it never runs).
_MARKER = "__dpproxy_slot__"
# Sentinel values the confirming analysis puts in the slots: nine digits, so of the same type as
# every slot value (integer), and unlikely to appear in the SQL by themselves (checked anyway).
_SENTINEL_BASE = 738_291_000


@dataclass(frozen=True)
class Shape:
    """The statement's text with its slots abstracted, and the slots' values (numerals' text)."""

    text: str
    slots: tuple[exp.Literal, ...]
    positions: tuple[int, ...]  # the slots' places in the tree's walk order

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(node.this for node in self.slots)


def sentinel(index: int) -> str:
    return str(_SENTINEL_BASE + 7 * index)


def statement_shape(tree: exp.Expression) -> Shape | None:
    """The shape of a bound statement, or None when it has no slot (the exact text is the key)."""
    if not isinstance(tree, exp.Select) or tree.args.get("with_") is not None:
        return None
    where = tree.args.get("where")
    if where is None:
        return None
    for node in tree.walk():
        if isinstance(node, (exp.Subquery, exp.Union, exp.Intersect, exp.Except)) or (
            isinstance(node, exp.Select) and node is not tree
        ):
            return None
    group = tree.args.get("group")
    keys = {e.sql("postgres").lower() for e in group.expressions} if group is not None else set()
    aliases = {e.alias.lower() for e in tree.expressions if isinstance(e, exp.Alias)}
    slots = [node for node in _filter_slots(where.this) if _free_column(node, keys, aliases)]
    if not slots:
        return None
    marked = {id(node) for node in slots}
    placed = [(i, node) for i, node in enumerate(tree.walk()) if id(node) in marked]
    positions = tuple(i for i, _ in placed)
    marked_tree = _replaced(tree, {p: exp.Var(this=_MARKER) for p in positions})
    # The SQL alone is not the tree: sqlglot spells different trees alike (MEDIAN(x) and
    # PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY x), which the analyser names differently), so the
    # key is the tree's structure too; the SQL keeps what the structure does not show (comments).
    text = marked_tree.sql("postgres") + "\n" + repr(marked_tree)
    return Shape(text, tuple(node for _, node in placed), positions)


def _replaced(tree: exp.Expression, at: dict[int, exp.Expression]) -> exp.Expression:
    """A copy of `tree` with the nodes at these walk positions replaced."""
    copy = tree.copy()
    nodes = list(copy.walk())
    for position, node in at.items():
        nodes[position].replace(node)
    return copy


def _filter_slots(node: exp.Expression) -> list[exp.Literal]:
    """Candidate slots of a row filter: integer numerals compared with something."""
    if isinstance(node, _CONNECTIVES):
        found = []
        for child in node.iter_expressions():
            found.extend(_filter_slots(child))
        return found
    if isinstance(node, _COMPARISONS):
        left, right = node.this, node.expression
        if isinstance(left, exp.Column) and _numeral(right) is not None:
            return [_numeral(right)]  # type: ignore[list-item]
        if isinstance(right, exp.Column) and _numeral(left) is not None:
            return [_numeral(left)]  # type: ignore[list-item]
        return []
    if isinstance(node, exp.Between) and isinstance(node.this, exp.Column):
        low, high = _numeral(node.args.get("low")), _numeral(node.args.get("high"))
        if low is not None and high is not None:
            return [low, high]
    return []


def _numeral(node: exp.Expression | None) -> exp.Literal | None:
    """An unsigned integer numeral (a bound $n number arrives in parentheses)."""
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.Literal):
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string and _INTEGER.fullmatch(node.this):
        return node
    return None


def _free_column(slot: exp.Literal, keys: set[str], aliases: set[str]) -> bool:
    """Whether the column the slot is compared with is no group key (a filter on a key can restrict
    the key's candidates: such constants stay in the key)."""
    comparison = slot.parent
    while isinstance(comparison, exp.Paren):
        comparison = comparison.parent
    if comparison is None:
        return False
    columns = [c for c in (comparison.this, comparison.args.get("expression")) if isinstance(c, exp.Column)]
    for column in columns:
        if column.sql("postgres").lower() in keys or column.name.lower() in aliases:
            return False
        if any(column.name.lower() == k.rsplit(".", 1)[-1].strip('"') for k in keys):
            return False
    return bool(columns)


_BOUNDARY = "(?<![0-9.]){}(?![0-9])"


def count_sentinels(text: str, sentinels: tuple[str, ...]) -> int:
    return sum(len(re.findall(_BOUNDARY.format(re.escape(s)), text)) for s in sentinels)


def with_values(tree: exp.Expression, replacements: dict[str, str]) -> exp.Expression:
    """A copy of `tree` whose numerals holding a sentinel hold its value instead."""

    def bind(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Literal) and not node.is_string and node.this in replacements:
            node.set("this", replacements[node.this])  # on the copy; its type annotation stays
        return node

    return tree.transform(bind, copy=True)


def with_sentinels(tree: exp.Expression, shape: Shape) -> exp.Expression:
    """A copy of the statement with sentinel numbers in the shape's slots."""
    return _replaced(tree, {p: exp.Literal.number(sentinel(i)) for i, p in enumerate(shape.positions)})


# -- the hit path: a statement's text to its shape without parsing it ----------------------------------

_POSTGRES = Dialect.get_or_raise("postgres")


@dataclass(frozen=True)
class TokenShape:
    """A statement's tokens (type, text and attached comments) with every integer numeral of at most
    nine digits abstracted (`skeleton`), and those numerals' text in order (`numerals`)."""

    skeleton: tuple[object, ...]
    numerals: tuple[str, ...]
    starts: tuple[int, ...]  # each abstracted numeral's offset in the text


def token_shape(sql: str) -> TokenShape | None:
    """The tokens of `sql` as sqlglot's PostgreSQL tokenizer reads them (None if it cannot)."""
    try:
        tokens = _POSTGRES.tokenize(sql)
    except TokenError:
        return None
    skeleton: list[object] = []
    numerals: list[str] = []
    starts: list[int] = []
    for token in tokens:
        comments = tuple(token.comments) if token.comments else ()
        if token.token_type is TokenType.NUMBER and _INTEGER.fullmatch(token.text):
            skeleton.append((TokenType.NUMBER, None, comments))
            numerals.append(token.text)
            starts.append(token.start)
        else:
            skeleton.append((token.token_type, token.text, comments))
    return TokenShape(tuple(skeleton), tuple(numerals), tuple(starts))


def token_slots(
    tokens: TokenShape, shape: Shape, tree: exp.Expression, params: Sequence[object] = ()
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Where each of the shape's slots comes from, in slot order: the index of an abstracted numeral
    of the text (found by its place in the text: sqlglot keeps a numeral's offset), or −k for the
    parameter $k; and the parameters every use of which is a slot. None when a slot's numeral cannot
    be found, or its token or parameter does not read as its value."""
    found = []
    uses: dict[int, int] = {}
    for node in tree.walk():
        if isinstance(node, exp.Literal) and node._meta and "parameter" in node._meta:
            uses[node._meta["parameter"]] = uses.get(node._meta["parameter"], 0) + 1
    for slot in shape.slots:
        meta = slot._meta or {}
        if "parameter" in meta:
            k = meta["parameter"]
            if parameter_numeral(params[k - 1]) != slot.this:
                return None
            found.append(-k)
            continue
        start = meta.get("start")
        if start is None or start not in tokens.starts:
            return None
        index = tokens.starts.index(start)
        if tokens.numerals[index] != slot.this:
            return None
        found.append(index)
    slotted = tuple(k for k, n in uses.items() if found.count(-k) == n)
    if any(-k in found and k not in slotted for k in uses):
        return None
    return tuple(found), slotted


def parameter_numeral(value: object) -> str | None:
    """A parameter's value as the numeral a slot would hold (bound as dpproxy.sql.statement binds
    it), or None when it would not be one."""
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return None
    try:
        node = literals.constant(value)
    except DPProxyError:
        return None
    numeral = _numeral(node)
    return numeral.this if numeral is not None else None


def parameter_key(value: object) -> object:
    """What a parameter that is no slot must equal for two statements to be one (its constant)."""
    try:
        return repr(literals.constant(value))
    except DPProxyError:
        return ("refused", repr(value))


@dataclass(frozen=True)
class Template:
    """A text with slots: literal pieces and, between them, the index of the slot that goes there."""

    pieces: tuple[str | int, ...]

    def bind(self, values: tuple[str, ...]) -> str:
        return "".join(p if isinstance(p, str) else values[p] for p in self.pieces)


def template(text: str, sentinels: tuple[str, ...]) -> Template:
    """`text` split at each whole-numeral occurrence of a sentinel (offsets found once, here)."""
    if not sentinels:
        return Template((text,))
    pattern = re.compile("|".join(_BOUNDARY.format(re.escape(s)) for s in sentinels))
    pieces: list[str | int] = []
    at = 0
    for match in pattern.finditer(text):
        pieces.append(text[at : match.start()])
        pieces.append(sentinels.index(match.group(0)))
        at = match.end()
    pieces.append(text[at:])
    return Template(tuple(pieces))


# -- public statements with parameters ---------------------------------------------------------------
#
# A statement over public tables only is run as the analyser re-emits it; its bound parameters are
# written by `literals.constant`. A dashboard sending `… WHERE zip = $1` with a new value each time
# reuses one analysis: the statement is analysed once with sentinel values for its parameters, and
# each later execution writes its own values' constants where the sentinels' constants stand. The
# engine learns such a template only when binding the current values into it gives exactly the SQL
# and output columns of a cold analysis of them (`Engine._learn_public`), and keys it on each
# parameter's class — text, or a non-zero integer by sign and by whether it fits `integer` or
# `bigint` — since the analyser types a constant by its value's class (zero, which probes and
# divisions read, is never templated). Whatever the values, what reaches the
# backend is the analysed statement over public tables with constants written by `literals`.


def public_parameter_classes(params: Sequence[object]) -> tuple[object, ...] | None:
    """Each parameter's class, or None if a parameter is of a kind templates do not hold."""
    classes: list[object] = []
    for value in params:
        if isinstance(value, str):
            classes.append("text")
        elif isinstance(value, int) and not isinstance(value, bool) and value != 0:
            if -(2**31) <= value < 2**31:
                width = "int4"
            elif -(2**63) <= value < 2**63:
                width = "int8"
            else:
                return None
            classes.append((width, value < 0))
        else:
            return None
    return tuple(classes)


def public_sentinels(classes: Sequence[object], token: str) -> tuple[object, ...]:
    """Values of the given classes that stand for the parameters while a template is learned: text
    holding a random `token`, integers whose digits occur nowhere else in an emitted statement."""
    values: list[object] = []
    for i, cls in enumerate(classes):
        if cls == "text":
            values.append(f"dpproxy sentinel {token} {i}")
        else:
            width, negative = cls  # type: ignore[misc]
            magnitude = (2_000_000_011 if width == "int4" else 9_000_000_000_000_000_011) + i
            values.append(-magnitude if negative else magnitude)
    return tuple(values)


def emitted(value: object, dialect: str) -> str:
    """The constant the analyser writes for a parameter's value, as SQL of `dialect`."""
    return literals.constant(value).sql(dialect)


def public_template(text: str, constants: tuple[str, ...]) -> Template | None:
    """`text` split at each occurrence of the sentinels' constants, or None if one does not occur."""
    if not constants:
        return Template((text,))
    pattern = re.compile(
        "|".join(
            re.escape(c) if c.startswith("'") else f"(?<![0-9A-Za-z_.]){re.escape(c)}(?![0-9])"
            for c in constants
        )
    )
    pieces: list[str | int] = []
    found: set[int] = set()
    at = 0
    for match in pattern.finditer(text):
        pieces.append(text[at : match.start()])
        index = constants.index(match.group(0))
        found.add(index)
        pieces.append(index)
        at = match.end()
    pieces.append(text[at:])
    return Template(tuple(pieces)) if len(found) == len(constants) else None
