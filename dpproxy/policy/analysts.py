"""The `analysts:` and `server:` sections of a policy file: who may query, with what budget and credential.

This module owns reading analysts into `AnalystPolicy` (total ε and δ, the per-query ε cap, a
SCRAM-SHA-256 verifier and PostgreSQL's md5 hash) and `server.auth_methods` into `ServerPolicy`,
since how analysts authenticate belongs with their credentials.

It must never echo a credential: a `password` field may hold a plaintext password pasted by
mistake, and an md5 hash is as good as the password for the md5 method. Problems name the field and
how to make a proper value (`dpproxy policy passwd`), never its content.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypedDict

from dpproxy import scram
from dpproxy.policy.marked_yaml import Node
from dpproxy.policy.model import AnalystPolicy, AuthMethod, DataSetBudget, Defaults, ServerPolicy
from dpproxy.policy.problems import Problems, join_path
from dpproxy.policy.readers import (
    check_keys,
    check_names,
    read_choice,
    read_float,
    read_integer,
    read_mapping,
    read_section,
    read_text,
)
from dpproxy.policy.refresh import REFRESHES, Refresh

_SERVER_KEYS = ("auth_methods", "audit_retention_days", "ledger")
_ANALYST_KEYS = ("password", "epsilon", "delta", "max_epsilon_per_query", "md5_password", "refresh")
_BUDGET_KEYS = ("epsilon", "delta", "refresh")
_MD5_HASH = re.compile(r"md5[0-9a-f]{32}")
_PASSWD_FIX = "run `dpproxy policy passwd` and paste its output"


class _Credentials(TypedDict):
    """How an analyst logs in, keyed by their `AnalystPolicy` fields."""

    password: str | None
    md5_password: str | None


class _Budget(TypedDict):
    """What an analyst may spend, keyed by their `AnalystPolicy` fields."""

    epsilon: float
    delta: float
    max_epsilon_per_query: float | None
    refresh: Refresh


def read_server(node: Node | None, p: Problems) -> ServerPolicy:
    entries = read_section(node, "server", p, _SERVER_KEYS, example="{auth_methods: [scram-sha-256]}")
    base = ServerPolicy()
    if entries is not None and "audit_retention_days" in entries:
        base = ServerPolicy(audit_retention_days=_read_retention(entries["audit_retention_days"], p))
    if entries is not None and "ledger" in entries:
        ledger = read_text(
            entries["ledger"],
            "server.ledger",
            p,
            fix="write a SQLite file's path (relative to the policy file) or a postgresql:// URL",
        )
        if ledger is not None and not ledger.strip():
            p.add(entries["ledger"].line, "server.ledger", "is empty", "write a path or a postgresql:// URL")
        elif ledger is not None:
            base = dataclasses.replace(base, ledger=ledger.strip())
    if entries is None or "auth_methods" not in entries:
        return base
    child = entries["auth_methods"]
    known = ", ".join(m.value for m in AuthMethod)
    if child.kind != "seq" or not child.value:
        p.add(
            child.line,
            "server.auth_methods",
            f"expected a non-empty list, found {child.describe()}",
            f"write a list of methods among {known}, e.g. [scram-sha-256]",
        )
        return base
    methods: list[AuthMethod] = []
    for i, item in enumerate(child.value):
        path = f"server.auth_methods[{i}]"
        name = read_text(item, path, p, fix=f"write one of {known}")
        if name is None:
            continue
        try:
            method = AuthMethod(name.lower())
        except ValueError:
            p.add(item.line, path, f"unknown authentication method `{name}`", f"write one of {known}")
            continue
        if method in methods:
            p.add(item.line, path, f"`{name}` is listed twice", "list each method once")
            continue
        methods.append(method)
    return dataclasses.replace(base, auth_methods=tuple(methods)) if methods else base


def _read_retention(node: Node, p: Problems) -> int:
    """server.audit_retention_days: a whole number of days >= 0 (0 keeps records forever)."""
    path = "server.audit_retention_days"
    days = read_integer(node, path, p)
    if days is None:
        return ServerPolicy.audit_retention_days
    if days < 0:
        p.add(node.line, path, f"must be 0 or more, found {days}", "write a number of days, or 0 to keep all")
        return ServerPolicy.audit_retention_days
    return days


def read_analysts(node: Node | None, defaults: Defaults, p: Problems) -> tuple[AnalystPolicy, ...]:
    # A bare `analysts:` (null) reads as "no analysts yet", like an empty mapping.
    if node is None or (node.kind == "scalar" and node.value is None):
        return ()
    entries = read_mapping(
        node, "analysts", p, example="{alice: {password: ..., epsilon: 10, delta: 1.0e-5}}"
    )
    if entries is None:
        return ()
    check_names(node, "analysts", p, kind="analyst")
    analysts = []
    for name, child in entries.items():
        analyst = _read_analyst(name, child, defaults, p)
        if analyst is not None:
            analysts.append(analyst)
    return tuple(analysts)


def _read_analyst(name: str, node: Node, defaults: Defaults, p: Problems) -> AnalystPolicy | None:
    path = f"analysts.{name}"
    entries = read_mapping(node, path, p, example="{password: ..., epsilon: 10, delta: 1.0e-5}")
    if entries is None:
        return None
    check_keys(node, path, p, _ANALYST_KEYS)
    credentials = _read_credentials(entries, path, name, p)
    budget = _read_analyst_budget(node, entries, path, defaults, p)
    if budget is None:
        return None
    return AnalystPolicy(name=name, **credentials, **budget)


def _read_credentials(entries: dict[str, Node], path: str, name: str, p: Problems) -> _Credentials:
    """`password` (a SCRAM-SHA-256 verifier) and `md5_password` (PostgreSQL's md5 hash), each None when
    absent or malformed; a problem never echoes the value."""
    password = None
    if "password" in entries and not (
        entries["password"].kind == "scalar" and entries["password"].value is None
    ):
        child = entries["password"]
        # Never echo the value: it may be a plaintext password.
        if child.kind == "scalar" and isinstance(child.value, str) and scram.is_verifier(child.value):
            password = child.value.strip()
        elif child.kind == "scalar" and isinstance(child.value, str) and child.value.startswith("md5"):
            p.add(
                child.line,
                f"{path}.password",
                "an md5 hash is not accepted (only SCRAM-SHA-256)",
                _PASSWD_FIX,
            )
        elif (
            child.kind == "scalar"
            and isinstance(child.value, str)
            and child.value.startswith("SCRAM-SHA-256$")
        ):
            p.add(child.line, f"{path}.password", "a malformed SCRAM-SHA-256 verifier", _PASSWD_FIX)
        else:
            p.add(
                child.line,
                f"{path}.password",
                "not a SCRAM-SHA-256 verifier (plaintext passwords are never accepted)",
                _PASSWD_FIX,
            )
    md5_password = None
    if "md5_password" in entries and not (
        entries["md5_password"].kind == "scalar" and entries["md5_password"].value is None
    ):
        child = entries["md5_password"]
        # Never echo the value: it is as good as the password for the md5 method.
        text = child.value.strip() if child.kind == "scalar" and isinstance(child.value, str) else None
        if text is not None and _MD5_HASH.fullmatch(text):
            md5_password = text
        else:
            p.add(
                child.line,
                f"{path}.md5_password",
                'not an md5 hash in PostgreSQL\'s form "md5" followed by 32 lowercase hex digits',
                f"run `dpproxy policy passwd --md5-user {name}` and paste its output",
            )
    return {"password": password, "md5_password": md5_password}


def _read_analyst_budget(
    node: Node, entries: dict[str, Node], path: str, defaults: Defaults, p: Problems
) -> _Budget | None:
    """The analyst's total epsilon and delta (None without both), the per-query cap within the total
    and above defaults.min_epsilon, and when the budget is spent afresh (`refresh`)."""
    epsilon = delta = max_per_query = None
    for key in ("epsilon", "delta"):
        if key not in entries:
            p.add(
                node.owner_line,
                join_path(path, key),
                "missing",
                f"add `{key}:` (the analyst's total {key} budget)",
            )
    if "epsilon" in entries:
        epsilon = read_float(entries["epsilon"], f"{path}.epsilon", p)
        if epsilon is not None and epsilon <= 0:
            p.add(
                entries["epsilon"].line,
                f"{path}.epsilon",
                "must be greater than 0",
                "write the total budget, e.g. 10",
            )
            epsilon = None
    if "delta" in entries:
        delta = read_float(entries["delta"], f"{path}.delta", p)
        if delta is not None and not 0 <= delta < 1:
            p.add(
                entries["delta"].line,
                f"{path}.delta",
                "must be at least 0 and below 1",
                "write a small number such as 1.0e-5",
            )
            delta = None
        elif delta == 0 and defaults.accounting == "zcdp":
            p.add(
                entries["delta"].line,
                f"{path}.delta",
                "must be greater than 0 under `accounting: zcdp`: the ledger converts the analyst's ρ "
                "to ε at the δ budget, and no ε is reached at δ = 0",
                "give the analyst a small δ budget such as 1.0e-5",
            )
            delta = None
    if "max_epsilon_per_query" in entries:
        child = entries["max_epsilon_per_query"]
        key_path = f"{path}.max_epsilon_per_query"
        max_per_query = read_float(child, key_path, p)
        if max_per_query is not None:
            if max_per_query <= 0:
                p.add(child.line, key_path, "must be greater than 0", "write a positive number such as 1.0")
            elif epsilon is not None and max_per_query > epsilon:
                p.add(
                    child.line,
                    key_path,
                    f"is greater than the analyst's total epsilon ({epsilon:g})",
                    "lower it, or raise the analyst's epsilon",
                )
            elif max_per_query < defaults.min_epsilon:
                p.add(
                    child.line,
                    key_path,
                    f"is below defaults.min_epsilon ({defaults.min_epsilon:g}), so no query could run",
                    "raise it, or lower defaults.min_epsilon",
                )
    refresh = _read_refresh(entries.get("refresh"), f"{path}.refresh", p)
    if epsilon is None or delta is None:
        return None
    return {"epsilon": epsilon, "delta": delta, "max_epsilon_per_query": max_per_query, "refresh": refresh}


def read_budget(node: Node | None, defaults: Defaults, p: Problems) -> DataSetBudget | None:
    """The top-level `budget:` (the data set's, shared by every analyst), None when absent."""
    entries = read_section(node, "budget", p, _BUDGET_KEYS, example="{epsilon: 20.0, delta: 1.0e-5}")
    if entries is None or node is None:
        return None
    values: dict[str, float] = {}
    for key in ("epsilon", "delta"):
        if key not in entries:
            p.add(
                node.line, f"budget.{key}", "missing", f"add `{key}:` (what all analysts together may spend)"
            )
            continue
        value = read_float(entries[key], f"budget.{key}", p)
        if value is None:
            continue
        if key == "epsilon" and value <= 0:
            p.add(entries[key].line, "budget.epsilon", "must be greater than 0", "write the total, e.g. 20")
        elif key == "delta" and not 0 <= value < 1:
            p.add(entries[key].line, "budget.delta", "must be at least 0 and below 1", "write e.g. 1.0e-5")
        elif key == "delta" and value == 0 and defaults.accounting == "zcdp":
            p.add(
                entries[key].line,
                "budget.delta",
                "must be greater than 0 under `accounting: zcdp`: ρ is converted to ε at this δ",
                "give the data set a small δ budget such as 1.0e-5",
            )
        else:
            values[key] = value
    refresh = _read_refresh(entries.get("refresh"), "budget.refresh", p)
    if len(values) < 2:
        return None
    return DataSetBudget(values["epsilon"], values["delta"], refresh)


def _read_refresh(node: Node | None, path: str, p: Problems) -> Refresh:
    """`refresh:` of a budget: never (the default), daily, weekly or monthly (UTC windows)."""
    if node is None:
        return Refresh.NEVER
    fix = f"write one of {', '.join(REFRESHES)}"
    text = read_choice(node, path, p, REFRESHES, what="a refresh", fix=fix)
    return Refresh.NEVER if text is None else Refresh(text)


def report_unused_md5_passwords(node: Node | None, server: ServerPolicy, p: Problems) -> None:
    """An md5_password is a problem when server.auth_methods does not list md5: it would never be used."""
    if AuthMethod.MD5 in server.auth_methods or node is None or node.kind != "map":
        return
    for name, child in node.value.items():
        if child.kind == "map" and "md5_password" in child.value:
            p.add(
                child.value["md5_password"].key_line,
                f"analysts.{name}.md5_password",
                "is set but server.auth_methods does not list md5, so it would never be used",
                "add md5 to server.auth_methods, or remove md5_password",
            )
