"""date_trunc buckets and extract fields as PostgreSQL computes them (weeks start on Monday, `dow`
counts from Sunday = 0), over naive datetimes: what the public keys of a declared date range are
enumerated from (dpproxy.sql.public_keys), and what constant date_trunc calls are folded with
(dpproxy.sql.clock). Only the policy's ranges and the query's constants are read here."""

from __future__ import annotations

import datetime as dt

from dpproxy.errors import NotSupported

_TRUNC = ("microseconds", "milliseconds", "second", "minute", "hour", "day", "week", "month", "quarter")
_TRUNC += ("year", "decade", "century", "millennium")


def truncate(moment: dt.datetime, unit: str) -> dt.datetime:
    """date_trunc(unit, moment) as PostgreSQL computes it (weeks start on Monday); 0A000 for a
    unit PostgreSQL does not have."""
    if unit not in _TRUNC:
        raise NotSupported(
            f"date_trunc unit {unit!r} is not recognised", hint=f"use one of {', '.join(_TRUNC)}"
        )
    if unit == "microseconds":
        return moment
    if unit == "milliseconds":
        return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    moment = moment.replace(microsecond=0)
    for name, field in (("second", "second"), ("minute", "minute"), ("hour", "hour")):
        if unit == name:
            return moment
        moment = moment.replace(**{field: 0})
    if unit == "day":
        return moment
    if unit == "week":
        return moment - dt.timedelta(days=moment.weekday())
    if unit == "month":
        return moment.replace(day=1)
    if unit == "quarter":
        return moment.replace(month=(moment.month - 1) // 3 * 3 + 1, day=1)
    year = moment.year
    start = {"year": year, "decade": year - year % 10}
    start["century"] = (year - 1) // 100 * 100 + 1
    start["millennium"] = (year - 1) // 1000 * 1000 + 1
    return moment.replace(year=start[unit], month=1, day=1)


def following(t: dt.datetime, unit: str) -> dt.datetime | None:
    """The bucket after `t` (a bucket start); None past year 9999."""
    try:
        if unit in ("year", "quarter", "month"):
            months = {"year": 12, "quarter": 3, "month": 1}[unit]
            index = t.year * 12 + t.month - 1 + months
            return t.replace(year=index // 12, month=index % 12 + 1)
        step = {
            "week": dt.timedelta(days=7),
            "day": dt.timedelta(days=1),
            "hour": dt.timedelta(hours=1),
            "minute": dt.timedelta(minutes=1),
            "second": dt.timedelta(seconds=1),
        }[unit]
        return t + step
    except (OverflowError, ValueError):
        return None


def bucket_count(start: dt.datetime, last: dt.datetime, unit: str) -> int:
    """How many buckets of `unit` run from `start` (a bucket start) to the one holding `last`: what
    enumerating them with `following` yields, counted without walking them."""
    if last < start:
        return 0
    if unit in ("year", "quarter", "month"):
        months = {"year": 12, "quarter": 3, "month": 1}[unit]
        return ((last.year - start.year) * 12 + last.month - start.month) // months + 1
    step = {"week": 604_800, "day": 86_400, "hour": 3_600, "minute": 60, "second": 1}[unit]
    return int((last - start).total_seconds()) // step + 1


# Past this many days, every value of a field that repeats within the year (or the week) occurs:
# 54 years hold a leap day and an ISO year of 53 weeks several times over.
_ALL_CYCLIC = 20_000
_CYCLES = {
    "quarter": range(1, 5),
    "month": range(1, 13),
    "week": range(1, 54),
    "day": range(1, 32),
    "doy": range(1, 367),
    "dow": range(0, 7),
    "isodow": range(1, 8),
}


def field_value(day: dt.date, field: str) -> int:
    if field == "year":
        return day.year
    if field == "isoyear":
        return day.isocalendar()[0]
    if field == "quarter":
        return (day.month - 1) // 3 + 1
    if field == "month":
        return day.month
    if field == "week":
        return day.isocalendar()[1]
    if field == "day":
        return day.day
    if field == "doy":
        return day.timetuple().tm_yday
    if field == "dow":
        return day.isoweekday() % 7  # Sunday is 0
    return day.isoweekday()  # isodow: Monday 1 … Sunday 7


def extracted(field: str, lo: dt.datetime, hi: dt.datetime, limit: int) -> set[int] | None:
    """extract(field FROM x) over x in [lo, hi] (naive UTC); None when a year field would take more
    than `limit` values."""
    if field in ("hour", "minute"):
        step = dt.timedelta(hours=1) if field == "hour" else dt.timedelta(minutes=1)
        cycle = 24 if field == "hour" else 60
        if hi - lo >= step * cycle:
            return set(range(cycle))
        found, current = set(), truncate(lo, field)
        while current <= hi:
            found.add(current.hour if field == "hour" else current.minute)
            current += step
        return found
    first, last = lo.date(), hi.date()
    if field == "year":
        return set(range(first.year, last.year + 1)) if last.year - first.year < limit else None
    if field == "isoyear":
        a, b = first.isocalendar()[0], last.isocalendar()[0]
        return set(range(a, b + 1)) if b - a < limit else None
    days = (last - first).days + 1
    if days > _ALL_CYCLIC:
        return set(_CYCLES[field])
    return {field_value(first + dt.timedelta(days=i), field) for i in range(days)}
