"""Where a statement stops parsing, as PostgreSQL reports it: `syntax error at or near "x"` with the
1-based character position of "x" (ErrorResponse's P field, from which psql prints `LINE n:` and a caret).

sqlglot's ParseError names the token it stopped at by line, end column and text; this module turns
that into PostgreSQL's position and words. It reads only the statement's text: no value from data.
"""

from __future__ import annotations

import re

from sqlglot.errors import ParseError

from dpproxy.errors import SyntaxProblem

_EXPECTING = re.compile(r"Expecting (\S.*)")


def parse_error_position(error: ParseError, sql: str) -> tuple[int, str] | None:
    """(1-based character position in `sql`, the token's text) of sqlglot's first error, or None."""
    if not error.errors:
        return None
    first = error.errors[0]
    line, column, token = first.get("line"), first.get("col"), first.get("highlight") or ""
    if not isinstance(line, int) or not isinstance(column, int) or line < 1:
        return None
    lines = sql.split("\n")
    if line > len(lines):
        return None
    start = sum(len(text) + 1 for text in lines[: line - 1]) + column - len(token)  # 0-based
    if not 0 <= start <= len(sql) or sql[start : start + len(token)] != token:
        return None
    return start + 1, token


def syntax_problem(error: ParseError, sql: str, *, hint: str | None = None) -> SyntaxProblem:
    """PostgreSQL's syntax error for a statement sqlglot could not parse: the token it stopped at,
    what was expected when sqlglot says so in plain words, and the position."""
    found = parse_error_position(error, sql)
    if found is None:
        return SyntaxProblem("syntax error", hint=hint)
    position, token = found
    where = f'at or near "{token}"' if token else "at end of input"
    first = error.errors[0] if error.errors else {}
    expecting = _EXPECTING.fullmatch(str(first.get("description") or ""))
    message = f"syntax error {where}" + (f", expecting {expecting.group(1)}" if expecting else "")
    return SyntaxProblem(message, hint=hint, position=position)
