"""Loading a policy: from a file or text to a validated `Policy`, or every problem of the file at once.

This module owns the entry points (`load_policy`, `parse_policy`) and the top level of a policy
file: its keys, `version`, and the order its sections are read in (defaults first, since analysts'
budgets are checked against them). Each problem reads "<file>:<line>: <key path>: <what is wrong>;
<how to fix it>"; a `Policy` is returned only when there is none, so it holds validated values only.
The key reference is the README (Policy reference).

It must never touch data or a backend: checking a policy against a live schema is
`dpproxy.policy.live_schema`'s job, on columns the caller got from the backend.
"""

from __future__ import annotations

import os

import yaml

from dpproxy.errors import PolicyError
from dpproxy.policy.analysts import read_analysts, read_budget, read_server, report_unused_md5_passwords
from dpproxy.policy.console import read_console
from dpproxy.policy.defaults import read_defaults
from dpproxy.policy.marked_yaml import MarkedLoader, Node, TooManyNodes
from dpproxy.policy.model import Policy, TablePolicy
from dpproxy.policy.problems import Problems
from dpproxy.policy.readers import check_keys, read_integer
from dpproxy.policy.tables import read_tables

_TOP_KEYS = ("version", "defaults", "budget", "analysts", "tables", "server", "console")


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and validate the policy file at `path`; raise PolicyError listing every problem in it."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise PolicyError(
            [f"{source}: cannot read the policy file ({exc.strerror}); check the path and its permissions"],
            source=source,
        ) from None
    except UnicodeDecodeError:
        raise PolicyError(
            [f"{source}: the policy file is not UTF-8 text; save it as UTF-8"], source=source
        ) from None
    return parse_policy(text, source)


def _unquoted(error: yaml.YAMLError) -> str:
    """Why the YAML reader refused a text, without quoting the text (it may hold a password)."""
    character, position = getattr(error, "character", None), getattr(error, "position", None)
    if isinstance(character, int) and isinstance(position, int):
        return f"the character U+{character:04X} at offset {position} is not allowed"
    return type(error).__name__


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML `text`; raise PolicyError listing every problem, each naming `source`:line."""
    p = Problems(source)
    loader: MarkedLoader | None = None
    try:
        loader = MarkedLoader(text, p)
        root = loader.marked_tree()
    except TooManyNodes as exc:
        p.add(
            exc.line,
            "(yaml)",
            f"more than {MarkedLoader.MAX_NODES} values once aliases are expanded",
            "write the policy without nested aliases",
        )
        p.fail()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        p.add(line, "(yaml)", f"not valid YAML: {what}", "fix the YAML syntax (indent with spaces, not tabs)")
        p.fail()
    except yaml.YAMLError as exc:  # the reader refuses the text itself: a NUL byte, a control character
        p.add(1, "(yaml)", f"not valid YAML: {_unquoted(exc)}", "save the policy as plain UTF-8 text")
        p.fail()
    finally:
        if loader is not None:
            loader.dispose()

    if root is None or root.kind != "map":
        found = "an empty file" if root is None else root.describe()
        p.add(
            1 if root is None else root.line,
            "(top level)",
            f"expected a mapping with `version` and `tables`, found {found}",
            "start from `dpproxy policy init` or the example in the README (Policy reference)",
        )
        p.fail()
    top: dict[str, Node] = root.value
    check_keys(root, "", p, _TOP_KEYS)

    if "version" not in top:
        p.add(1, "version", "missing", "add `version: 1` at the top")
    else:
        node = top["version"]
        version = read_integer(node, "version", p)
        if version is not None and version != 1:
            p.add(node.line, "version", f"unsupported version {version}", "write `version: 1`")

    defaults = read_defaults(top.get("defaults"), p)
    server = read_server(top.get("server"), p)
    analysts = read_analysts(top.get("analysts"), defaults, p)
    budget = read_budget(top.get("budget"), defaults, p)
    report_unused_md5_passwords(top.get("analysts"), server, p)
    console = read_console(top.get("console"), p)
    if "tables" not in top:
        p.add(1, "tables", "missing", "add `tables:` listing the tables analysts may query")
        tables: tuple[TablePolicy, ...] = ()
    else:
        tables = read_tables(top["tables"], p)

    p.raise_if_any()
    return Policy(
        defaults=defaults,
        analysts=analysts,
        tables=tables,
        version=1,
        source=source,
        server=server,
        console=console,
        budget=budget,
    )
