"""Functions the shadow refuses by name, before DuckDB sees the query.

DuckDB's own functions reach its machinery (files, settings, extensions), not PostgreSQL's
catalog: asking for one gets 42883, as for a function PostgreSQL does not have. PostgreSQL's
functions that would act (change a setting, sleep, draw a random number, signal a backend, take a
lock, write) get a refusal that says what to do instead: a shadow that answered them would answer
as if it had done what it cannot do. This module only reads tokens; it never runs SQL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dpproxy.errors import DPProxyError, NotSupported, PolicyViolation, UndefinedFunction
from dpproxy.wire.router import TokenKind, tokenize

# DuckDB's own functions, which reach its machinery rather than PostgreSQL's catalog.
_INTERNAL_FUNCTIONS = re.compile(
    r"\b(duckdb_\w+|pragma_\w+|read_\w+|glob|query|query_table|sniff_csv|parquet_\w+|iceberg_\w+|"
    r"delta_scan|json_execute_serialized_sql|which_secret|getvariable|enable_\w+|load_\w+|install_\w+|"
    r"summarize|checkpoint|test_\w+|repeat_row|range|getenv|icu_\w+|arrow_scan\w*|seq_scan|python_\w+|"
    # …and those that act (sleep, log, raise) or draw random numbers, under names PostgreSQL lacks.
    r"sleep_ms|write_log|error|rand|uuid|uuidv4|uuidv7|current_connection_id|current_query_id|"
    r"current_transaction_id|stats|vector_type)\s*\(",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Refusal:
    """Why the shadow refuses a PostgreSQL function that would act, and what to do instead."""

    error: type[DPProxyError]
    reason: str
    hint: str

    def exception(self, name: str) -> DPProxyError:
        if self.error is PolicyViolation:  # PostgreSQL's words for a function the role may not call
            return self.error(f"permission denied for function {name}: {self.reason}", hint=self.hint)
        return self.error(f"{name}() is not supported: {self.reason}", hint=self.hint)


def _refusals(names: str, error: type[DPProxyError], reason: str, hint: str) -> dict[str, _Refusal]:
    return dict.fromkeys(names.split(), _Refusal(error, reason, hint))


_ONLY_QUERIES = "dpproxy answers SELECT queries on the exposed tables and catalog queries"

# PostgreSQL functions that do something rather than describe the catalog. A shadow that answered
# them would answer as if it had done it (a setting changed, a sleep slept, a random number drawn,
# a lock taken) while it did nothing. dpproxy does none of these for analysts' SQL, so each is
# refused by name, with what works instead, even where PostgreSQL 15 would merely not know it.
REFUSED_FUNCTIONS: Mapping[str, _Refusal] = {
    **_refusals(
        "set_config",
        NotSupported,
        "dpproxy runs set_config only in a SELECT of set_config and current_setting calls alone, "
        "with constants or parameters as arguments",
        "send it on its own, e.g. SELECT set_config('dpproxy.epsilon', '0.1', false), "
        "or use SET dpproxy.epsilon = 0.1 (SET LOCAL for is_local = true)",
    ),
    **_refusals(
        "pg_sleep pg_sleep_for pg_sleep_until",
        NotSupported,
        "dpproxy does not offer timing functions",
        "wait in the client instead",
    ),
    **_refusals(
        "random setseed gen_random_uuid",
        NotSupported,
        "dpproxy draws no randomness for analysts' SQL",
        "dpproxy adds the privacy noise to answers itself; draw other random numbers in the client",
    ),
    **_refusals(
        "pg_cancel_backend",
        NotSupported,
        "a dpproxy session cannot signal other sessions",
        "cancel your own running query with your client's cancel request (Ctrl-C in psql)",
    ),
    **_refusals(
        "pg_terminate_backend",
        NotSupported,
        "a dpproxy session cannot signal other sessions",
        "close the connection you want to end",
    ),
    **_refusals(
        """txid_current txid_current_if_assigned txid_current_snapshot pg_current_xact_id
        pg_current_xact_id_if_assigned pg_current_snapshot pg_export_snapshot""",
        NotSupported,
        "dpproxy is read-only and assigns no transaction IDs",
        "BEGIN, COMMIT and ROLLBACK work as usual; dpproxy answers each query on its own",
    ),
    **_refusals(
        "nextval currval setval lastval",
        NotSupported,
        "dpproxy is read-only and has no sequences",
        _ONLY_QUERIES,
    ),
    **_refusals(
        """pg_advisory_lock pg_advisory_lock_shared pg_advisory_unlock pg_advisory_unlock_shared
        pg_advisory_unlock_all pg_advisory_xact_lock pg_advisory_xact_lock_shared pg_try_advisory_lock
        pg_try_advisory_lock_shared pg_try_advisory_xact_lock pg_try_advisory_xact_lock_shared""",
        NotSupported,
        "dpproxy is read-only and takes no locks",
        _ONLY_QUERIES,
    ),
    **_refusals("pg_notify", NotSupported, "dpproxy has no LISTEN/NOTIFY", _ONLY_QUERIES),
    **_refusals(
        """lo_create lo_creat lo_import lo_export lo_unlink lo_open lo_close lo_get lo_put lo_from_bytea
        loread lowrite lo_lseek lo_lseek64 lo_tell lo_tell64 lo_truncate lo_truncate64""",
        NotSupported,
        "dpproxy has no large objects",
        _ONLY_QUERIES,
    ),
    **_refusals(
        "current_query",
        NotSupported,
        "the catalog runs a translation of the query, so the text it has is not the one you sent",
        "your client has the text of the query it sent",
    ),
    **_refusals(
        """pg_reload_conf pg_rotate_logfile pg_read_file pg_read_binary_file pg_ls_dir pg_stat_file
        pg_ls_logdir pg_ls_waldir pg_ls_tmpdir pg_ls_archive_statusdir pg_switch_wal pg_promote
        pg_create_restore_point pg_backup_start pg_backup_stop pg_stat_reset pg_stat_reset_shared
        pg_stat_reset_single_table_counters pg_stat_reset_single_function_counters pg_stat_reset_slru
        pg_log_backend_memory_contexts""",
        PolicyViolation,
        "a dpproxy analyst cannot reach the server's files, configuration, logs or statistics",
        _ONLY_QUERIES + "; the operator runs the server",
    ),
}


def refuse_internals(sql: str) -> None:
    """DuckDB's own table functions are not PostgreSQL's: asking for one gets 42883. A PostgreSQL
    function that would act gets its refusal (REFUSED_FUNCTIONS) before DuckDB sees the query,
    whether or not DuckDB has a function of that name."""
    tokens = tokenize(sql)
    # DuckDB finds a function whatever the case of its name, quoted or not: so must this.
    scrubbed = " ".join(
        "''" if t.kind is TokenKind.STRING else t.value if t.kind is TokenKind.QUOTED else t.text
        for t in tokens
    )
    match = _INTERNAL_FUNCTIONS.search(scrubbed)
    if match:
        raise UndefinedFunction(
            f"function {match.group(1).lower()} does not exist",
            hint="the catalog answers PostgreSQL's catalog queries (pg_catalog, information_schema)",
        )
    for i, token in enumerate(tokens[:-1]):
        if token.kind not in (TokenKind.IDENT, TokenKind.QUOTED) or tokens[i + 1].text != "(":
            continue
        name = token.value.lower()
        refusal = REFUSED_FUNCTIONS.get(name)
        if name in REFUSED_PER_ROW:
            continue
        if refusal is not None and not (i and tokens[i - 1].is_word("as")):  # not FROM f() AS random(x)
            raise refusal.exception(name)


# Refused by their macro for each row that reaches them (data/macros.sql), so that over no row they
# do nothing, as in PostgreSQL: pg_dump's `SELECT set_config(name, …) FROM pg_settings WHERE name =
# 'restrict_nonsystem_relation_kind'` finds no such setting here (nor in PostgreSQL 15.0) and sets none.
REFUSED_PER_ROW = frozenset({"set_config"})


def refused_per_row(name: str) -> DPProxyError:
    """The refusal a per-row macro raised (its error text: `dpproxy:refused:<name>`)."""
    return REFUSED_FUNCTIONS[name].exception(name)
