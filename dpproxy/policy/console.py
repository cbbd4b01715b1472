"""The `console:` section of a policy file: which data owners may log in to the web console.

This module owns reading `console.owners` (each owner's SCRAM-SHA-256 verifier, the format analysts'
passwords take, made by `dpproxy policy passwd`) and `console.session_minutes` into `ConsolePolicy`.
Without the section the console cannot be served (docs: README, Operating dpproxy, Console).

It must never echo a password field: it may hold a plaintext password pasted by mistake. Problems
name the field and how to make a proper value, never its content.
"""

from __future__ import annotations

from dpproxy import scram
from dpproxy.policy.marked_yaml import Node
from dpproxy.policy.model import ConsoleOwner, ConsolePolicy
from dpproxy.policy.problems import Problems, join_path
from dpproxy.policy.readers import check_keys, check_names, read_integer, read_mapping, read_section

_CONSOLE_KEYS = ("owners", "session_minutes")
_OWNER_KEYS = ("password",)
_PASSWD_FIX = "run `dpproxy policy passwd` and paste its output"
MAX_SESSION_MINUTES = 7 * 24 * 60  # a login lasts at most a week


def read_console(node: Node | None, p: Problems) -> ConsolePolicy | None:
    """The console section; None when the policy has none (a bare `console:` is one without owners)."""
    if node is None:
        return None
    example = '{owners: {carol: {password: "SCRAM-SHA-256$…"}}}'
    entries = read_section(node, "console", p, _CONSOLE_KEYS, example=example)
    if entries is None:
        if node.kind == "scalar" and node.value is None:
            p.add(node.line, "console", "has no owners", f"list the owners who may log in, e.g. {example}")
        return None
    minutes = ConsolePolicy.session_minutes
    if "session_minutes" in entries:
        child = entries["session_minutes"]
        value = read_integer(child, "console.session_minutes", p)
        if value is not None and not 1 <= value <= MAX_SESSION_MINUTES:
            p.add(
                child.line,
                "console.session_minutes",
                f"must be between 1 and {MAX_SESSION_MINUTES} (a week)",
                "write how many minutes a login lasts, e.g. 60",
            )
        elif value is not None:
            minutes = value
    owners = _read_owners(entries.get("owners"), node, p, example)
    return ConsolePolicy(owners, minutes)


def _read_owners(node: Node | None, section: Node, p: Problems, example: str) -> tuple[ConsoleOwner, ...]:
    if (
        node is None
        or (node.kind == "scalar" and node.value is None)
        or (node.kind == "map" and not node.value)
    ):
        line = section.owner_line if node is None else node.line
        p.add(line, "console.owners", "no owner is listed", f"list the owners who may log in, e.g. {example}")
        return ()
    entries = read_mapping(node, "console.owners", p, example='{carol: {password: "SCRAM-SHA-256$…"}}')
    if entries is None:
        return ()
    check_names(node, "console.owners", p, kind="owner")
    owners = []
    for name, child in entries.items():
        path = f"console.owners.{name}"
        fields = read_mapping(child, path, p, example='{password: "SCRAM-SHA-256$…"}')
        if fields is None:
            continue
        check_keys(child, path, p, _OWNER_KEYS)
        password = fields.get("password")
        if password is None:
            p.add(child.owner_line, join_path(path, "password"), "missing", f"add `password:`; {_PASSWD_FIX}")
            continue
        verifier = _read_verifier(password, join_path(path, "password"), p)
        if verifier is not None:
            owners.append(ConsoleOwner(name, verifier))
    return tuple(owners)


def _read_verifier(node: Node, path: str, p: Problems) -> str | None:
    # Never echo the value: it may be a plaintext password. (The same rules as analysts' passwords.)
    text = node.value if node.kind == "scalar" and isinstance(node.value, str) else None
    if text is not None and scram.is_verifier(text):
        return text.strip()
    if text is not None and text.startswith("SCRAM-SHA-256$"):
        p.add(node.line, path, "a malformed SCRAM-SHA-256 verifier", _PASSWD_FIX)
    else:
        p.add(
            node.line,
            path,
            "not a SCRAM-SHA-256 verifier (plaintext passwords are never accepted)",
            _PASSWD_FIX,
        )
    return None
