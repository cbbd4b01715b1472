"""What a statement is: the one place that decides where SQL from a client goes (docs/architecture.md).

    SET, SHOW, RESET, DISCARD, DEALLOCATE                → SESSION, answered by the session
    SELECT set_config(…) [, current_setting(…) …]        → SESSION (set_config: SET as a function)
    BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE          → TRANSACTION
    DECLARE … CURSOR, FETCH, MOVE, CLOSE                 → CURSOR
    EXPLAIN <query on exposed tables>                    → EXPLAIN (engine.explain, never the database)
    COPY (query) TO STDOUT, COPY table TO STDOUT         → COPY (the query's answer in COPY's format)
    PREPARE name AS query, EXECUTE name(…)               → PREPARED (the session's prepared statements)
    LOCK [TABLE] name … IN ACCESS SHARE MODE             → SESSION (in a transaction: changes nothing)
    a query reading catalog relations, or no relation    → CATALOG (the shadow catalog)
    a query reading any other relation                   → ENGINE (which refuses what is not exposed)
    anything else                                        → refused with a SQLSTATE

The package never runs SQL and never sees data or a session: a decision depends only on the query
text and the names of the exposed tables. Its parts:

    lexer       tokens, splitting a simple query into statements, quote_identifier
    limits      the statement limits (dpproxy.sql.limits) counted on the lexer's tokens, as they are read
    statement   Kind and Statement, what the session acts on
    classify    route(): one statement's kind, and the parsing of session, transaction and cursor commands
    set_config  recognising SELECT set_config(…) so that the session runs it as SET
    prepared    PREPARE, EXECUTE and LOCK
    copy_to     COPY … TO STDOUT: its query, and its options checked as PostgreSQL checks them
    relations   the relations a query reads (sqlglot's tree, or a token scan where sqlglot fails)
"""

from dpproxy.wire.router.classify import route
from dpproxy.wire.router.lexer import (
    QUOTED_KEYWORDS,
    LexError,
    Token,
    TokenKind,
    quote_identifier,
    split_statements,
    statement_offsets,
    tokenize,
)
from dpproxy.wire.router.relations import CATALOG_SCHEMAS, is_catalog_relation
from dpproxy.wire.router.statement import (
    MAX_PARAMETERS,
    Argument,
    CopyOptions,
    Kind,
    SettingCall,
    Statement,
)

__all__ = [
    "CATALOG_SCHEMAS",
    "MAX_PARAMETERS",
    "QUOTED_KEYWORDS",
    "Argument",
    "CopyOptions",
    "Kind",
    "LexError",
    "SettingCall",
    "Statement",
    "Token",
    "TokenKind",
    "is_catalog_relation",
    "quote_identifier",
    "route",
    "split_statements",
    "statement_offsets",
    "tokenize",
]
