"""The statement limits (dpproxy.sql.limits) on the router's own tokens: checked as the lexer reads
them, so that the router, the shadow catalog and the engine never see a statement past them, and
never read more than MAX_TOKENS + 1 tokens of any text.

The same limits as the engine's (which counts on sqlglot's tokens), from this module's mapping of
the router's tokens to what the meter needs to know. It never parses, runs SQL or sees a session.
"""

from __future__ import annotations

from dpproxy.errors import StatementTooComplex
from dpproxy.sql import limits
from dpproxy.sql.limits import MAX_TOKENS, TokenMeter, check_length
from dpproxy.wire.router.lexer import Token, TokenKind, lex, split_tokens

_OPS = {
    "(": limits.OPEN,
    ")": limits.CLOSE,
    "[": limits.OPEN_BRACKET,
    "]": limits.CLOSE_BRACKET,
    ",": limits.COMMA,
    ";": limits.SEMICOLON,
    "+": limits.SIGN,
    "-": limits.SIGN,
    "::": limits.CAST,
}
_WORDS = {
    "not": limits.PREFIX,
    "interval": limits.PREFIX,
    "case": limits.CASE,
    "end": limits.END,
    "in": limits.IN,
    "values": limits.VALUES,
    "select": limits.SELECT,
    "null": limits.CONSTANT,
    "true": limits.CONSTANT,
    "false": limits.CONSTANT,
}


def kind_of(token: Token) -> int:
    """What the meter needs to know of a token."""
    kind = token.kind
    if kind is TokenKind.IDENT:
        return _WORDS.get(token.value, limits.WORD)
    if kind is TokenKind.OP:
        return _OPS.get(token.text, limits.WORD)
    if kind is TokenKind.QUOTED:
        return limits.WORD
    return limits.CONSTANT  # STRING, NUMBER, PARAM


def checked_tokens(sql: str, *, strict: bool = False) -> list[Token]:
    """The tokens of one statement, refused with 54001 at the first limit it passes: its length
    first, then its tokens as they are read. `strict`: as `tokenize`, LexError on an unterminated
    string or comment; otherwise the rest of the text is one last token (as split_statements reads)."""
    check_length(sql)
    meter = TokenMeter()
    add = meter.add
    tokens: list[Token] = []
    append = tokens.append
    for token in lex(sql, strict=strict):
        add(kind_of(token))
        append(token)
    return tokens


def checked_split(sql: str) -> list[str]:
    """The statements of a simple query's string (split_statements), read once and refused (54001)
    past its length, its number of tokens (one string may hold several statements), or any limit of
    one of its statements — so that a 100,000-item IN list is refused for its list, as soon as the
    list passes the limit."""
    check_length(sql)
    meter = TokenMeter()
    tokens: list[Token] = []
    for count, token in enumerate(lex(sql, strict=False), 1):
        kind = kind_of(token)
        if kind == limits.SEMICOLON:
            meter = TokenMeter()
        else:
            meter.add(kind)
        if count > MAX_TOKENS:
            raise StatementTooComplex(
                f"statement too complex: the query string has more than {MAX_TOKENS} tokens; dpproxy "
                f"accepts at most {MAX_TOKENS}",
                hint="split it into smaller statements, sent one at a time",
            )
        tokens.append(token)
    return split_tokens(sql, tokens)
