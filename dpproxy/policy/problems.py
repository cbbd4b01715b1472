"""The problems found in a policy file, in the one form a data owner sees them.

This module owns the problem message, "<file>:<line>: <key path>: <what is wrong>; <how to fix it>",
key paths such as `tables.visits.columns.cost.upper`, and turning the problems of a file into one
`PolicyError` that lists them all in file order.

It must never see what a value means: callers decide what is wrong and how to fix it. Messages are
built only from the texts callers pass, so a password field's value never reaches one unless a caller
puts it there (none does).
"""

from __future__ import annotations

from typing import NoReturn

from dpproxy.errors import PolicyError


def join_path(path: str, key: str) -> str:
    """The key path of `key` under `path` ("" is the top level)."""
    return f"{path}.{key}" if path else key


class Problems:
    """Problems found so far, each "<file>:<line>: <key path>: <what is wrong>; <how to fix it>"."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._found: list[tuple[int, str]] = []

    def add(self, line: int, path: str, what: str, fix: str) -> None:
        self._found.append((line, f"{self.source}:{line}: {path or '(top level)'}: {what}; {fix}"))

    def __bool__(self) -> bool:
        return bool(self._found)

    def raise_if_any(self) -> None:
        if self._found:
            self.fail()

    def fail(self) -> NoReturn:
        # Stable sort: problems read in file order, several on one line in the order found.
        problems = [text for _, text in sorted(self._found, key=lambda found: found[0])]
        raise PolicyError(problems, source=self.source)
