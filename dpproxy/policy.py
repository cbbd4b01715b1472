"""The policy: which tables are exposed, who the privacy unit is, bounds, analysts and budgets.

This module owns the frozen, validated objects the rest of dpproxy reads, and the YAML loader that
builds them (`load_policy`, `parse_policy`). The loader reports every problem of a file at once,
each as "<file>:<line>: <key path>: <what is wrong>; <how to fix it>"; an object it returns holds
only validated values, so nothing downstream re-checks bounds, limits or budgets.

It never touches data and never imports a backend (dependencies point down): checking a policy
against a live schema or drafting one from it works on the column list the caller got from the
backend (`check_against_schema`, `draft_policy`). It never echoes a password field's value, which
may be a plaintext password pasted by mistake. The key reference is the README (Policy reference).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, NoReturn, Protocol

import yaml

from dpproxy import scram
from dpproxy.errors import PolicyError


class Mechanism(StrEnum):
    LAPLACE = "laplace"
    GAUSSIAN = "gaussian"


class AuthMethod(StrEnum):
    """How the wire server checks an analyst's password (`server.auth_methods`)."""

    SCRAM_SHA_256 = "scram-sha-256"  # against `password` (a SCRAM verifier); the password never travels
    PASSWORD = "password"  # cleartext over the connection, checked against `password`: use TLS
    MD5 = "md5"  # PostgreSQL's legacy challenge against `md5_password`


class ColumnType(StrEnum):
    """Column types, named as PostgreSQL names them."""

    SMALLINT = "smallint"
    INTEGER = "integer"
    BIGINT = "bigint"
    NUMERIC = "numeric"
    REAL = "real"
    DOUBLE = "double precision"
    TEXT = "text"
    VARCHAR = "varchar"
    BOOLEAN = "boolean"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"

    @property
    def is_integer(self) -> bool:
        return self in (ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.BIGINT)

    @property
    def is_fractional(self) -> bool:
        return self in (ColumnType.NUMERIC, ColumnType.REAL, ColumnType.DOUBLE)

    @property
    def is_number(self) -> bool:
        return self.is_integer or self.is_fractional

    @property
    def is_text(self) -> bool:
        return self in (ColumnType.TEXT, ColumnType.VARCHAR)

    @property
    def is_temporal(self) -> bool:
        return self in (ColumnType.DATE, ColumnType.TIMESTAMP, ColumnType.TIMESTAMPTZ)


# Digits after the decimal point kept on the fixed-point grid when summing a fractional column
# whose policy does not say otherwise (cents for money).
DEFAULT_GRID_SCALE = 2


@dataclass(frozen=True)
class ColumnPolicy:
    name: str
    type: ColumnType
    lower: Decimal | None = None
    upper: Decimal | None = None
    # Values of a key column that are public knowledge: all of them are released, zero-filled,
    # and no budget is spent selecting them. Values are Python values of the column's type.
    public_values: tuple[object, ...] | None = None
    # Decimal digits of the fixed-point grid that sums of this (fractional) column are computed on.
    scale: int | None = None
    # False when the policy says `summable: false`: SUM/AVG over the column are refused, though it
    # can still be filtered, grouped and counted. A loaded policy guarantees that every number column
    # of a protected table other than the privacy unit is either bounded or not summable; summing
    # also needs bounds, so an unbounded column (such as the unit) cannot be summed either way.
    summable: bool = True

    @property
    def bounded(self) -> bool:
        return self.lower is not None and self.upper is not None

    @property
    def grid_scale(self) -> int:
        if self.type.is_integer:
            return 0
        return self.scale if self.scale is not None else DEFAULT_GRID_SCALE


@dataclass(frozen=True)
class TablePolicy:
    name: str
    columns: tuple[ColumnPolicy, ...]
    public: bool = False
    # Column naming the person a row belongs to; None when every row is its own person (`row`).
    privacy_unit: str | None = None
    max_groups_per_unit: int = 1
    max_rows_per_unit: int = 1
    # Schema of the table in the backing database; None means the backend's default schema.
    schema: str | None = None
    # How max_rows_per_unit is enforced: "clamp" caps each unit's contribution to a group at what
    # that many rows can add; "sample" keeps that many of the unit's rows. Same sensitivity.
    row_bounding: str = "clamp"
    # COUNT(DISTINCT unit) … WHERE predicate is answered by randomized response (the survey
    # protocol: each person reports whether the predicate holds for them, truthfully with p = 3/4).
    randomized_response: bool = False
    _by_name: dict[str, ColumnPolicy] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.name: c for c in self.columns})

    def column(self, name: str) -> ColumnPolicy | None:
        return self._by_name.get(name)

    @property
    def unit_is_row(self) -> bool:
        return self.privacy_unit is None


@dataclass(frozen=True)
class AnalystPolicy:
    name: str
    # A SCRAM-SHA-256 verifier, never a plaintext password; kept out of repr (and so of logs), since
    # a verifier is enough for an offline guessing attack. None: usable only from the CLI/Python API.
    password: str | None = field(repr=False)
    epsilon: float  # total budget
    delta: float
    max_epsilon_per_query: float | None = None  # None: the policy default applies
    # PostgreSQL's md5 hash, "md5" + md5(password || user name) in hex, for the md5 method only.
    # As replayable as a password for that method: kept out of repr too.
    md5_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ServerPolicy:
    """Settings of the wire server that belong with the analysts: how they may authenticate."""

    # Tried in this order for each analyst: the first the analyst has a credential for is used.
    auth_methods: tuple[AuthMethod, ...] = (AuthMethod.SCRAM_SHA_256,)


# How a deployment composes its queries' costs (`defaults.accounting`). "pure": every query is
# charged (ε, δ) and both add up. "zcdp": Gaussian noise is charged in ρ (zero-concentrated DP), ρ
# adds up, and the ledger converts the total to (ε, δ) against each analyst's budget.
ACCOUNTING = ("pure", "zcdp")


@dataclass(frozen=True)
class Defaults:
    epsilon: float = 0.5  # per query, unless the call or session asks for another value
    delta: float = 1e-7  # per query
    mechanism: Mechanism = Mechanism.LAPLACE  # gaussian when accounting is zcdp and it is not given
    min_epsilon: float = 0.001  # limits on what a call or session may ask for
    max_epsilon: float = 1.0
    accounting: str = "pure"  # one of ACCOUNTING
    # A repeated query (same normalised statement, parameters, ε, policy and data epoch) gets its
    # stored answer back, free of charge.
    replay: bool = True
    # The operator's name for the current state of the data (a whole number or text such as a date).
    # Stored answers are replayed only within one epoch: bumping it after the data changed makes
    # repeats be answered afresh. Nothing read from the database takes its place, since whether a
    # repeat is free would then tell analysts when a table was written.
    data_epoch: int | str = 0


@dataclass(frozen=True)
class Policy:
    defaults: Defaults
    analysts: tuple[AnalystPolicy, ...]
    tables: tuple[TablePolicy, ...]
    version: int = 1
    source: str = "<policy>"
    server: ServerPolicy = field(default_factory=ServerPolicy)
    _tables: dict[str, TablePolicy] = field(default_factory=dict, init=False, repr=False, compare=False)
    _analysts: dict[str, AnalystPolicy] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tables", {t.name: t for t in self.tables})
        object.__setattr__(self, "_analysts", {a.name: a for a in self.analysts})

    def table(self, name: str) -> TablePolicy | None:
        return self._tables.get(name)

    def analyst(self, name: str) -> AnalystPolicy | None:
        return self._analysts.get(name)

    def epsilon_limits(self, analyst: AnalystPolicy | None) -> tuple[float, float]:
        """The range of per-query epsilon a call or session may choose."""
        high = self.defaults.max_epsilon
        if analyst is not None and analyst.max_epsilon_per_query is not None:
            high = analyst.max_epsilon_per_query
        return self.defaults.min_epsilon, high


# ---------------------------------------------------------------------------------------------
# Column type names
# ---------------------------------------------------------------------------------------------

# Names a policy may use for each type: PostgreSQL's own names and their common aliases. Plain
# `float` is left out on purpose: it is double precision in PostgreSQL but 4-byte in DuckDB.
_TYPE_NAMES: dict[str, ColumnType] = {
    "smallint": ColumnType.SMALLINT,
    "int2": ColumnType.SMALLINT,
    "integer": ColumnType.INTEGER,
    "int": ColumnType.INTEGER,
    "int4": ColumnType.INTEGER,
    "bigint": ColumnType.BIGINT,
    "int8": ColumnType.BIGINT,
    "numeric": ColumnType.NUMERIC,
    "decimal": ColumnType.NUMERIC,
    "real": ColumnType.REAL,
    "float4": ColumnType.REAL,
    "double precision": ColumnType.DOUBLE,
    "double": ColumnType.DOUBLE,
    "float8": ColumnType.DOUBLE,
    "text": ColumnType.TEXT,
    "string": ColumnType.TEXT,
    "varchar": ColumnType.VARCHAR,
    "character varying": ColumnType.VARCHAR,
    "boolean": ColumnType.BOOLEAN,
    "bool": ColumnType.BOOLEAN,
    "date": ColumnType.DATE,
    "timestamp": ColumnType.TIMESTAMP,
    "timestamp without time zone": ColumnType.TIMESTAMP,
    "timestamptz": ColumnType.TIMESTAMPTZ,
    "timestamp with time zone": ColumnType.TIMESTAMPTZ,
}
ACCEPTED_TYPE_NAMES: tuple[str, ...] = tuple(_TYPE_NAMES)

# Type modifiers are accepted so a type can be copied from DDL: numeric(12,2), varchar(40).
_TYPE_TEXT = re.compile(r"(?P<name>[a-z][a-z0-9 ]*?)\s*(?:\(\s*(?P<p>\d+)\s*(?:,\s*(?P<s>\d+)\s*)?\))?")
_TYPES_WITH_MODIFIERS = (ColumnType.NUMERIC, ColumnType.VARCHAR)

_INTEGER_RANGES: dict[ColumnType, tuple[int, int]] = {
    ColumnType.SMALLINT: (-(2**15), 2**15 - 1),
    ColumnType.INTEGER: (-(2**31), 2**31 - 1),
    ColumnType.BIGINT: (-(2**63), 2**63 - 1),
}

MAX_SCALE = 9
# A person contributing to more groups or rows than this is not a contribution *bound*; a larger
# value is almost certainly a slip of the data owner (and would drown every answer in noise).
MAX_CONTRIBUTIONS = 1000


def column_type_from_sql(sql_type: str) -> ColumnType | None:
    """The ColumnType a policy or database type name stands for, or None when dpproxy does not support it.

    Case and spacing are ignored, and a type modifier is allowed on numeric and varchar:
    ``column_type_from_sql("DECIMAL(12, 2)") is ColumnType.NUMERIC``.
    """
    parsed = _parse_type_text(sql_type)
    return parsed[0] if parsed is not None else None


def _parse_type_text(text: str) -> tuple[ColumnType, int | None] | None:
    """(type, scale from a numeric(p,s) modifier) or None."""
    folded = " ".join(text.lower().split())
    match = _TYPE_TEXT.fullmatch(folded)
    if match is None:
        return None
    column_type = _TYPE_NAMES.get(match["name"].strip())
    if column_type is None:
        return None
    if match["p"] is not None:
        if column_type not in _TYPES_WITH_MODIFIERS:
            return None
        if column_type is ColumnType.VARCHAR and match["s"] is not None:
            return None
    scale = int(match["s"]) if column_type is ColumnType.NUMERIC and match["s"] is not None else None
    return column_type, scale


# ---------------------------------------------------------------------------------------------
# YAML with line marks
# ---------------------------------------------------------------------------------------------

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class _Node:
    """A YAML node with the line it starts on; scalars keep their source text."""

    kind: str  # "scalar", "seq" or "map"
    line: int
    value: Any = None  # scalar: the YAML value; seq: tuple[_Node, ...]; map: dict[str, _Node]
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
        if isinstance(self.value, int | float) or (self.plain and _DECIMAL_TEXT.fullmatch(self.text)):
            return "a number"
        if isinstance(self.value, datetime.date):
            return "a date"
        return "text" if self.plain else "a quoted string"


class _TooManyNodes(yaml.YAMLError):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _PolicyLoader(yaml.SafeLoader):
    """A SafeLoader that keeps line marks and reports duplicate keys instead of keeping the last one.

    Mapping keys are taken as written (``no:`` is the name "no", not False), and merge keys
    (``<<: *anchor``) work as in YAML 1.1: the mapping's own keys win over merged ones.
    """

    # Aliases are expanded into a tree; this caps the "billion laughs" blow-up of nested aliases.
    MAX_NODES = 200_000

    def __init__(self, text: str, problems: _Problems) -> None:
        super().__init__(text)
        self.problems = problems
        self.built = 0

    def marked_tree(self) -> _Node | None:
        root = self.get_single_node()
        return None if root is None else self._build(root, "", set())

    def _build(self, node: yaml.Node, path: str, active: set[int]) -> _Node:
        line = node.start_mark.line + 1
        self.built += 1
        if self.built > self.MAX_NODES:
            raise _TooManyNodes(line)
        if id(node) in active:
            self.problems.add(line, path, "an alias refers to itself", "remove the recursive alias")
            return _Node("scalar", line, None, "")
        if isinstance(node, yaml.ScalarNode):
            try:
                value = self.construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError, OverflowError):
                # E.g. a date-like scalar that is not a real date: keep it as text.
                value = node.value
            plain = node.style is None
            return _Node("scalar", line, value, node.value, plain)
        active = active | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            items = tuple(self._build(item, f"{path}[{i}]", active) for i, item in enumerate(node.value))
            return _Node("seq", line, items)
        entries: dict[str, _Node] = {}
        for key, child in self._merged_entries(node, path, active):
            entries[key] = child
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key_line = key_node.start_mark.line + 1
            child_path = _join(path, _key_text(key_node))
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
        return _Node("map", line, entries)

    def _merged_entries(self, node: yaml.MappingNode, path: str, active: set[int]) -> list[tuple[str, _Node]]:
        merged: list[tuple[str, _Node]] = []
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


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _decimal_places(value: Decimal) -> int:
    exponent = value.normalize().as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


class _Problems:
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


# ---------------------------------------------------------------------------------------------
# Scalar readers: each reports its own problem and returns None when the value is unusable
# ---------------------------------------------------------------------------------------------

_DECIMAL_TEXT = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_INTEGER_TEXT = re.compile(r"[-+]?\d+")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")
MAX_NAME_LENGTH = 63  # PostgreSQL truncates longer identifiers


def _decimal(node: _Node, path: str, p: _Problems) -> Decimal | None:
    # Numbers are read from the text as written, so 0.1 stays exactly 0.1 and 1e-5 (a string to
    # YAML 1.1) and 010 (octal to YAML 1.1) mean what a person reading them means.
    if node.kind == "scalar" and node.plain and _DECIMAL_TEXT.fullmatch(node.text):
        return Decimal(node.text)
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


def _integer(node: _Node, path: str, p: _Problems) -> int | None:
    if node.kind == "scalar" and node.plain and _INTEGER_TEXT.fullmatch(node.text):
        return int(node.text)
    if node.kind == "scalar" and node.plain and _DECIMAL_TEXT.fullmatch(node.text):
        p.add(
            node.line, path, "must be a whole number", "write an integer such as 1, without a decimal point"
        )
    else:
        p.add(
            node.line, path, f"expected a whole number, found {node.describe()}", "write an integer such as 1"
        )
    return None


def _float(node: _Node, path: str, p: _Problems) -> float | None:
    value = _decimal(node, path, p)
    if value is None:
        return None
    if not math.isfinite(float(value)):
        # 1e400 is a fine Decimal but an infinite float: an infinite budget.
        p.add(node.line, path, "is too large to be a finite number", "write a smaller number")
        return None
    return float(value)


def _boolean(node: _Node, path: str, p: _Problems) -> bool | None:
    if node.kind == "scalar" and node.plain and isinstance(node.value, bool):
        return node.value
    p.add(
        node.line,
        path,
        f"expected true or false, found {node.describe()}",
        "write true or false, without quotes",
    )
    return None


def _string(node: _Node, path: str, p: _Problems, *, fix: str) -> str | None:
    if node.kind == "scalar" and node.value is not None and (isinstance(node.value, str) or node.plain):
        return node.text
    p.add(node.line, path, f"expected text, found {node.describe()}", fix)
    return None


def _mapping(node: _Node, path: str, p: _Problems, *, example: str) -> dict[str, _Node] | None:
    if node.kind == "map":
        return node.value
    p.add(node.line, path, f"expected a mapping, found {node.describe()}", f"write it as {example}")
    return None


def _section(
    node: _Node | None, path: str, p: _Problems, allowed: Sequence[str], *, example: str
) -> dict[str, _Node] | None:
    """The entries of an optional top-level section with known keys; None when it is absent, null
    (a bare `defaults:`) or not a mapping (reported)."""
    if node is None or (node.kind == "scalar" and node.value is None):
        return None
    entries = _mapping(node, path, p, example=example)
    if entries is not None:
        _check_keys(node, path, p, allowed)
    return entries


def _check_keys(
    node: _Node, path: str, p: _Problems, allowed: Sequence[str], *, refused: Mapping[str, str] | None = None
) -> None:
    """Report unknown keys (with the closest known one) and keys `refused` in this place (with why)."""
    refused = refused or {}
    for key, child in node.value.items():
        if key in allowed:
            continue
        if key in refused:
            p.add(child.key_line, _join(path, key), f"not allowed here: {refused[key]}", f"remove `{key}`")
            continue
        close = difflib.get_close_matches(key, [*allowed, *refused], n=1, cutoff=0.6)
        fix = f"did you mean `{close[0]}`?" if close else "allowed keys here: " + ", ".join(allowed)
        p.add(child.key_line, _join(path, key), "unknown key", fix)


def _check_names(node: _Node, path: str, p: _Problems, *, kind: str) -> None:
    """Names must be lowercase SQL identifiers, distinct even to a case-insensitive SQL reader."""
    first: dict[str, tuple[str, int]] = {}
    for key, child in node.value.items():
        if not _NAME.fullmatch(key) or len(key) > MAX_NAME_LENGTH:
            p.add(
                child.key_line,
                _join(path, key),
                f"`{key}` is not a valid {kind} name",
                f"use lowercase letters, digits and _, not starting with a digit, at most {MAX_NAME_LENGTH} "
                "characters, as the name appears to SQL",
            )
        folded = key.casefold()
        if folded in first:
            other, other_line = first[folded]
            p.add(
                child.key_line,
                _join(path, key),
                f"same {kind} name as `{other}` (line {other_line}) once case is ignored, as SQL does",
                f"rename or remove one of the two {kind}s",
            )
        else:
            first[folded] = (key, child.key_line)


# ---------------------------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------------------------

_TOP_KEYS = ("version", "defaults", "analysts", "tables", "server")
_SERVER_KEYS = ("auth_methods",)
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
_ANALYST_KEYS = ("password", "epsilon", "delta", "max_epsilon_per_query", "md5_password")
_MD5_HASH = re.compile(r"md5[0-9a-f]{32}")
_PROTECTED_TABLE_KEYS = (
    "public",
    "privacy_unit",
    "max_groups_per_unit",
    "max_rows_per_unit",
    "row_bounding",
    "randomized_response",
    "schema",
    "columns",
)
ROW_BOUNDING = ("clamp", "sample")
_PUBLIC_TABLE_KEYS = ("public", "schema", "columns")
_COLUMN_KEYS = ("type", "lower", "upper", "scale", "public_values", "summable")
_PASSWD_FIX = "run `dpproxy policy passwd` and paste its output"


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


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML `text`; raise PolicyError listing every problem, each naming `source`:line."""
    p = _Problems(source)
    loader = _PolicyLoader(text, p)
    try:
        root = loader.marked_tree()
    except _TooManyNodes as exc:
        p.add(
            exc.line,
            "(yaml)",
            f"more than {_PolicyLoader.MAX_NODES} values once aliases are expanded",
            "write the policy without nested aliases",
        )
        p.fail()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        p.add(line, "(yaml)", f"not valid YAML: {what}", "fix the YAML syntax (indent with spaces, not tabs)")
        p.fail()
    except yaml.YAMLError as exc:
        p.add(1, "(yaml)", f"not valid YAML: {exc}", "fix the YAML syntax")
        p.fail()
    finally:
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
    top: dict[str, _Node] = root.value
    _check_keys(root, "", p, _TOP_KEYS)

    if "version" not in top:
        p.add(1, "version", "missing", "add `version: 1` at the top")
    else:
        node = top["version"]
        version = _integer(node, "version", p)
        if version is not None and version != 1:
            p.add(node.line, "version", f"unsupported version {version}", "write `version: 1`")

    defaults = _parse_defaults(top.get("defaults"), p)
    server = _parse_server(top.get("server"), p)
    analysts = _parse_analysts(top.get("analysts"), defaults, p)
    if AuthMethod.MD5 not in server.auth_methods and "analysts" in top and top["analysts"].kind == "map":
        for name, child in top["analysts"].value.items():
            if child.kind == "map" and "md5_password" in child.value:
                p.add(
                    child.value["md5_password"].key_line,
                    f"analysts.{name}.md5_password",
                    "is set but server.auth_methods does not list md5, so it would never be used",
                    "add md5 to server.auth_methods, or remove md5_password",
                )
    if "tables" not in top:
        p.add(1, "tables", "missing", "add `tables:` listing the tables analysts may query")
        tables: tuple[TablePolicy, ...] = ()
    else:
        tables = _parse_tables(top["tables"], p)

    p.raise_if_any()
    return Policy(
        defaults=defaults, analysts=analysts, tables=tables, version=1, source=source, server=server
    )


def _parse_server(node: _Node | None, p: _Problems) -> ServerPolicy:
    base = ServerPolicy()
    entries = _section(node, "server", p, _SERVER_KEYS, example="{auth_methods: [scram-sha-256]}")
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
        name = _string(item, path, p, fix=f"write one of {known}")
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
    return ServerPolicy(tuple(methods)) if methods else base


def _parse_defaults(node: _Node | None, p: _Problems) -> Defaults:
    base = Defaults()
    example = "{epsilon: 0.5, delta: 1.0e-7, mechanism: laplace}"
    entries = _section(node, "defaults", p, _DEFAULTS_KEYS, example=example)
    if entries is None:
        return base
    values: dict[str, Any] = {}
    for key in ("epsilon", "delta", "min_epsilon", "max_epsilon"):
        if key in entries:
            values[key] = _float(entries[key], f"defaults.{key}", p)
    if "mechanism" in entries:
        child = entries["mechanism"]
        name = _string(child, "defaults.mechanism", p, fix="write laplace or gaussian")
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
        name = _string(child, "defaults.accounting", p, fix="write pure or zcdp")
        if name is not None and name.lower() in ACCOUNTING:
            values["accounting"] = name.lower()
        elif name is not None:
            p.add(child.line, "defaults.accounting", f"unknown accounting `{name}`", "write pure or zcdp")
    if "replay" in entries:
        values["replay"] = _boolean(entries["replay"], "defaults.replay", p)
    if "data_epoch" in entries:
        values["data_epoch"] = _data_epoch(entries["data_epoch"], "defaults.data_epoch", p)
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


def _data_epoch(node: _Node, path: str, p: _Problems) -> int | str | None:
    """A whole number, or text (an unquoted date is taken as written). Booleans and fractions are
    refused: `true` or `1.5` read as one thing and may be meant as another (`yes`, `1.50`)."""
    fix = 'write a whole number such as 1, or text such as "2024-06-01"'
    if node.kind == "scalar" and node.plain and _INTEGER_TEXT.fullmatch(node.text):
        return int(node.text)
    numeric = node.plain and _DECIMAL_TEXT.fullmatch(node.text) is not None
    if node.kind != "scalar" or node.value is None or isinstance(node.value, bool | float) or numeric:
        p.add(node.line, path, f"expected a whole number or text, found {node.describe()}", fix)
        return None
    if not node.text.strip() or len(node.text) > MAX_DATA_EPOCH_LENGTH:
        p.add(node.line, path, f"must be text of 1 to {MAX_DATA_EPOCH_LENGTH} characters", fix)
        return None
    return node.text


def _parse_analysts(node: _Node | None, defaults: Defaults, p: _Problems) -> tuple[AnalystPolicy, ...]:
    # A bare `analysts:` (null) reads as "no analysts yet", like an empty mapping.
    if node is None or (node.kind == "scalar" and node.value is None):
        return ()
    entries = _mapping(node, "analysts", p, example="{alice: {password: ..., epsilon: 10, delta: 1.0e-5}}")
    if entries is None:
        return ()
    _check_names(node, "analysts", p, kind="analyst")
    analysts = []
    for name, child in entries.items():
        analyst = _parse_analyst(name, child, defaults, p)
        if analyst is not None:
            analysts.append(analyst)
    return tuple(analysts)


def _parse_analyst(name: str, node: _Node, defaults: Defaults, p: _Problems) -> AnalystPolicy | None:
    path = f"analysts.{name}"
    entries = _mapping(node, path, p, example="{password: ..., epsilon: 10, delta: 1.0e-5}")
    if entries is None:
        return None
    _check_keys(node, path, p, _ANALYST_KEYS)
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
    epsilon = delta = max_per_query = None
    for key in ("epsilon", "delta"):
        if key not in entries:
            p.add(
                node.owner_line,
                _join(path, key),
                "missing",
                f"add `{key}:` (the analyst's total {key} budget)",
            )
    if "epsilon" in entries:
        epsilon = _float(entries["epsilon"], f"{path}.epsilon", p)
        if epsilon is not None and epsilon <= 0:
            p.add(
                entries["epsilon"].line,
                f"{path}.epsilon",
                "must be greater than 0",
                "write the total budget, e.g. 10",
            )
            epsilon = None
    if "delta" in entries:
        delta = _float(entries["delta"], f"{path}.delta", p)
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
        max_per_query = _float(child, key_path, p)
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
    if epsilon is None or delta is None:
        return None
    return AnalystPolicy(
        name=name,
        password=password,
        epsilon=epsilon,
        delta=delta,
        max_epsilon_per_query=max_per_query,
        md5_password=md5_password,
    )


def _parse_tables(node: _Node, p: _Problems) -> tuple[TablePolicy, ...]:
    entries = _mapping(node, "tables", p, example="{patients: {privacy_unit: ..., columns: {...}}}")
    if entries is None:
        return ()
    if not entries:
        p.add(node.line, "tables", "no tables are listed", "list at least one table analysts may query")
        return ()
    _check_names(node, "tables", p, kind="table")
    tables = []
    for name, child in entries.items():
        table = _parse_table(name, child, p)
        if table is not None:
            tables.append(table)
    return tuple(tables)


def _parse_table(name: str, node: _Node, p: _Problems) -> TablePolicy | None:
    path = f"tables.{name}"
    entries = _mapping(
        node, path, p, example="{public: true} or {privacy_unit: <column or row>, columns: {...}}"
    )
    if entries is None:
        return None
    public = False
    if "public" in entries:
        public = bool(_boolean(entries["public"], f"{path}.public", p))

    schema = None
    if "schema" in entries:
        child = entries["schema"]
        schema = _string(child, f"{path}.schema", p, fix="write the schema name, e.g. public")
        if schema is not None and (not _NAME.fullmatch(schema) or len(schema) > MAX_NAME_LENGTH):
            p.add(
                child.line,
                f"{path}.schema",
                f"`{schema}` is not a valid schema name",
                "use lowercase letters, digits and _, not starting with a digit",
            )
            schema = None

    if public:
        privacy_keys = {
            key: "a public table has no privacy unit or contribution limits (set public: false to protect it)"
            for key in (
                "privacy_unit",
                "max_groups_per_unit",
                "max_rows_per_unit",
                "row_bounding",
                "randomized_response",
            )
        }
        _check_keys(node, path, p, _PUBLIC_TABLE_KEYS, refused=privacy_keys)
        columns: tuple[ColumnPolicy, ...] = ()
        if "columns" in entries and not (
            entries["columns"].kind == "scalar" and entries["columns"].value is None
        ):
            columns = _parse_columns(
                entries["columns"], f"{path}.columns", p, public=True, unit=None, unit_known=True
            )
        return TablePolicy(name=name, columns=columns, public=True, schema=schema)

    _check_keys(node, path, p, _PROTECTED_TABLE_KEYS)
    unit_text = None
    if "privacy_unit" not in entries:
        p.add(
            node.owner_line,
            f"{path}.privacy_unit",
            "missing: a protected table needs a privacy unit",
            "name the column identifying the person a row belongs to, or write `row` when each row is a "
            "different person, or set `public: true` if the table holds no personal data",
        )
    else:
        unit_text = _string(
            entries["privacy_unit"],
            f"{path}.privacy_unit",
            p,
            fix="name a column of this table, or write row",
        )
    limits = {}
    for key in ("max_groups_per_unit", "max_rows_per_unit"):
        limits[key] = 1
        if key not in entries:
            continue
        child = entries[key]
        value = _integer(child, f"{path}.{key}", p)
        if value is None:
            continue
        if unit_text == "row" and value != 1:
            p.add(
                child.line,
                f"{path}.{key}",
                "must be 1 when the privacy unit is `row` (each row is one person)",
                f"remove `{key}`, or name the column identifying the person as privacy_unit",
            )
        elif not 1 <= value <= MAX_CONTRIBUTIONS:
            p.add(
                child.line,
                f"{path}.{key}",
                f"must be between 1 and {MAX_CONTRIBUTIONS}",
                "give the most a single person may contribute; a larger value is almost certainly a "
                "mistake and would drown every answer in noise",
            )
        else:
            limits[key] = value

    randomized = False
    if "randomized_response" in entries:
        randomized = bool(_boolean(entries["randomized_response"], f"{path}.randomized_response", p))
    row_bounding = "clamp"
    if "row_bounding" in entries:
        child = entries["row_bounding"]
        value_text = _string(child, f"{path}.row_bounding", p, fix="write clamp or sample")
        if value_text is not None and value_text not in ROW_BOUNDING:
            p.add(
                child.line,
                f"{path}.row_bounding",
                f"`{value_text}` is not a row bounding",
                "write clamp or sample",
            )
        elif value_text is not None:
            row_bounding = value_text

    columns_node = entries.get("columns")
    if columns_node is None or (columns_node.kind == "scalar" and columns_node.value is None):
        p.add(
            node.owner_line if columns_node is None else columns_node.line,
            f"{path}.columns",
            "missing: a protected table must list the columns analysts may use",
            "add `columns:` with each column's type (and bounds for summed numbers)",
        )
        return None
    if columns_node.kind != "map":
        _parse_columns(columns_node, f"{path}.columns", p, public=False, unit=None, unit_known=False)
        return None
    column_entries = columns_node.value

    unit = None
    if unit_text is not None:
        unit_line = entries["privacy_unit"].line
        if unit_text == "row":
            if "row" in column_entries:
                p.add(
                    unit_line,
                    f"{path}.privacy_unit",
                    "`row` is ambiguous: the table also lists a column named row",
                    "rename the column in the policy's view or name the unit column explicitly",
                )
        elif unit_text in column_entries:
            unit = unit_text
        else:
            close = difflib.get_close_matches(unit_text, list(column_entries), n=1, cutoff=0.6)
            hint = (
                f"did you mean `{close[0]}`?" if close else "name one of the listed columns, or write `row`"
            )
            p.add(unit_line, f"{path}.privacy_unit", f"`{unit_text}` is not a listed column", hint)
            unit_text = None
    # With the unit unknown, any number column might be it: do not ask for bounds on them yet.
    columns = _parse_columns(
        columns_node, f"{path}.columns", p, public=False, unit=unit, unit_known=unit_text is not None
    )
    if not columns or unit_text is None:
        return None
    return TablePolicy(
        name=name,
        columns=columns,
        public=False,
        privacy_unit=unit,
        max_groups_per_unit=limits["max_groups_per_unit"],
        max_rows_per_unit=limits["max_rows_per_unit"],
        schema=schema,
        row_bounding=row_bounding,
        randomized_response=randomized,
    )


def _parse_columns(
    node: _Node, path: str, p: _Problems, *, public: bool, unit: str | None, unit_known: bool
) -> tuple[ColumnPolicy, ...]:
    entries = _mapping(node, path, p, example="{age: {type: integer, lower: 0, upper: 120}}")
    if entries is None:
        return ()
    if not entries and not public:
        p.add(node.line, path, "no columns are listed", "list at least the privacy unit column")
        return ()
    _check_names(node, path, p, kind="column")
    columns = []
    for name, child in entries.items():
        column = _parse_column(
            name, child, f"{path}.{name}", p, public=public, is_unit=name == unit, unit_known=unit_known
        )
        if column is not None:
            columns.append(column)
    return tuple(columns)


def _parse_column(
    name: str, node: _Node, path: str, p: _Problems, *, public: bool, is_unit: bool, unit_known: bool
) -> ColumnPolicy | None:
    entries = _mapping(node, path, p, example="{type: integer, lower: 0, upper: 120}")
    if entries is None:
        return None
    if public:
        meaningless = "a public table is read raw, so bounds, grids and public values mean nothing here"
        _check_keys(
            node, path, p, ("type",), refused={key: meaningless for key in _COLUMN_KEYS if key != "type"}
        )
    else:
        _check_keys(node, path, p, _COLUMN_KEYS)

    if "type" not in entries:
        p.add(node.owner_line, f"{path}.type", "missing", "add `type:`, e.g. {type: integer}")
        return None
    type_node = entries["type"]
    type_text = _string(type_node, f"{path}.type", p, fix="write a type name such as integer or text")
    if type_text is None:
        return None
    parsed = _parse_type_text(type_text)
    if parsed is None:
        close = difflib.get_close_matches(type_text.lower(), ACCEPTED_TYPE_NAMES, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`? " if close else ""
        if type_text.strip().lower() == "float":
            hint = "`float` means 8 bytes to PostgreSQL but 4 to DuckDB: write double precision or real; "
        p.add(
            type_node.line,
            f"{path}.type",
            f"unsupported type `{type_text}`",
            f"{hint}accepted types: {', '.join(ACCEPTED_TYPE_NAMES)}",
        )
        return None
    column_type, type_scale = parsed
    if public:
        return ColumnPolicy(name=name, type=column_type)

    scale = None
    if "scale" in entries:
        child = entries["scale"]
        value = _integer(child, f"{path}.scale", p)
        if value is not None:
            if not column_type.is_fractional:
                p.add(
                    child.line,
                    f"{path}.scale",
                    f"applies only to numeric, real and double precision columns, not {column_type}",
                    "remove `scale`",
                )
            elif not 0 <= value <= MAX_SCALE:
                p.add(
                    child.line, f"{path}.scale", f"must be between 0 and {MAX_SCALE}", "write e.g. scale: 2"
                )
            else:
                scale = value
    elif type_scale is not None:
        scale = min(type_scale, MAX_SCALE)

    lower, upper = _parse_bounds(entries, path, p, column_type, scale, is_unit=is_unit)

    public_values = None
    if "public_values" in entries:
        child = entries["public_values"]
        if is_unit:
            p.add(
                child.key_line,
                f"{path}.public_values",
                "not allowed on the privacy unit column: its values identify people",
                "remove `public_values`",
            )
        else:
            public_values = _parse_public_values(child, f"{path}.public_values", p, column_type)

    summable = True
    if "summable" in entries:
        child = entries["summable"]
        value = _boolean(child, f"{path}.summable", p)
        if value is not None:
            if not column_type.is_number:
                p.add(
                    child.key_line,
                    f"{path}.summable",
                    f"applies only to number columns, not {column_type}",
                    "remove `summable`",
                )
            elif is_unit and value:
                p.add(
                    child.key_line,
                    f"{path}.summable",
                    "the privacy unit column cannot be summed",
                    "remove `summable`",
                )
            else:
                summable = value
    bounds_given = "lower" in entries or "upper" in entries  # if malformed, that is reported already
    if unit_known and not is_unit and column_type.is_number and summable and not bounds_given:
        p.add(
            node.owner_line,
            path,
            f"this {column_type} column needs bounds to be summed",
            "add `lower:` and `upper:` (the range a person's value is clipped to), "
            "or `summable: false` to forbid SUM and AVG over it",
        )
    return ColumnPolicy(
        name=name,
        type=column_type,
        lower=lower,
        upper=upper,
        public_values=public_values,
        scale=scale,
        summable=summable,
    )


def _parse_bounds(
    entries: dict[str, _Node],
    path: str,
    p: _Problems,
    column_type: ColumnType,
    scale: int | None,
    *,
    is_unit: bool,
) -> tuple[Decimal | None, Decimal | None]:
    given = [key for key in ("lower", "upper") if key in entries]
    if not given:
        return None, None
    if is_unit:
        for key in given:
            p.add(
                entries[key].key_line,
                f"{path}.{key}",
                "not allowed on the privacy unit column: it identifies people and is never summed",
                f"remove `{key}`",
            )
        return None, None
    if not column_type.is_number:
        for key in given:
            p.add(
                entries[key].key_line,
                f"{path}.{key}",
                f"bounds apply only to number columns, not {column_type}",
                f"remove `{key}`",
            )
        return None, None
    grid = 0 if column_type.is_integer else (scale if scale is not None else DEFAULT_GRID_SCALE)
    bounds: dict[str, Decimal | None] = {}
    for key in given:
        child = entries[key]
        value = _decimal(child, f"{path}.{key}", p)
        if value is None:
            bounds[key] = None
            continue
        if column_type.is_integer:
            if value != value.to_integral_value():
                p.add(
                    child.line,
                    f"{path}.{key}",
                    f"must be a whole number: the column is {column_type}",
                    "round it",
                )
                bounds[key] = None
                continue
            low, high = _INTEGER_RANGES[column_type]
            if not low <= value <= high:
                p.add(
                    child.line,
                    f"{path}.{key}",
                    f"is outside the range of {column_type} ({low} to {high})",
                    "use a bound the column can hold, or a wider type",
                )
                bounds[key] = None
                continue
            value = Decimal(int(value))
        elif abs(value) * 10**grid > _INTEGER_RANGES[ColumnType.BIGINT][1]:
            # Sums are computed in whole grid units; a clipped value must fit in a bigint.
            p.add(
                child.line,
                f"{path}.{key}",
                f"is too large: times 10^{grid} (the grid) it must fit in a bigint",
                "use a smaller bound, or a smaller `scale:`",
            )
            bounds[key] = None
            continue
        elif _decimal_places(value) > grid:
            # A bound off the grid could be rounded past itself when values are put on the grid,
            # making a clipped value exceed the bound the sensitivity is computed from.
            p.add(
                child.line,
                f"{path}.{key}",
                f"has more decimal places than the column's grid (scale {grid})",
                f"round the bound to {grid} decimal places, or set `scale:` to its number of decimals",
            )
            bounds[key] = None
            continue
        bounds[key] = value
    if len(given) == 1:
        key = given[0]
        missing = "upper" if key == "lower" else "lower"
        p.add(entries[key].key_line, f"{path}.{key}", f"`{missing}` is missing", "give both lower and upper")
        return None, None
    lower, upper = bounds["lower"], bounds["upper"]
    if lower is not None and upper is not None and lower > upper:
        p.add(
            entries["lower"].line,
            f"{path}.lower",
            f"lower ({lower}) is greater than upper ({upper})",
            "swap them: lower must be <= upper",
        )
        return None, None
    return lower, upper


def _parse_public_values(
    node: _Node, path: str, p: _Problems, column_type: ColumnType
) -> tuple[object, ...] | None:
    if node.kind != "seq" or not node.value:
        p.add(
            node.line,
            path,
            f"expected a non-empty list, found {'an empty list' if node.kind == 'seq' else node.describe()}",
            "list every value, e.g. [flu, cold, asthma]",
        )
        return None
    values: list[object] = []
    seen: dict[object, int] = {}
    ok = True
    for i, item in enumerate(node.value):
        item_path = f"{path}[{i}]"
        value = _public_value(item, item_path, p, column_type)
        if value is None:
            ok = False
            continue
        key = (type(value), value)
        if key in seen:
            p.add(item.line, item_path, f"repeats item {seen[key]}", "list each value once")
            ok = False
            continue
        seen[key] = i
        values.append(value)
    return tuple(values) if ok else None


def _public_value(node: _Node, path: str, p: _Problems, column_type: ColumnType) -> object | None:
    if node.kind != "scalar" or node.value is None:
        p.add(
            node.line,
            path,
            f"expected a {column_type} value, found {node.describe()}",
            "list plain values; NULL is never a public value",
        )
        return None
    if column_type.is_text:
        # As written: a zip code 02139 or a country code NO stays text, whatever YAML 1.1 thinks.
        return node.text
    if column_type.is_integer:
        value = _integer(node, path, p)
        if value is None:
            return None
        low, high = _INTEGER_RANGES[column_type]
        if not low <= value <= high:
            p.add(node.line, path, f"is outside the range of {column_type}", "remove it, or use a wider type")
            return None
        return value
    if column_type.is_fractional:
        return _decimal(node, path, p)
    if column_type is ColumnType.BOOLEAN:
        return _boolean(node, path, p)
    if column_type is ColumnType.DATE:
        value = node.value
        if isinstance(value, str):
            try:
                value = datetime.date.fromisoformat(value)
            except ValueError:
                value = None
        if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
            return value
        p.add(node.line, path, "expected a date", "write it as YYYY-MM-DD, e.g. 2024-01-31")
        return None
    value = node.value
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            value = None
    wants_zone = column_type is ColumnType.TIMESTAMPTZ
    if isinstance(value, datetime.datetime) and (value.tzinfo is not None) == wants_zone:
        return value
    example = "2024-01-31 08:00:00+00:00" if wants_zone else "2024-01-31 08:00:00"
    zone = "with a UTC offset" if wants_zone else "without a time zone"
    p.add(node.line, path, f"expected a timestamp {zone}", f"write it like {example}")
    return None


# ---------------------------------------------------------------------------------------------
# The live schema: checking a policy against it, and drafting a policy from it
# ---------------------------------------------------------------------------------------------


class LiveColumnLike(Protocol):
    """A column as the backend reports it (dpproxy.backends.LiveColumn satisfies this)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> ColumnType | None: ...  # None: a type dpproxy does not support

    @property
    def sql_type(self) -> str: ...  # the database's own spelling, for messages


# Within a family, a policy type accepts any live type of equal or lower rank: every value the live
# column can hold is then a value of the declared type. Fractional policy types accept exactly
# representable integer types.
_ACCEPTS: dict[ColumnType, frozenset[ColumnType]] = {
    ColumnType.SMALLINT: frozenset({ColumnType.SMALLINT}),
    ColumnType.INTEGER: frozenset({ColumnType.SMALLINT, ColumnType.INTEGER}),
    ColumnType.BIGINT: frozenset({ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.BIGINT}),
    ColumnType.NUMERIC: frozenset(
        {ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.BIGINT, ColumnType.NUMERIC}
    ),
    ColumnType.REAL: frozenset({ColumnType.SMALLINT, ColumnType.REAL}),
    ColumnType.DOUBLE: frozenset(
        {ColumnType.SMALLINT, ColumnType.INTEGER, ColumnType.REAL, ColumnType.DOUBLE}
    ),
    ColumnType.TEXT: frozenset({ColumnType.TEXT, ColumnType.VARCHAR}),
    ColumnType.VARCHAR: frozenset({ColumnType.TEXT, ColumnType.VARCHAR}),
    ColumnType.BOOLEAN: frozenset({ColumnType.BOOLEAN}),
    ColumnType.DATE: frozenset({ColumnType.DATE}),
    ColumnType.TIMESTAMP: frozenset({ColumnType.TIMESTAMP}),
    ColumnType.TIMESTAMPTZ: frozenset({ColumnType.TIMESTAMPTZ}),
}


def check_against_schema(policy: Policy, live: Mapping[str, Sequence[LiveColumnLike]]) -> list[str]:
    """Problems between the policy and the live schema the backend reports; empty when they agree.

    `live` maps a table name (or "schema.table") to its columns. Live columns of a protected table
    that the policy does not list are fine: they are simply not exposed.
    """
    problems: list[str] = []
    for table in policy.tables:
        path = f"tables.{table.name}"
        qualified = f"{table.schema}.{table.name}" if table.schema else table.name
        live_columns = live.get(qualified)
        if live_columns is None:
            live_columns = live.get(table.name)
        if live_columns is None:
            problems.append(
                f"{policy.source}: {path}: the database has no table {qualified}; "
                "create it, fix the table name (or its `schema:`), or remove it from the policy"
            )
            continue
        by_name = {column.name: column for column in live_columns}
        for column in table.columns:
            column_path = f"{path}.columns.{column.name}"
            found = by_name.get(column.name)
            if found is None:
                problems.append(
                    f"{policy.source}: {column_path}: the database table {qualified} has no column "
                    f"{column.name}; fix the column name or remove it from the policy"
                )
            elif found.type is None:
                problems.append(
                    f"{policy.source}: {column_path}: the database column {qualified}.{column.name} has type "
                    f"{found.sql_type}, which dpproxy does not support; remove the column from the policy, "
                    "or expose a view that casts it to a supported type"
                )
            elif found.type not in _ACCEPTS[column.type]:
                widest = found.type.is_number and column.type.is_number
                what = "wider than" if widest else "incompatible with"
                problems.append(
                    f"{policy.source}: {column_path}: the database column {qualified}.{column.name} is "
                    f"{found.sql_type}, {what} the policy's {column.type}; declare `type: {found.type}` "
                    "in the policy (and check its bounds)"
                )
    return problems


# Column names that usually identify a person, used only to pre-fill a draft's privacy unit.
_PERSON_ID_NAMES = (
    "person_id", "user_id", "patient_id", "customer_id", "individual_id", "member_id", "employee_id",
    "participant_id", "subject_id", "student_id", "client_id", "account_id", "household_id",
)  # fmt: skip


def draft_policy(live: Mapping[str, Sequence[LiveColumnLike]], *, analyst: str = "analyst") -> str:
    """A commented policy skeleton for the live schema (`dpproxy policy init`).

    The draft loads as-is and is conservative: no number column is summable until the data owner
    gives its bounds, no value set is public, the analyst has no password (so cannot connect over
    the network). Every guess is marked `# TODO` for the data owner to check. Tables and columns
    that cannot be exposed are listed as comments. ValueError if `analyst` is not a valid name.
    """
    shared_ids = _ids_shared_between_tables(live)
    out = [
        "# dpproxy policy drafted from the database schema. Review every TODO before serving:",
        "# a wrong privacy unit, bound or public value set weakens the privacy guarantee.",
        "# Reference: the README (Policy reference). Check with `dpproxy policy check`.",
        "version: 1",
        "",
        "defaults:",
        "  epsilon: 0.5        # per-query epsilon when a query does not ask for another",
        "  delta: 1.0e-7       # per-query delta",
        "  mechanism: laplace",
        "",
        "analysts:",
        f"  # TODO: add `password:` with the output of `dpproxy policy passwd`; without one, {analyst}",
        "  # can use dpproxy only from the command line and the Python API, not over the network.",
        f"  {_draft_name(analyst, 'analyst')}: {{epsilon: 1.0, delta: 1.0e-6}}  # TODO: set the total budget",
        "",
        "tables:",
    ]
    for key in sorted(live):
        schema, _, table_name = key.rpartition(".")
        columns = [c for c in live[key] if c.type is not None and _is_name(c.name)]
        skipped = [c for c in live[key] if c not in columns]
        if not _is_name(table_name) or (schema and not _is_name(schema)):
            out.append(f"  # skipped table {key}: its name is not a lowercase SQL identifier")
            continue
        if not columns:
            out.append(f"  # skipped table {key}: no column of a supported type")
            continue
        out.append(f"  {table_name}:")
        if schema:
            out.append(f"    schema: {schema}")
        unit = _guess_unit(columns, shared_ids)
        if unit is None:
            out.append(
                "    # TODO: `row` says each row is a different person. If one person can have several"
            )
            out.append(
                "    # rows, name the column identifying the person instead, and set max_rows_per_unit."
            )
            out.append(
                "    # If the table holds no personal data at all, replace all this with `public: true`."
            )
            out.append("    privacy_unit: row")
        else:
            out.append(f"    privacy_unit: {unit}  # TODO: check that {unit} identifies one person")
            out.append(
                "    max_groups_per_unit: 1  # TODO: the most groups one person may contribute to per query"
            )
            out.append(
                "    max_rows_per_unit: 1    # TODO: the most rows one person may contribute per group"
            )
        out.append("    columns:")
        width = max(len(c.name) for c in columns) + 1
        for column in columns:
            label = f"{column.name}:".ljust(width)
            assert column.type is not None
            if column.name == unit:
                out.append(f"      {label} {{type: {column.type}}}  # the privacy unit")
            elif column.type.is_number:
                out.append(
                    f"      {label} {{type: {column.type}, summable: false}}"
                    "  # TODO: to allow SUM/AVG, replace summable: false by lower: ..., upper: ..."
                )
            elif column.type.is_text or column.type is ColumnType.BOOLEAN:
                out.append(
                    f"      {label} {{type: {column.type}}}"
                    "  # TODO: if its set of values is public knowledge, add public_values: [...]"
                )
            else:
                out.append(f"      {label} {{type: {column.type}}}")
        for column in skipped:
            reason = "unsupported type " + column.sql_type if column.type is None else "name is not lowercase"
            out.append(f"      # {column.name}: not exposed ({reason})")
    if len(out) and out[-1] == "tables:":
        out.append("  {}  # TODO: no table could be drafted; list the tables analysts may query")
    return "\n".join(out) + "\n"


def _is_name(text: str) -> bool:
    return bool(_NAME.fullmatch(text)) and len(text) <= MAX_NAME_LENGTH


def _draft_name(name: str, kind: str) -> str:
    if not _is_name(name):
        raise ValueError(f"{kind} name `{name}` is not a lowercase SQL identifier")
    return name


def _ids_shared_between_tables(live: Mapping[str, Sequence[LiveColumnLike]]) -> set[str]:
    seen: dict[str, int] = {}
    for columns in live.values():
        for name in {c.name for c in columns if c.name.endswith("_id")}:
            seen[name] = seen.get(name, 0) + 1
    return {name for name, count in seen.items() if count > 1}


def _guess_unit(columns: Sequence[LiveColumnLike], shared_ids: set[str]) -> str | None:
    names = [c.name for c in columns]
    for name in _PERSON_ID_NAMES:
        if name in names:
            return name
    # An id column several tables carry (patients.patient_id, visits.patient_id) is the usual unit.
    for name in names:
        if name in shared_ids:
            return name
    return None
