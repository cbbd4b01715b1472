"""Policy text for the loader's tests, and the problems the loader reports about it.

Every rejection must name the file, the line, the key path and a fix: `assert_problem` and
`only_problem` check all four.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dpproxy.errors import PolicyError
from dpproxy.policy import Policy, parse_policy

POLICIES = Path(__file__).resolve().parent.parent.parent / "policies"
SOURCE = "owner.yaml"


def yaml_text(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def load(text: str) -> Policy:
    return parse_policy(yaml_text(text), SOURCE)


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml_text(text), SOURCE)
    assert info.value.problems, "a PolicyError must carry its problems"
    return info.value.problems


def assert_problem(found: list[str], line: int, path: str, *fragments: str) -> str:
    """One problem is on `line` of the file, about `path`, and contains every fragment."""
    prefix = f"{SOURCE}:{line}: {path}: "
    matching = [p for p in found if p.startswith(prefix) and all(f in p for f in fragments)]
    assert matching, f"no problem {prefix}... with {fragments!r} in:\n" + "\n".join(found)
    return matching[0]


def only_problem(text: str, line: int, path: str, *fragments: str) -> str:
    found = problems(text)
    assert len(found) == 1, "\n".join(found)
    return assert_problem(found, line, path, *fragments)


# A protected table the tests vary one key at a time; line numbers below count from `version`.
TABLE = """
    version: 1
    tables:
      t:
        privacy_unit: pid
        columns:
          pid: {type: integer}
          x: {type: integer, lower: 0, upper: 10}
"""
