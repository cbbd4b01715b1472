"""The relations a query reads: which decides whether the catalog or the engine answers it.

Relations are found on sqlglot's tree, or, where sqlglot cannot parse a query (clients send catalog
SQL it does not know, such as ``OPERATOR(pg_catalog.~)``), by a scan of the tokens. Writes hidden in
a query (data-modifying WITH, SELECT … INTO) and row locks are refused here. This module never runs
SQL and never sees data or a session.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlglot
from sqlglot import exp

from dpproxy.errors import NotSupported, PolicyViolation
from dpproxy.wire.router.lexer import Token, TokenKind
from dpproxy.wire.router.statement import ALLOWED

CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})


def relations_read(sql: str, tokens: Sequence[Token]) -> list[tuple[str | None, str]]:
    """(schema or None, relation) for every relation the query reads; CTE names excluded.

    Raises for writes hidden in a query (data-modifying WITH, SELECT INTO) and row locks.
    """
    _check_query_tokens(tokens)
    try:
        trees = sqlglot.parse(_for_sqlglot(tokens, sql), read="postgres")
    except Exception:  # sqlglot raises several error types on what it cannot parse
        return _scanrelations_read(tokens)
    if len(trees) != 1 or trees[0] is None:
        return _scanrelations_read(tokens)
    tree = trees[0]
    if tree.find(exp.Insert, exp.Update, exp.Delete, exp.Merge):
        raise PolicyViolation("dpproxy is read-only: data-modifying statements are not allowed", hint=ALLOWED)
    if not isinstance(tree, (exp.Query, exp.Subquery, exp.Values)):
        return _scanrelations_read(tokens)
    if tree.find(exp.Into):
        raise PolicyViolation("dpproxy is read-only: SELECT … INTO is not allowed", hint=ALLOWED)
    if tree.find(exp.Lock):
        raise NotSupported("row locking (FOR UPDATE / FOR SHARE) is not supported", hint=ALLOWED)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    found: list[tuple[str | None, str]] = []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue  # a table function such as generate_series(…) or unnest(…)
        name = table.this
        schema = table.args.get("db")
        schema_name = _ident_value(schema) if isinstance(schema, exp.Identifier) else None
        relation = _ident_value(name)
        if schema_name is None and relation in ctes:
            continue
        found.append((schema_name, relation))
    return found


def _ident_value(identifier: exp.Identifier) -> str:
    return identifier.this if identifier.quoted else identifier.this.lower()


def _check_query_tokens(tokens: Sequence[Token]) -> None:
    """Writes inside a query, found without a parser (a data-modifying WITH cannot hide from it)."""
    for i, token in enumerate(tokens):
        if token.kind is not TokenKind.IDENT:
            continue
        previous = tokens[i - 1] if i else None
        after_paren = previous is not None and previous.kind is TokenKind.OP and previous.text == "("
        if token.value in ("insert", "update", "delete", "merge") and after_paren:
            raise PolicyViolation(
                "dpproxy is read-only: data-modifying statements are not allowed", hint=ALLOWED
            )


def _for_sqlglot(tokens: Sequence[Token], sql: str) -> str:
    """The query with the constructs sqlglot cannot parse replaced by equivalent text.

    OPERATOR(schema.op) becomes the bare operator and COLLATE clauses are dropped: neither changes
    which relations the query reads.
    """
    out: list[str] = []
    i, last = 0, 0
    while i < len(tokens):
        token = tokens[i]
        if token.is_word("operator") and i + 1 < len(tokens) and tokens[i + 1].text == "(":
            close = operator_close(tokens, i)
            if close is not None:
                out.append(sql[last : token.start])
                out.append(" " + tokens[close - 1].text + " ")
                last = tokens[close].end
                i = close + 1
                continue
        if token.is_word("collate") and i + 1 < len(tokens):
            j = i + 1
            while j + 2 < len(tokens) and tokens[j + 1].text == ".":
                j += 2
            out.append(sql[last : token.start])
            last = tokens[j].end
            i = j + 1
            continue
        i += 1
    out.append(sql[last:])
    return "".join(out)


def operator_close(tokens: Sequence[Token], i: int) -> int | None:
    """The index of the ')' of OPERATOR(schema.op) at i, looked for among the few tokens it can hold
    (a search to the end of the text at every `operator(` would make a long text quadratic)."""
    return next((j for j in range(i + 2, min(len(tokens), i + 6)) if tokens[j].text == ")"), None)


_CLAUSE_ENDS = frozenset(
    {
        "where",
        "group",
        "having",
        "order",
        "limit",
        "offset",
        "fetch",
        "window",
        "union",
        "intersect",
        "except",
        "for",
        "on",
        "using",
        "returning",
        "into",
        "select",
        "values",
    }
)
_JOIN_WORDS = frozenset({"join", "cross", "natural", "inner", "left", "right", "full", "outer", "lateral"})


def _scanrelations_read(tokens: Sequence[Token]) -> list[tuple[str | None, str]]:
    """Relations in FROM and JOIN positions, found from tokens alone (for SQL sqlglot cannot parse).

    A name after FROM, JOIN or a comma of a FROM list is a relation unless a parenthesis or a
    function call follows; WITH names are CTEs. Conservative: what looks like a relation counts.
    """
    ctes = _cte_names(tokens)
    found: list[tuple[str | None, str]] = []
    # A stack of "in a FROM list" flags, one per parenthesis depth.
    in_from = [False]
    expect_relation = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.kind is TokenKind.OP and token.text in ("(", "["):
            in_from.append(False)
            expect_relation = False
            i += 1
            continue
        if token.kind is TokenKind.OP and token.text in (")", "]"):
            if len(in_from) > 1:
                in_from.pop()
            i += 1
            continue
        if token.kind is TokenKind.IDENT and token.value == "from":
            in_from[-1] = True
            expect_relation = True
            i += 1
            continue
        if token.kind is TokenKind.IDENT and token.value in _JOIN_WORDS:
            if token.value == "join":
                in_from[-1] = True
                expect_relation = True
            i += 1
            continue
        if token.kind is TokenKind.IDENT and token.value in _CLAUSE_ENDS:
            in_from[-1] = False
            expect_relation = False
            i += 1
            continue
        if token.kind is TokenKind.OP and token.text == "," and in_from[-1]:
            expect_relation = True
            i += 1
            continue
        if expect_relation and token.kind in (TokenKind.IDENT, TokenKind.QUOTED):
            j, parts = i, [token.value]
            while (
                j + 2 < len(tokens)
                and tokens[j + 1].text == "."
                and tokens[j + 2].kind
                in (
                    TokenKind.IDENT,
                    TokenKind.QUOTED,
                )
            ):
                parts.append(tokens[j + 2].value)
                j += 2
            following = tokens[j + 1] if j + 1 < len(tokens) else None
            is_call = following is not None and following.text == "("
            if not is_call and not (token.kind is TokenKind.IDENT and token.value == "only"):
                schema = parts[-2] if len(parts) >= 2 else None
                if not (schema is None and parts[-1] in ctes):
                    found.append((schema, parts[-1]))
            expect_relation = token.kind is TokenKind.IDENT and token.value == "only"
            i = j + 1
            continue
        expect_relation = False
        i += 1
    return found


def _cte_names(tokens: Sequence[Token]) -> set[str]:
    names: set[str] = set()
    for i, token in enumerate(tokens):
        if token.kind in (TokenKind.IDENT, TokenKind.QUOTED) and i + 1 < len(tokens):
            nxt = tokens[i + 1]
            prev = tokens[i - 1] if i else None
            starts = prev is not None and (prev.is_word("with", "recursive") or prev.text == ",")
            if starts and (nxt.is_word("as") or nxt.text == "("):
                names.add(token.value)
    return names


def is_catalog_relation(schema: str | None, name: str) -> bool:
    """A relation the shadow catalog answers for: pg_catalog.*, information_schema.*, unqualified pg_*."""
    return schema in CATALOG_SCHEMAS or (schema is None and name.startswith("pg_"))
