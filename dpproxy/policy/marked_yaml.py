"""Policy YAML read into a tree of nodes that remember their line.

This module owns reading YAML text safely and the tree it gives (`Node`): every node knows the line
it starts on (and, under a mapping, the line of its key), scalars keep the text as written so that
numbers and names can be read the way a person reads them, duplicate keys are reported instead of
YAML's silent "last one wins", merge keys (`<<: *anchor`) work as in YAML 1.1, and nested aliases
cannot blow up (`TooManyNodes`).

It must never see what the keys mean: which keys a policy allows and what their values must be is
checked by the section readers above it. A node describes its value by kind only, never by content,
since a misplaced password must never be echoed.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import dataclass
from typing import Any

import yaml

from dpproxy.policy.problems import Problems, join_path

_MERGE_TAG = "tag:yaml.org,2002:merge"

# A plain scalar written as a decimal number or as a whole number.
DECIMAL_TEXT = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
INTEGER_TEXT = re.compile(r"[-+]?\d+")


@dataclass(frozen=True)
class Node:
    """A YAML node with the line it starts on; scalars keep their source text."""

    kind: str  # "scalar", "seq" or "map"
    line: int
    value: Any = None  # scalar: the YAML value; seq: tuple[Node, ...]; map: dict[str, Node]
    text: str = ""  # scalar: the text as written (quotes removed)
    plain: bool = False  # scalar written without quotes
    key_line: int = 0  # for a mapping's value: the line of its key

    @property
    def owner_line(self) -> int:
        """The line to report a problem about this node as a whole (e.g. a missing key) on."""
        return self.key_line or self.line

    def describe(self) -> str:
        # Names the kind of value, never the value: a misplaced password must not be echoed.
        if self.kind == "map":
            return "a mapping"
        if self.kind == "seq":
            return "a list"
        if self.value is None:
            return "nothing (null)"
        if isinstance(self.value, bool):
            return "true/false"
        if isinstance(self.value, int | float) or (self.plain and DECIMAL_TEXT.fullmatch(self.text)):
            return "a number"
        if isinstance(self.value, datetime.date):
            return "a date"
        return "text" if self.plain else "a quoted string"


class TooManyNodes(yaml.YAMLError):
    """Aliases expand to more than MarkedLoader.MAX_NODES nodes; `line` is where the limit was hit."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class MarkedLoader(yaml.SafeLoader):
    """A SafeLoader that keeps line marks and reports duplicate keys instead of keeping the last one.

    Mapping keys are taken as written (``no:`` is the name "no", not False), and merge keys
    (``<<: *anchor``) work as in YAML 1.1: the mapping's own keys win over merged ones.
    """

    # Aliases are expanded into a tree; this caps the "billion laughs" blow-up of nested aliases.
    MAX_NODES = 200_000

    def __init__(self, text: str, problems: Problems) -> None:
        super().__init__(text)
        self.problems = problems
        self.built = 0

    def marked_tree(self) -> Node | None:
        root = self.get_single_node()
        return None if root is None else self._build(root, "", set())

    def _build(self, node: yaml.Node, path: str, active: set[int]) -> Node:
        line = node.start_mark.line + 1
        self.built += 1
        if self.built > self.MAX_NODES:
            raise TooManyNodes(line)
        if id(node) in active:
            self.problems.add(line, path, "an alias refers to itself", "remove the recursive alias")
            return Node("scalar", line, None, "")
        if isinstance(node, yaml.ScalarNode):
            try:
                value = self.construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError, OverflowError):
                # E.g. a date-like scalar that is not a real date: keep it as text.
                value = node.value
            plain = node.style is None
            return Node("scalar", line, value, node.value, plain)
        active = active | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            items = tuple(self._build(item, f"{path}[{i}]", active) for i, item in enumerate(node.value))
            return Node("seq", line, items)
        entries: dict[str, Node] = {}
        for key, child in self._merged_entries(node, path, active):
            entries[key] = child
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key_line = key_node.start_mark.line + 1
            child_path = join_path(path, _key_text(key_node))
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.add(key_line, path, "a key is not a plain name", "write keys as plain words")
                continue
            key = key_node.value
            if key in seen:
                self.problems.add(
                    key_line,
                    child_path,
                    f"duplicate key (first given on line {seen[key]})",
                    "keep only one: YAML would silently use the last one",
                )
                continue
            seen[key] = key_line
            child = self._build(value_node, child_path, active)
            entries[key] = dataclasses.replace(child, key_line=key_line)
        return Node("map", line, entries)

    def _merged_entries(self, node: yaml.MappingNode, path: str, active: set[int]) -> list[tuple[str, Node]]:
        merged: list[tuple[str, Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            # Earlier sources win over later ones, so apply them last.
            for source in reversed(sources):
                built = self._build(source, path, active)
                if built.kind != "map":
                    self.problems.add(
                        built.line,
                        path,
                        "`<<` must merge a mapping",
                        "merge an anchored mapping: `<<: *name`",
                    )
                    continue
                merged.extend(built.value.items())
        return merged


def _key_text(node: yaml.Node) -> str:
    return node.value if isinstance(node, yaml.ScalarNode) else "?"
