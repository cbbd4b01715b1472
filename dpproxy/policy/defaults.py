"""The `defaults:` section of a policy file: per-query ε and δ, mechanism, accounting and replay.

This module owns reading that section into `Defaults` and the checks that tie its keys together
(min_epsilon <= epsilon <= max_epsilon, a δ for Gaussian noise and for zCDP accounting, zCDP implying
Gaussian noise). Each problem names its own line and key.

It must never see analysts, tables or credentials: budgets per analyst are checked by
`dpproxy.policy.analysts`, which reads the defaults this module returns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dpproxy.policy.marked_yaml import DECIMAL_TEXT, INTEGER_TEXT, Node
from dpproxy.policy.model import ACCOUNTING, Defaults, Mechanism
from dpproxy.policy.problems import Problems
from dpproxy.policy.readers import read_boolean, read_float, read_section, read_text

_DEFAULTS_KEYS = (
    "epsilon",
    "delta",
    "mechanism",
    "min_epsilon",
    "max_epsilon",
    "accounting",
    "replay",
    "data_epoch",
)


def read_defaults(node: Node | None, p: Problems) -> Defaults:
    base = Defaults()
    example = "{epsilon: 0.5, delta: 1.0e-7, mechanism: laplace}"
    entries = read_section(node, "defaults", p, _DEFAULTS_KEYS, example=example)
    if entries is None:
        return base
    values: dict[str, Any] = {}
    for key in ("epsilon", "delta", "min_epsilon", "max_epsilon"):
        if key in entries:
            values[key] = read_float(entries[key], f"defaults.{key}", p)
    if "mechanism" in entries:
        child = entries["mechanism"]
        name = read_text(child, "defaults.mechanism", p, fix="write laplace or gaussian")
        if name is not None:
            try:
                values["mechanism"] = Mechanism(name.lower())
            except ValueError:
                p.add(
                    child.line,
                    "defaults.mechanism",
                    f"unknown mechanism `{name}`",
                    "write laplace or gaussian",
                )
    if "accounting" in entries:
        child = entries["accounting"]
        name = read_text(child, "defaults.accounting", p, fix="write pure or zcdp")
        if name is not None and name.lower() in ACCOUNTING:
            values["accounting"] = name.lower()
        elif name is not None:
            p.add(child.line, "defaults.accounting", f"unknown accounting `{name}`", "write pure or zcdp")
    if "replay" in entries:
        values["replay"] = read_boolean(entries["replay"], "defaults.replay", p)
    if "data_epoch" in entries:
        values["data_epoch"] = _read_data_epoch(entries["data_epoch"], "defaults.data_epoch", p)
    ok = {key: value for key, value in values.items() if value is not None}
    if ok.get("accounting") == "zcdp":
        # zCDP composes Gaussian noise: it is the mechanism unless the policy says otherwise.
        if "mechanism" not in entries:
            ok["mechanism"] = Mechanism.GAUSSIAN
        elif ok.get("mechanism") is Mechanism.LAPLACE:
            p.add(
                entries["mechanism"].line,
                "defaults.mechanism",
                "laplace noise cannot be charged in ρ under `accounting: zcdp`",
                "write `mechanism: gaussian` (or leave mechanism out: zcdp implies gaussian), "
                "or use `accounting: pure` to keep laplace",
            )
            del ok["mechanism"]
    for key in ("epsilon", "min_epsilon", "max_epsilon"):
        if key in ok and ok[key] <= 0:
            p.add(
                entries[key].line,
                f"defaults.{key}",
                "must be greater than 0",
                "write a positive number such as 0.5",
            )
            del ok[key]
    if "delta" in ok and not 0 <= ok["delta"] < 1:
        p.add(
            entries["delta"].line,
            "defaults.delta",
            "must be at least 0 and below 1",
            "write a small number such as 1.0e-7",
        )
        del ok["delta"]
    merged = dataclasses.replace(base, **ok)
    if merged.accounting == "zcdp" and merged.delta <= 0:
        key = "delta" if "delta" in ok else "accounting"
        p.add(
            entries[key].line,
            f"defaults.{key}",
            "`accounting: zcdp` needs a delta greater than 0 (Gaussian noise and the conversion of ρ to ε "
            "need one)",
            "set defaults.delta to a small positive number such as 1.0e-7, or use `accounting: pure`",
        )
    elif merged.mechanism is Mechanism.GAUSSIAN and merged.delta <= 0:
        key = "delta" if "delta" in ok else "mechanism"
        p.add(
            entries[key].line,
            f"defaults.{key}",
            "the gaussian mechanism needs a delta greater than 0",
            "set defaults.delta to a small positive number such as 1.0e-7, or use laplace",
        )
    given = [key for key in ("epsilon", "min_epsilon", "max_epsilon") if key in ok]
    if given and not merged.min_epsilon <= merged.epsilon <= merged.max_epsilon:
        # Report on a key the data owner wrote (the built-in defaults are consistent on their own).
        key = "epsilon" if "epsilon" in ok else given[0]
        p.add(
            entries[key].line,
            f"defaults.{key}",
            f"min_epsilon <= epsilon <= max_epsilon does not hold ({merged.min_epsilon:g} <= "
            f"{merged.epsilon:g} <= {merged.max_epsilon:g})",
            "change the values so that min_epsilon <= epsilon <= max_epsilon",
        )
    return merged


MAX_DATA_EPOCH_LENGTH = 100


def _read_data_epoch(node: Node, path: str, p: Problems) -> int | str | None:
    """A whole number, or text (an unquoted date is taken as written). Booleans and fractions are
    refused: `true` or `1.5` read as one thing and may be meant as another (`yes`, `1.50`)."""
    fix = 'write a whole number such as 1, or text such as "2024-06-01"'
    if node.kind == "scalar" and node.plain and INTEGER_TEXT.fullmatch(node.text):
        if len(node.text) > MAX_DATA_EPOCH_LENGTH:
            p.add(node.line, path, f"must be a whole number of at most {MAX_DATA_EPOCH_LENGTH} digits", fix)
            return None
        return int(node.text)
    numeric = node.plain and DECIMAL_TEXT.fullmatch(node.text) is not None
    if node.kind != "scalar" or node.value is None or isinstance(node.value, bool | float) or numeric:
        p.add(node.line, path, f"expected a whole number or text, found {node.describe()}", fix)
        return None
    if not node.text.strip() or len(node.text) > MAX_DATA_EPOCH_LENGTH:
        p.add(node.line, path, f"must be text of 1 to {MAX_DATA_EPOCH_LENGTH} characters", fix)
        return None
    return node.text
