"""How large and how complex one statement may be: limits every statement is held to before it is
parsed or analysed, so that no statement holds a worker for long or exhausts Python's recursion.

Planning is pure Python and no time limit stops it (`--backend-timeout` and `statement_timeout` bound
the backend's part), so the limits are what bounds it. Each was measured (README, "Limits on
statements"): real clients stay far below them (the 168 catalog queries captured from BI tools and
drivers have at most 965 tokens, 873 words and operators, 7 levels of parentheses and 15 SELECTs),
and the slowest statements found within all of them plan in 1–3.5 s of CPU (the README lists them).

Three checks, each refusing with 54001 (StatementTooComplex) naming the limit and its value:

- the text's length (`check_length`), before anything reads it;
- its tokens, counted as they are read (`TokenMeter`, fed by sqlglot's tokenizer through
  `check_sqlglot_tokens`, or by the wire router's lexer): tokens, words and operators, items of
  one list, nesting — so that not even the parse can run away;
- the parsed tree (`check_tree`): its depth, since every later step recurses over it, and for a
  statement the engine plans (`planned=True`) its SELECTs, aggregates and MIN/MAX/quantile/MODE
  aggregates, whose number and size set the planning time.

`refuse_deep_recursion` is the backstop: a RecursionError becomes the same error, never an internal
one. Nothing here knows the policy, runs SQL or sees data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sqlglot import exp
from sqlglot.tokens import Token as SqlglotToken
from sqlglot.tokens import TokenType

from dpproxy.errors import StatementTooComplex

# -- the limits --------------------------------------------------------------------------------------

# Characters of one statement (and of one simple-query string, which may hold several). Checked
# before any tokenizer reads the text: sqlglot's reads 1,000,000 characters in at most 1.6 s.
MAX_LENGTH = 1_000_000
# Tokens of one statement. Parsing 50,000 tokens takes ~0.3 s; two IN lists of 10,000 constants
# (each item a constant and a comma) plan in ~0.9 s.
MAX_TOKENS = 50_000
# Words and operators: every token but constants, parameters, punctuation ( ) [ ] , ; and the sign
# or cast of a constant (so that IN (-1, '2024-01-31'::date, …) costs no words).
# Analysing them costs 0.2–0.7 ms each (a flat CASE of 800 branches plans in ~1 s).
MAX_WORDS = 5_000
# Items of one list: an IN list, the rows of a VALUES list, a function's arguments, a select list.
# Metabase and Superset filters send IN lists of up to a few thousand values; 10,000 constants plan
# in ~0.7 s, and 10,000 is also the most values an IN subquery over public tables may inline.
MAX_LIST_ITEMS = 10_000
# Nesting counted on the tokens: parentheses, brackets, CASE … END, runs of prefix operators (NOT,
# signs, INTERVAL) and chains of subscripts (x[1][2]…, which sqlglot parses in quadratic time).
# sqlglot's parser recurses on each; real clients nest fewer than 10 levels.
MAX_NESTING = 100
# Depth of the parsed tree: every analysis, rewrite and SQL generation step recurses over it, and
# fails past ~330 levels at Python's default recursion limit. A chain of AND, OR or arithmetic adds
# a level per term, so a WHERE of 250 OR terms is accepted, one of 330 would fail.
MAX_DEPTH = 256

# Statements the engine plans (private, public and constant queries) only. Planning costs grow with
# products of these (an aggregate's argument is analysed through every CTE it reads; a quantile's
# statements carry every other's bins, and the whole FROM and WHERE), so they were set together.
# SELECTs: the query, its subqueries and CTEs (BI tools send 1–3; a chain of 64 CTEs alone plans in
# ~1 s, and 100 in ~10 s).
MAX_SELECTS = 8
# Aggregate calls (COUNT, SUM, AVG, STDDEV …), and the size of all of them together: nodes of
# their trees, names not counted (`SUM(price * qty)` is 4). Analysing an aggregate costs ~0.9 ms
# per node (100 STDDEVs of 10 nodes: 0.9 s).
MAX_AGGREGATES = 100
MAX_AGGREGATE_NODES = 1_000
# MIN, MAX, MEDIAN, percentile_cont/percentile_disc and MODE calls, and their size together: each is
# a histogram over up to 1,000 candidates whose statement carries every other's bins, so their cost
# grows with their number times their size (10 MEDIANs of 10 nodes: 0.6 s; of 24 nodes: 2.6 s).
# `percentile_cont(0.9) WITHIN GROUP (ORDER BY cost)` is 6 nodes.
MAX_SELECTORS = 10
MAX_SELECTOR_NODES = 100
# …and each of them is a statement of its own over the whole query (its FROM, WHERE and CTEs), so
# their number times the statement's nodes is held too: 10 MEDIANs and 90 STDDEVs with an IN list of
# 2,000 values plan in ~2 s; with 2 IN lists of 10,000 values, in ~5 s (refused).
MAX_SELECTOR_WORK = 50_000

_SPLIT = "split it into smaller statements"


def _refuse(message: str, hint: str) -> StatementTooComplex:
    return StatementTooComplex(f"statement too complex: {message}", hint=hint)


def _more_than(limit: int, what: str, hint: str) -> StatementTooComplex:
    """The refusal of a statement that counts more than `limit` of `what` (tokens, words, list items)."""
    return _refuse(f"the statement has more than {limit} {what}; dpproxy accepts at most {limit}", hint)


def check_length(sql: str) -> None:
    """Refuse a text longer than MAX_LENGTH characters, before it is read."""
    if len(sql) > MAX_LENGTH:
        raise _refuse(
            f"the statement is {len(sql)} characters long; dpproxy accepts at most {MAX_LENGTH}",
            f"{_SPLIT}; send long lists of values as several statements",
        )


def too_deep() -> StatementTooComplex:
    """The error a RecursionError becomes: the statement was nested too deeply to analyse."""
    return _refuse(
        f"the statement is nested too deeply to analyse; dpproxy accepts expressions at most {MAX_DEPTH} "
        "levels deep",
        "write a long chain of OR as IN (…), and nest fewer subqueries, CASE expressions and parentheses",
    )


@contextmanager
def refuse_deep_recursion() -> Iterator[None]:
    """Turn a RecursionError raised inside the block into StatementTooComplex (54001).

    A context manager or, as `@refuse_deep_recursion()`, a decorator. The limits keep statements
    shallow enough for every step dpproxy takes; this is the backstop for a step deeper than
    measured, so that a client never gets an internal error for a statement it wrote."""
    try:
        yield
    except RecursionError:
        raise too_deep() from None


# -- tokens ------------------------------------------------------------------------------------------

# What the meter needs to know of a token (both tokenizers are mapped to these).
WORD = 0  # a name, keyword or operator
CONSTANT = 1  # a number, string, parameter, NULL, TRUE or FALSE
COMMA = 2
SEMICOLON = 3
OPEN = 4  # (
CLOSE = 5  # )
OPEN_BRACKET = 6  # [
CLOSE_BRACKET = 7  # ]
SIGN = 8  # + or -, unary or binary
PREFIX = 9  # NOT, INTERVAL: keywords sqlglot's parser recurses on when repeated
CASE = 10
END = 11
IN = 12
VALUES = 13
SELECT = 14
CAST = 15  # ::
_CAST_OF_CONSTANT = 16  # (internal) the :: of a cast of a constant

# Tokens that are not words: constants, parameters and punctuation.
_FREE = frozenset({CONSTANT, COMMA, SEMICOLON, OPEN, CLOSE, OPEN_BRACKET, CLOSE_BRACKET})

_PAREN, _BRACKET, _CASE = 0, 1, 2
_IN_LIST, _VALUES_LIST, _LIST = "items in one IN list", "rows in one VALUES list", "items in one list"


class _Frame:
    __slots__ = ("items", "kind", "label", "level", "subscripts")

    def __init__(self, kind: int, level: int, label: str = _LIST, subscripts: int = 0) -> None:
        self.kind = kind
        self.level = level
        self.label = label
        self.items = 1
        self.subscripts = subscripts


class TokenMeter:
    """One statement's tokens, counted as they are read (`add` each); refuses at the first limit
    passed, so that a caller reading tokens one at a time reads at most MAX_TOKENS + 1 of them."""

    __slots__ = ("_closed_subscripts", "_frames", "_prefix", "_previous", "_top", "tokens", "words")

    def __init__(self) -> None:
        self.tokens = 0
        self.words = 0
        self._top = _Frame(_PAREN, 0)  # the statement's own level: its select list, GROUP BY …
        self._frames: list[_Frame] = []
        self._prefix = 0  # prefix operators just read, in a row
        self._previous = -1
        self._closed_subscripts = 0  # the subscript chain of the bracket just closed

    def add(self, kind: int) -> None:
        self.tokens += 1
        if self.tokens > MAX_TOKENS:
            raise _more_than(MAX_TOKENS, "tokens", _SPLIT)
        previous, self._previous = self._previous, kind
        free = kind in _FREE or (
            # A sign before a constant is part of it (IN (-1, -2)), and so is a cast of a constant
            # ('2024-01-31'::date): lists of them cost no words.
            (kind == SIGN and previous in (OPEN, OPEN_BRACKET, COMMA))
            or (kind == CAST and previous == CONSTANT)
            or previous == _CAST_OF_CONSTANT
        )
        if kind == CAST and previous == CONSTANT:
            self._previous = _CAST_OF_CONSTANT  # the type name that follows is free too
        if not free:
            self.words += 1
            if self.words > MAX_WORDS:
                raise _more_than(
                    MAX_WORDS,
                    "words and operators (names, keywords and operators)",
                    f"{_SPLIT}; a list of values costs no words as IN (…) of constants",
                )
        frame = self._frames[-1] if self._frames else self._top
        if kind in (SIGN, PREFIX):
            self._prefix += 1
            self._check_nesting(frame.level + self._prefix)
            return
        prefix, self._prefix = self._prefix, 0
        if kind == COMMA:
            frame.items += 1
            if frame.items > MAX_LIST_ITEMS:
                raise _more_than(
                    MAX_LIST_ITEMS,
                    frame.label,
                    f"{_SPLIT}, each with a shorter list, or filter on a coarser column",
                )
        elif kind == OPEN:
            self._push(_Frame(_PAREN, frame.level + prefix + 1, _IN_LIST if previous == IN else _LIST))
        elif kind == OPEN_BRACKET:
            chain = self._closed_subscripts + 1 if previous == CLOSE_BRACKET else 1
            self._push(_Frame(_BRACKET, frame.level + prefix + chain, subscripts=chain))
        elif kind == CASE:
            self._push(_Frame(_CASE, frame.level + prefix + 1))
        elif kind in (CLOSE, CLOSE_BRACKET):
            wanted = _PAREN if kind == CLOSE else _BRACKET
            while self._frames:  # CASEs left open inside are closed with their parenthesis
                closed = self._frames.pop()
                if closed.kind == wanted:
                    self._closed_subscripts = closed.subscripts
                    break
        elif kind == END:
            if self._frames and self._frames[-1].kind == _CASE:
                self._frames.pop()
        elif kind == VALUES:
            frame.label = _VALUES_LIST
        elif kind == SELECT:
            if frame.label == _IN_LIST:
                frame.label = _LIST  # IN (SELECT a, b …): a select list
        elif kind == SEMICOLON:
            self._frames.clear()
            self._top.items = 1

    def _push(self, frame: _Frame) -> None:
        self._check_nesting(frame.level)
        self._frames.append(frame)

    @staticmethod
    def _check_nesting(level: int) -> None:
        if level > MAX_NESTING:
            raise _refuse(
                f"the statement nests more than {MAX_NESTING} levels deep (parentheses, brackets, CASE, "
                f"NOT, signs and chained subscripts count); dpproxy accepts at most {MAX_NESTING}",
                "nest fewer parentheses, subqueries and CASE expressions",
            )


_SQLGLOT_KINDS: dict[TokenType, int] = {
    TokenType.L_PAREN: OPEN,
    TokenType.R_PAREN: CLOSE,
    TokenType.L_BRACKET: OPEN_BRACKET,
    TokenType.R_BRACKET: CLOSE_BRACKET,
    TokenType.COMMA: COMMA,
    TokenType.SEMICOLON: SEMICOLON,
    TokenType.DASH: SIGN,
    TokenType.PLUS: SIGN,
    TokenType.NOT: PREFIX,
    TokenType.INTERVAL: PREFIX,
    TokenType.CASE: CASE,
    TokenType.END: END,
    TokenType.IN: IN,
    TokenType.VALUES: VALUES,
    TokenType.SELECT: SELECT,
    TokenType.DCOLON: CAST,
    TokenType.PLACEHOLDER: CONSTANT,
    **{
        t: CONSTANT
        for t in (
            TokenType.NUMBER,
            TokenType.STRING,
            TokenType.NATIONAL_STRING,
            TokenType.RAW_STRING,
            TokenType.HEREDOC_STRING,
            TokenType.UNICODE_STRING,
            TokenType.BIT_STRING,
            TokenType.HEX_STRING,
            TokenType.BYTE_STRING,
            TokenType.NULL,
            TokenType.TRUE,
            TokenType.FALSE,
        )
    },
}


def check_sqlglot_tokens(tokens: Sequence[SqlglotToken]) -> TokenMeter:
    """Hold sqlglot's tokens of one statement to the token limits (before they are parsed); the
    meter, with what it counted."""
    meter = TokenMeter()
    kinds = _SQLGLOT_KINDS
    parameter = TokenType.PARAMETER
    for token in tokens:
        kind = token.token_type
        if kind is parameter and token.text == "$":
            continue  # $1 is two tokens to sqlglot, "$" and "1": one constant, as PostgreSQL reads it
        meter.add(kinds.get(kind, WORD))
    return meter


# -- the tree ----------------------------------------------------------------------------------------

_SELECTORS = (exp.Min, exp.Max, exp.Median, exp.PercentileCont, exp.PercentileDisc, exp.Mode)


def check_tree(tree: exp.Expression, *, planned: bool = False) -> None:
    """Hold a parsed statement to MAX_DEPTH and, when the engine plans it (`planned`), to the
    limits on SELECTs, aggregates and selectors. Walks the tree without recursion."""
    deepest = nodes = selects = aggregates = aggregate_nodes = selectors = selector_nodes = 0
    # (node, depth, inside an aggregate call, inside a MIN/MAX/quantile/MODE call)
    stack: list[tuple[exp.Expression, int, bool, bool]] = [(tree, 1, False, False)]
    while stack:
        node, depth, in_aggregate, in_selector = stack.pop()
        if depth > deepest:
            deepest = depth
        if planned:
            identifier = isinstance(node, exp.Identifier)
            if not identifier:
                nodes += 1
            if isinstance(node, exp.Select):
                selects += 1
            elif not in_aggregate and isinstance(node, (exp.AggFunc, exp.WithinGroup)):
                in_aggregate = True
                aggregates += 1
                inner = node.this if isinstance(node, exp.WithinGroup) else node
                if isinstance(inner, _SELECTORS):
                    in_selector = True
                    selectors += 1
            if in_aggregate and not identifier:
                aggregate_nodes += 1
                if in_selector:
                    selector_nodes += 1
        stack.extend((child, depth + 1, in_aggregate, in_selector) for child in node.iter_expressions())
    if deepest > MAX_DEPTH:
        raise _refuse(
            f"the statement's expressions are nested {deepest} levels deep (each term of a chain of AND, "
            f"OR or arithmetic adds a level); dpproxy accepts at most {MAX_DEPTH}",
            "write a long chain of OR as IN (…), or split the statement",
        )
    if not planned:
        return
    if selects > MAX_SELECTS:
        raise _refuse(
            f"the statement has {selects} SELECTs (the query, its subqueries and CTEs); dpproxy plans at "
            f"most {MAX_SELECTS}",
            f"{_SPLIT}, or read fewer CTEs and subqueries",
        )
    fewer = f"{_SPLIT}, each with fewer or simpler aggregates"
    if aggregates > MAX_AGGREGATES:
        raise _refuse(
            f"the statement calls aggregates {aggregates} times; dpproxy plans at most {MAX_AGGREGATES} "
            "aggregate calls in one statement",
            fewer,
        )
    if aggregate_nodes > MAX_AGGREGATE_NODES:
        raise _refuse(
            f"the statement's aggregate calls have {aggregate_nodes} nodes (operators, functions, columns "
            f"and constants); dpproxy plans at most {MAX_AGGREGATE_NODES} in one statement",
            fewer,
        )
    if selectors > MAX_SELECTORS:
        raise _refuse(
            f"the statement has {selectors} MIN, MAX, MEDIAN, percentile and MODE aggregates; dpproxy "
            f"plans at most {MAX_SELECTORS} in one statement",
            fewer,
        )
    if selector_nodes > MAX_SELECTOR_NODES:
        raise _refuse(
            f"the statement's MIN, MAX, MEDIAN, percentile and MODE aggregates have {selector_nodes} nodes "
            f"(operators, functions, columns and constants); dpproxy plans at most {MAX_SELECTOR_NODES} "
            "in one statement",
            f"{fewer}: give them plain columns or simpler expressions",
        )
    if selectors * nodes > MAX_SELECTOR_WORK:
        raise _refuse(
            f"the statement has {selectors} MIN, MAX, MEDIAN, percentile and MODE aggregates and {nodes} "
            f"nodes, and each of these aggregates plans the whole statement again; dpproxy plans at most "
            f"{MAX_SELECTOR_WORK} for their number times the statement's nodes",
            f"{_SPLIT}: ask for these aggregates with a shorter WHERE (fewer values in its IN lists), or "
            "for fewer of them at a time",
        )
