"""The columns of a table in a policy file: type, bounds, grid scale, public values, summable.

This module owns reading a column entry into `ColumnPolicy`. For a protected table: bounds are exact
decimals of the column's type and on its fixed-point grid (dates and times: values of the column's
type, a declared range), a number column other than the privacy
unit is bounded or `summable: false`, public values are values of the column's type, listed once,
never on the unit. A public table's columns are read raw, so they take a type and nothing else.

It must never see the table's other settings beyond which column is the privacy unit, nor a
database: the type names it accepts come from `dpproxy.policy.types`.
"""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar

from dpproxy.policy.marked_yaml import Node
from dpproxy.policy.model import DEFAULT_GRID_SCALE, ColumnPolicy
from dpproxy.policy.problems import Problems
from dpproxy.policy.readers import (
    check_keys,
    check_names,
    read_boolean,
    read_decimal,
    read_integer,
    read_mapping,
    read_text,
)
from dpproxy.policy.types import ACCEPTED_TYPE_NAMES, INTEGER_RANGES, ColumnType, read_policy_type

# The finest fixed-point grid a fractional column may be summed on (decimal digits).
MAX_SCALE = 9

_COLUMN_KEYS = ("type", "lower", "upper", "scale", "public_values", "summable")


def read_columns(
    node: Node, path: str, p: Problems, *, public: bool, unit: str | None, unit_known: bool
) -> tuple[ColumnPolicy, ...]:
    entries = read_mapping(node, path, p, example="{age: {type: integer, lower: 0, upper: 120}}")
    if entries is None:
        return ()
    if not entries and not public:
        p.add(node.line, path, "no columns are listed", "list at least the privacy unit column")
        return ()
    check_names(node, path, p, kind="column")
    columns = []
    for name, child in entries.items():
        column = _read_column(
            name, child, f"{path}.{name}", p, public=public, is_unit=name == unit, unit_known=unit_known
        )
        if column is not None:
            columns.append(column)
    return tuple(columns)


def _read_column(
    name: str, node: Node, path: str, p: Problems, *, public: bool, is_unit: bool, unit_known: bool
) -> ColumnPolicy | None:
    entries = read_mapping(node, path, p, example="{type: integer, lower: 0, upper: 120}")
    if entries is None:
        return None
    if public:
        meaningless = "a public table is read raw, so bounds, grids and public values mean nothing here"
        check_keys(
            node, path, p, ("type",), refused={key: meaningless for key in _COLUMN_KEYS if key != "type"}
        )
    else:
        check_keys(node, path, p, _COLUMN_KEYS)

    if "type" not in entries:
        p.add(node.owner_line, f"{path}.type", "missing", "add `type:`, e.g. {type: integer}")
        return None
    type_node = entries["type"]
    type_text = read_text(type_node, f"{path}.type", p, fix="write a type name such as integer or text")
    if type_text is None:
        return None
    parsed = read_policy_type(type_text)
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

    given_scale = _read_type_setting(entries, "scale", path, p, read_integer, column_type)
    scale = min(type_scale, MAX_SCALE) if type_scale is not None and "scale" not in entries else None
    if given_scale is not None:
        child, value = given_scale
        if 0 <= value <= MAX_SCALE:
            scale = value
        else:
            p.add(child.line, f"{path}.scale", f"must be between 0 and {MAX_SCALE}", "write e.g. scale: 2")

    lower, upper = _read_bounds(entries, path, p, column_type, scale, is_unit=is_unit)

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
            public_values = _read_public_values(child, f"{path}.public_values", p, column_type)

    summable = True
    given_summable = _read_type_setting(entries, "summable", path, p, read_boolean, column_type)
    if given_summable is not None:
        child, summable = given_summable
        if is_unit and summable:
            p.add(
                child.key_line,
                f"{path}.summable",
                "the privacy unit column cannot be summed",
                "remove `summable`",
            )
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


_Setting = TypeVar("_Setting", int, bool)

# The keys only some column types take: which types (the test, and their name in a problem), and
# whether a problem points at the key's line or at its value's.
_TYPE_SETTINGS: dict[str, tuple[Callable[[ColumnType], bool], str, bool]] = {
    "scale": (lambda t: t.is_fractional, "numeric, real and double precision", False),
    "summable": (lambda t: t.is_number, "number", True),
}


def _read_type_setting(
    entries: dict[str, Node],
    key: str,
    path: str,
    p: Problems,
    read: Callable[[Node, str, Problems], _Setting | None],
    column_type: ColumnType,
) -> tuple[Node, _Setting] | None:
    """A key of `_TYPE_SETTINGS` (`scale`, `summable`): its node and value, or None when it is absent,
    malformed (`read` says why) or on a column whose type does not take it (said here)."""
    child = entries.get(key)
    if child is None:
        return None
    value = read(child, f"{path}.{key}", p)
    if value is None:
        return None
    takes_it, kinds, at_key = _TYPE_SETTINGS[key]
    if not takes_it(column_type):
        p.add(
            child.key_line if at_key else child.line,
            f"{path}.{key}",
            f"applies only to {kinds} columns, not {column_type}",
            f"remove `{key}`",
        )
        return None
    return child, value


def _read_bounds(
    entries: dict[str, Node],
    path: str,
    p: Problems,
    column_type: ColumnType,
    scale: int | None,
    *,
    is_unit: bool,
) -> tuple[Decimal | datetime.date | None, Decimal | datetime.date | None]:
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
    if column_type.is_temporal:
        return _read_temporal_bounds(entries, given, path, p, column_type)
    if not column_type.is_number:
        for key in given:
            p.add(
                entries[key].key_line,
                f"{path}.{key}",
                f"bounds apply only to number columns and to date and time columns, not {column_type}",
                f"remove `{key}`",
            )
        return None, None
    grid = 0 if column_type.is_integer else (scale if scale is not None else DEFAULT_GRID_SCALE)
    bounds: dict[str, Decimal | None] = {}
    for key in given:
        child = entries[key]
        value = read_decimal(child, f"{path}.{key}", p)
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
            low, high = INTEGER_RANGES[column_type]
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
        elif abs(value) * 10**grid > INTEGER_RANGES[ColumnType.BIGINT][1]:
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
    return _bound_pair(entries, given, bounds, path, p, "greater than")


_Bound = TypeVar("_Bound", Decimal, datetime.date)


def _bound_pair(
    entries: dict[str, Node],
    given: list[str],
    bounds: dict[str, _Bound | None],
    path: str,
    p: Problems,
    after: str,
) -> tuple[_Bound | None, _Bound | None]:
    """(lower, upper) once both are given and in order; (None, None) with a problem otherwise.
    `after`: how the message says lower lies beyond upper ("greater than", "later than")."""
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
            f"lower ({lower}) is {after} upper ({upper})",
            "swap them: lower must be <= upper",
        )
        return None, None
    return lower, upper


def _read_temporal_bounds(
    entries: dict[str, Node], given: list[str], path: str, p: Problems, column_type: ColumnType
) -> tuple[datetime.date | None, datetime.date | None]:
    """The declared range of a date or time column: where its values are clipped when read, and the
    range its date_trunc buckets and extract() values are enumerated from as public GROUP BY keys
    (dpproxy.sql.public_keys). A date: that day. A timestamp: as written, or a date, read as the
    start of that day for `lower` and its end (23:59:59.999999) for `upper`, so that `upper:
    2013-12-31` keeps the whole last day. A timestamptz: with a UTC offset (kept as the instant, in
    UTC), or a date, that day in UTC."""
    bounds: dict[str, datetime.date | None] = {}
    for key in given:
        bounds[key] = _temporal_bound(entries[key], f"{path}.{key}", p, column_type, upper=key == "upper")
    return _bound_pair(entries, given, bounds, path, p, "later than")


def _temporal_bound(
    node: Node, path: str, p: Problems, column_type: ColumnType, *, upper: bool
) -> datetime.date | None:
    value: object = node.value
    if node.kind == "scalar" and isinstance(value, str):
        text = value.strip()
        try:
            value = (
                datetime.date.fromisoformat(text)
                if len(text) == 10
                else datetime.datetime.fromisoformat(text.replace(" ", "T", 1))
            )
        except ValueError:
            value = None
    if node.kind != "scalar" or not isinstance(value, datetime.date):
        example = "2013-12-31" if column_type is ColumnType.DATE else "2013-12-31 or 2013-12-31 23:59:59"
        p.add(
            node.line,
            path,
            f"expected a {column_type} bound, found {node.describe()}",
            f"write e.g. {example}",
        )
        return None
    if column_type is ColumnType.DATE:
        if isinstance(value, datetime.datetime):
            p.add(node.line, path, "expected a date, not a date and time", "write it as YYYY-MM-DD")
            return None
        return value
    wants_zone = column_type is ColumnType.TIMESTAMPTZ
    if not isinstance(value, datetime.datetime):
        day = datetime.datetime.combine(value, datetime.time.max if upper else datetime.time.min)
        return day.replace(tzinfo=datetime.UTC) if wants_zone else day
    if (value.tzinfo is not None) != wants_zone:
        example = "2013-12-31 23:59:59+00:00" if wants_zone else "2013-12-31 23:59:59"
        zone = "with a UTC offset" if wants_zone else "without a time zone"
        p.add(node.line, path, f"expected a timestamp {zone} (or a date)", f"write it like {example}")
        return None
    if wants_zone:
        try:
            return value.astimezone(datetime.UTC)
        except OverflowError:
            p.add(node.line, path, "is outside years 1 to 9999 in UTC", "use a bound within those years")
            return None
    return value


def _read_public_values(
    node: Node, path: str, p: Problems, column_type: ColumnType
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
        value = _read_public_value(item, item_path, p, column_type)
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


def _read_public_value(node: Node, path: str, p: Problems, column_type: ColumnType) -> object | None:
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
        value = read_integer(node, path, p)
        if value is None:
            return None
        low, high = INTEGER_RANGES[column_type]
        if not low <= value <= high:
            p.add(node.line, path, f"is outside the range of {column_type}", "remove it, or use a wider type")
            return None
        return value
    if column_type.is_fractional:
        return read_decimal(node, path, p)
    if column_type is ColumnType.BOOLEAN:
        return read_boolean(node, path, p)
    if column_type is ColumnType.DATE:
        value = _iso_value(node.value, datetime.date.fromisoformat)
        if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
            return value
        p.add(node.line, path, "expected a date", "write it as YYYY-MM-DD, e.g. 2024-01-31")
        return None
    value = _iso_value(node.value, datetime.datetime.fromisoformat)
    wants_zone = column_type is ColumnType.TIMESTAMPTZ
    if isinstance(value, datetime.datetime) and (value.tzinfo is not None) == wants_zone:
        return value
    example = "2024-01-31 08:00:00+00:00" if wants_zone else "2024-01-31 08:00:00"
    zone = "with a UTC offset" if wants_zone else "without a time zone"
    p.add(node.line, path, f"expected a timestamp {zone}", f"write it like {example}")
    return None


def _iso_value(value: object, parse: Callable[[str], datetime.date]) -> object:
    """A public value of a date or time column as YAML read it (a date or datetime already), or its
    text read by `parse` (None when that fails)."""
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError:
        return None


def _decimal_places(value: Decimal) -> int:
    exponent = value.normalize().as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0
