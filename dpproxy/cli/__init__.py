"""The `dpproxy` command: click commands over the engine, the policy loader, the ledger and the demo.

One module per command group, each adding its commands to the root group `main` here: query
(`query`, `explain`), budget, audit, policy, serve (`serve`, `console`) and demo; common holds what
they share (the ledger default, the options, the table, how an error is rendered) and dsn what a
backend address may show. Errors are rendered once (common.fail): a DPProxyError becomes
"ERROR <SQLSTATE>: message" (and its hint) on stderr with exit status 1. Nothing here computes
privacy: it only calls the engine.
"""

from __future__ import annotations

import click

from dpproxy import __version__
from dpproxy.cli import audit, budget, demo, policy, query, serve
from dpproxy.cli.audit import format_audit
from dpproxy.cli.common import (
    BACKEND_HELP,
    DEFAULT_LEDGER_ENV,
    default_ledger_path,
    fail,
    format_table,
    ledger_option,
    parse_param,
    policy_option,
)
from dpproxy.cli.demo import (
    DEMO_ANALYSTS,
    DEMO_DATABASE,
    DEMO_OWNER,
    SPARK_DEMO_POLICY,
    default_demo_dir,
    demo_policy_path,
    spark_demo_policy,
)
from dpproxy.cli.dsn import SPARK_DATABASE, mask_dsn, mask_password, served_database
from dpproxy.cli.serve import (
    backend_timeout_option,
    host_option,
    open_served_engine,
    operations_options,
    workers_option,
)

__all__ = [
    "BACKEND_HELP",
    "DEFAULT_LEDGER_ENV",
    "DEMO_ANALYSTS",
    "DEMO_DATABASE",
    "DEMO_OWNER",
    "SPARK_DATABASE",
    "SPARK_DEMO_POLICY",
    "backend_timeout_option",
    "default_demo_dir",
    "default_ledger_path",
    "demo_policy_path",
    "fail",
    "format_audit",
    "format_table",
    "host_option",
    "ledger_option",
    "main",
    "mask_dsn",
    "mask_password",
    "open_served_engine",
    "operations_options",
    "parse_param",
    "policy_option",
    "served_database",
    "spark_demo_policy",
    "workers_option",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dpproxy")
def main() -> None:
    """dpproxy: differentially private SQL over PostgreSQL, DuckDB or Apache Spark.

    Analysts send ordinary SQL; dpproxy bounds each person's contribution, adds calibrated noise and
    charges the analyst's privacy budget. Start with `dpproxy demo` and connect with psql, or serve
    your own data with `dpproxy serve`; `dpproxy explain` shows what a query is rewritten into.
    """


for _command in (
    query.query,
    query.explain,
    budget.budget,
    audit.audit,
    policy.policy,
    serve.serve,
    serve.console_command,
    demo.demo,
):
    main.add_command(_command)
