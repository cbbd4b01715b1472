"""The policy: which tables are exposed, who the privacy unit is, bounds, analysts and budgets.

The package's parts, each standing apart and using only parts listed before it:

- `types`: `ColumnType` and every type name dpproxy understands, from policies and from databases;
- `model`: the frozen, validated objects the rest of dpproxy reads (`Policy` and its parts);
- `problems`, `marked_yaml`, `readers`: problem messages, YAML with line marks, typed value readers;
- `defaults`, `analysts`, `columns`, `tables`, `console`: one section of a policy file each;
- `loading`: `load_policy` and `parse_policy`, which report every problem of a file at once, each as
  "<file>:<line>: <key path>: <what is wrong>; <how to fix it>";
- `live_schema`, `drafting`: checking a policy against the columns a backend reports, and drafting
  one from them (`dpproxy policy init`).

The package never touches data and never imports a backend, and never echoes a password field's
value. The key reference is the README (Policy reference); docs/architecture.md places the policy
among dpproxy's parts. Everything a caller needs is importable from `dpproxy.policy` itself.
"""

from __future__ import annotations

from dpproxy.policy.columns import MAX_SCALE
from dpproxy.policy.defaults import MAX_DATA_EPOCH_LENGTH
from dpproxy.policy.drafting import ValueRange, draft_policy
from dpproxy.policy.live_schema import (
    LiveColumnLike,
    check_against_schema,
    reference_warnings,
    units_kept_not_null,
)
from dpproxy.policy.loading import load_policy, parse_policy
from dpproxy.policy.model import (
    ACCOUNTING,
    DEFAULT_GRID_SCALE,
    MAX_NAME_LENGTH,
    ROW_BOUNDING,
    AnalystPolicy,
    AuthMethod,
    ColumnPolicy,
    ConsoleOwner,
    ConsolePolicy,
    DataSetBudget,
    Defaults,
    Mechanism,
    NamedColumns,
    Policy,
    ServerPolicy,
    TablePolicy,
    UnitReference,
)
from dpproxy.policy.refresh import DATASET, REFRESHES, Refresh, account_key, next_refresh
from dpproxy.policy.tables import MAX_CONTRIBUTIONS
from dpproxy.policy.types import ACCEPTED_TYPE_NAMES, ColumnType, column_type_from_sql

__all__ = [
    "ACCEPTED_TYPE_NAMES",
    "ACCOUNTING",
    "DATASET",
    "DEFAULT_GRID_SCALE",
    "MAX_CONTRIBUTIONS",
    "MAX_DATA_EPOCH_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_SCALE",
    "REFRESHES",
    "ROW_BOUNDING",
    "AnalystPolicy",
    "AuthMethod",
    "ColumnPolicy",
    "ColumnType",
    "ConsoleOwner",
    "ConsolePolicy",
    "DataSetBudget",
    "Defaults",
    "LiveColumnLike",
    "Mechanism",
    "NamedColumns",
    "Policy",
    "Refresh",
    "ServerPolicy",
    "TablePolicy",
    "UnitReference",
    "ValueRange",
    "account_key",
    "check_against_schema",
    "column_type_from_sql",
    "draft_policy",
    "load_policy",
    "next_refresh",
    "parse_policy",
    "reference_warnings",
    "units_kept_not_null",
]
