"""Reading one value of a policy file: a number, a whole number, true/false, text, a mapping.

This module owns the typed readers the section readers build on, and the checks every mapping of a
policy gets: unknown keys (reported with the closest known one) and names (lowercase SQL
identifiers, distinct even to a case-insensitive SQL reader). Each reader reports its own problem
and returns None when the value is unusable, so that a file's problems are all found in one pass.

It must never see what a value is for (budgets, bounds, credentials): the callers check that. A
reader's problem describes the kind of value found, never the value itself.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal

from dpproxy.policy.marked_yaml import DECIMAL_TEXT, INTEGER_TEXT, Node
from dpproxy.policy.model import MAX_NAME_LENGTH, is_valid_name
from dpproxy.policy.problems import Problems, join_path


def read_decimal(node: Node, path: str, p: Problems) -> Decimal | None:
    # Numbers are read from the text as written, so 0.1 stays exactly 0.1 and 1e-5 (a string to
    # YAML 1.1) and 010 (octal to YAML 1.1) mean what a person reading them means.
    if node.kind == "scalar" and node.plain and DECIMAL_TEXT.fullmatch(node.text):
        value = Decimal(node.text)
        if value and not -1000 <= value.adjusted() <= 1000:  # arithmetic on it would overflow
            p.add(node.line, path, "is far too large or too small", "write a number such as 0.5")
            return None
        return value
    if node.kind == "scalar" and isinstance(node.value, float):
        p.add(node.line, path, "must be a finite number", "write a number such as 0.5")
    else:
        p.add(
            node.line,
            path,
            f"expected a number, found {node.describe()}",
            "write a number such as 0.5, without quotes",
        )
    return None


def read_integer(node: Node, path: str, p: Problems) -> int | None:
    if node.kind == "scalar" and node.plain and INTEGER_TEXT.fullmatch(node.text):
        if len(node.text) > 100:  # beyond any setting (and Python's limit on converting digits)
            p.add(node.line, path, "is far too large", "write a whole number such as 1")
            return None
        return int(node.text)
    if node.kind == "scalar" and node.plain and DECIMAL_TEXT.fullmatch(node.text):
        p.add(
            node.line, path, "must be a whole number", "write an integer such as 1, without a decimal point"
        )
    else:
        p.add(
            node.line, path, f"expected a whole number, found {node.describe()}", "write an integer such as 1"
        )
    return None


def read_float(node: Node, path: str, p: Problems) -> float | None:
    value = read_decimal(node, path, p)
    if value is None:
        return None
    if not math.isfinite(float(value)):
        # 1e400 is a fine Decimal but an infinite float: an infinite budget.
        p.add(node.line, path, "is too large to be a finite number", "write a smaller number")
        return None
    return float(value)


def read_boolean(node: Node, path: str, p: Problems) -> bool | None:
    if node.kind == "scalar" and node.plain and isinstance(node.value, bool):
        return node.value
    p.add(
        node.line,
        path,
        f"expected true or false, found {node.describe()}",
        "write true or false, without quotes",
    )
    return None


def read_text(node: Node, path: str, p: Problems, *, fix: str) -> str | None:
    if node.kind == "scalar" and node.value is not None and (isinstance(node.value, str) or node.plain):
        return node.text
    p.add(node.line, path, f"expected text, found {node.describe()}", fix)
    return None


def read_choice(
    node: Node, path: str, p: Problems, choices: Sequence[str], *, what: str, fix: str
) -> str | None:
    """One of `choices`, written as text; else None, the problem reported (`what`: how the message
    names a value that is not one, e.g. "a row bounding"; `fix`: what to write instead)."""
    text = read_text(node, path, p, fix=fix)
    if text is not None and text not in choices:
        p.add(node.line, path, f"`{text}` is not {what}", fix)
        return None
    return text


def read_mapping(node: Node, path: str, p: Problems, *, example: str) -> dict[str, Node] | None:
    if node.kind == "map":
        return node.value
    p.add(node.line, path, f"expected a mapping, found {node.describe()}", f"write it as {example}")
    return None


def read_section(
    node: Node | None, path: str, p: Problems, allowed: Sequence[str], *, example: str
) -> dict[str, Node] | None:
    """The entries of an optional top-level section with known keys; None when it is absent, null
    (a bare `defaults:`) or not a mapping (reported)."""
    if node is None or (node.kind == "scalar" and node.value is None):
        return None
    entries = read_mapping(node, path, p, example=example)
    if entries is not None:
        check_keys(node, path, p, allowed)
    return entries


def check_keys(
    node: Node, path: str, p: Problems, allowed: Sequence[str], *, refused: Mapping[str, str] | None = None
) -> None:
    """Report unknown keys (with the closest known one) and keys `refused` in this place (with why)."""
    refused = refused or {}
    for key, child in node.value.items():
        if key in allowed:
            continue
        if key in refused:
            p.add(
                child.key_line, join_path(path, key), f"not allowed here: {refused[key]}", f"remove `{key}`"
            )
            continue
        close = difflib.get_close_matches(key, [*allowed, *refused], n=1, cutoff=0.6)
        fix = f"did you mean `{close[0]}`?" if close else "allowed keys here: " + ", ".join(allowed)
        p.add(child.key_line, join_path(path, key), "unknown key", fix)


def check_names(node: Node, path: str, p: Problems, *, kind: str) -> None:
    """Names must be lowercase SQL identifiers, distinct even to a case-insensitive SQL reader."""
    first: dict[str, tuple[str, int]] = {}
    for key, child in node.value.items():
        if not is_valid_name(key):
            p.add(
                child.key_line,
                join_path(path, key),
                f"`{key}` is not a valid {kind} name",
                f"use lowercase letters, digits and _, not starting with a digit, at most {MAX_NAME_LENGTH} "
                "characters, as the name appears to SQL",
            )
        folded = key.casefold()
        if folded in first:
            other, other_line = first[folded]
            p.add(
                child.key_line,
                join_path(path, key),
                f"same {kind} name as `{other}` (line {other_line}) once case is ignored, as SQL does",
                f"rename or remove one of the two {kind}s",
            )
        else:
            first[folded] = (key, child.key_line)
