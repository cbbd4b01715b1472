"""The policy as the rest of dpproxy reads it: frozen objects holding only validated values.

This module owns `Policy` and its parts (defaults, analysts, tables, columns, server settings),
the enumerations their fields take (`Mechanism`, `AuthMethod`, `ACCOUNTING`, `ROW_BOUNDING`) and
the rule for the names a policy gives tables, columns, schemas and analysts. Nothing downstream
re-checks a bound, limit or budget held here: the loader (`dpproxy.policy.loading`) builds these
objects only from values it has validated.

It must never see YAML, a policy file or a database: objects are built by the loader, or directly
by tests and the Python API.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from dpproxy.policy.refresh import Refresh
from dpproxy.policy.types import ColumnType


class Mechanism(StrEnum):
    LAPLACE = "laplace"
    GAUSSIAN = "gaussian"


class AuthMethod(StrEnum):
    """How the wire server checks an analyst's password (`server.auth_methods`)."""

    SCRAM_SHA_256 = "scram-sha-256"  # against `password` (a SCRAM verifier); the password never travels
    PASSWORD = "password"  # cleartext over the connection, checked against `password`: use TLS
    MD5 = "md5"  # PostgreSQL's legacy challenge against `md5_password`


# Digits after the decimal point kept on the fixed-point grid when summing a fractional column
# whose policy does not say otherwise (cents for money).
DEFAULT_GRID_SCALE = 2

# Names of tables, columns, schemas and analysts: lowercase SQL identifiers, as the name appears to SQL.
NAME = re.compile(r"[a-z_][a-z0-9_]*")
MAX_NAME_LENGTH = 63  # PostgreSQL truncates longer identifiers


def is_valid_name(text: str) -> bool:
    """Whether `text` may name a table, column, schema or analyst in a policy."""
    return bool(NAME.fullmatch(text)) and len(text) <= MAX_NAME_LENGTH


@dataclass(frozen=True)
class ColumnPolicy:
    name: str
    type: ColumnType
    # Number columns: exact decimals, values are clipped into them. Date and time columns: a date or
    # datetime of the column's type (a timestamptz's in UTC), the declared range values are clipped
    # into and date_trunc/extract keys are enumerated from (dpproxy.sql.public_keys).
    lower: Decimal | datetime.date | None = None
    upper: Decimal | datetime.date | None = None
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


# How a table's max_rows_per_unit is enforced (`row_bounding`), see TablePolicy.
ROW_BOUNDING = ("clamp", "sample")
# Whether each query chooses its contribution bounds within the table's limits (`chosen`, the
# default: the limits are ceilings) or uses the limits themselves (`fixed`), see TablePolicy.
CONTRIBUTION_BOUNDS = ("chosen", "fixed")
# Whether an AVG of a column with a wide declared range clips its values to a range chosen per query
# (`chosen`, the default, with contribution_bounds chosen) or reads them within the declared bounds
# (`declared`), see TablePolicy.
VALUE_RANGES = ("chosen", "declared")
# What a row whose privacy unit is NULL is (`null_units`), see TablePolicy.
NULL_UNITS = ("left_out", "each_a_person")


@dataclass(frozen=True)
class UnitReference:
    """A protected table whose person is named by another protected table it references
    (`privacy_unit: {references: orders, on: order_id}`): each row's person is the person of the row of
    `table` whose `on` equals the row's `on`, followed up the chain when `table` references further.
    `key_unique`: the policy vouches that `table.on` is unique (else the database must enforce it)."""

    table: str
    on: str
    key_unique: bool = False


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_Column = TypeVar("_Column", bound=_Named)


class NamedColumns(Generic[_Column]):
    """A frozen dataclass's `columns` looked up by name: `column(name)`, None when it has none of that
    name, from an index built once after __init__ (not a field: outside repr and comparisons).
    `TablePolicy` holds one, and so does the SQL scope's `Source` (dpproxy.sql.scope)."""

    columns: tuple[_Column, ...]
    _by_name: dict[str, _Column]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.name: c for c in self.columns})

    def column(self, name: str) -> _Column | None:
        return self._by_name.get(name)


@dataclass(frozen=True)
class TablePolicy(NamedColumns[ColumnPolicy]):
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
    # "chosen": max_rows_per_unit and max_groups_per_unit are ceilings, and each query chooses the
    # bounds it uses within them, privately (docs/privacy.md §3, "Bounds chosen per query");
    # "fixed": every query uses the limits themselves, enforced by `row_bounding`.
    contribution_bounds: str = "chosen"
    # "chosen": an AVG of a column whose declared range is wide clips its values to a range a private
    # histogram shows them in (docs/privacy.md §3, "Value ranges chosen per query"; with
    # contribution_bounds chosen only); "declared": the declared bounds, one statement.
    value_ranges: str = "chosen"
    # A row whose privacy-unit column is NULL: "left_out" (belongs to no person, read by no private
    # query) or "each_a_person" (the data owner declares each such row a person of its own: one
    # person per row, told apart by its declared columns; docs/privacy.md §3, "Rows without a
    # person"). Only with a unit column of the table itself.
    null_units: str = "left_out"
    # COUNT(DISTINCT unit) … WHERE predicate is answered by randomized response (the survey
    # protocol: each person reports whether the predicate holds for them, truthfully with p = 3/4).
    randomized_response: bool = False
    # The data owner vouches that the privacy unit column is unique and never NULL in this table
    # (`unit_unique: true`): the engine then takes each row to be a different person, as when the
    # database enforces it (Spark enforces no keys). Only with a named unit column and limits of 1.
    unit_unique: bool = False
    # The person is reached through a referenced protected table (privacy_unit: {references: …, on: …});
    # `privacy_unit` then holds the unit column's name at the end of the chain, which this table does
    # not have: the rewrite reads it by joining up the chain (dpproxy.sql.relation).
    unit_reference: UnitReference | None = None

    @property
    def unit_is_row(self) -> bool:
        return self.privacy_unit is None

    def vouched(self) -> str | None:
        """What the operator vouches for when this table says `unit_unique: true`, for `policy check`
        and `serve` to say; None when it does not."""
        if not self.unit_unique or self.privacy_unit is None:
            return None
        where = f"{self.schema}.{self.name}" if self.schema else self.name
        return (
            f"tables.{self.name}.unit_unique: the policy vouches that {self.privacy_unit} is unique and "
            f"never NULL in {where}, so each of its rows is taken to be a different person; dpproxy "
            "cannot check this, and a duplicate would let that person count more than once"
        )


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
    # The analyst's budget is spent afresh in each UTC window (dpproxy.policy.refresh).
    refresh: Refresh = Refresh.NEVER


@dataclass(frozen=True)
class DataSetBudget:
    """The top-level `budget:`: what every analyst together may spend, each within their own too."""

    epsilon: float
    delta: float
    refresh: Refresh = Refresh.NEVER


@dataclass(frozen=True)
class ServerPolicy:
    """Settings of the wire server that belong with the analysts: how they may authenticate."""

    # Tried in this order for each analyst: the first the analyst has a credential for is used.
    auth_methods: tuple[AuthMethod, ...] = (AuthMethod.SCRAM_SHA_256,)
    # Audit records older than this many days are deleted (at start and daily); 0 keeps them all.
    audit_retention_days: int = 365
    # The ledger the commands given this policy use (`server.ledger`): a SQLite path (relative to the
    # policy file's directory) or a postgresql:// URL. None: the command line's, else the default.
    ledger: str | None = None


@dataclass(frozen=True)
class ConsoleOwner:
    """A data owner who may log in to the console (`console.owners`)."""

    name: str
    # A SCRAM-SHA-256 verifier, never a plaintext password; kept out of repr like an analyst's.
    password: str = field(repr=False)


@dataclass(frozen=True)
class ConsolePolicy:
    """The owners' web console (`console:`): who may log in, and for how long a login lasts."""

    owners: tuple[ConsoleOwner, ...] = ()
    session_minutes: int = 60

    def owner(self, name: str) -> ConsoleOwner | None:
        return next((o for o in self.owners if o.name == name), None)


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
    console: ConsolePolicy | None = None  # None: the policy has no `console:` section
    budget: DataSetBudget | None = None  # None: no data-set budget, each analyst's own only
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
