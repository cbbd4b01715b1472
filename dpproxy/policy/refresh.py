"""Refresh windows of a budget (`refresh:` on the data set's budget and on each analyst).

A budget with `refresh: daily | weekly | monthly` is spent afresh in each UTC calendar window: a day,
an ISO week (from Monday), a calendar month. What was spent in earlier windows stays in the ledger
and the audit log; only the current window's spending is compared with the budget. `never` (the
default) is one window for all time. The ledger keeps one total per budget and window, under the
key `account_key` gives (README, Policy reference; docs/privacy.md §6).

It reads only the clock it is given: the ledger passes the moment of each reservation.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from enum import StrEnum


class Refresh(StrEnum):
    NEVER = "never"
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"


REFRESHES = tuple(r.value for r in Refresh)

# The ledger key of the data set's budget (shared by every analyst); analysts' names are lowercase
# SQL identifiers, so neither it nor a window's "@" can be part of one.
DATASET = "*"


def window_start(refresh: Refresh, moment: datetime) -> date | None:
    """The first day of the UTC window holding `moment`, None for `never`."""
    day = moment.astimezone(UTC).date()
    if refresh is Refresh.DAILY:
        return day
    if refresh is Refresh.WEEKLY:
        return day - timedelta(days=day.weekday())
    if refresh is Refresh.MONTHLY:
        return day.replace(day=1)
    return None


def next_refresh(refresh: Refresh, moment: datetime) -> datetime | None:
    """When the window holding `moment` ends (the next refresh, UTC midnight), None for `never`."""
    start = window_start(refresh, moment)
    if start is None:
        return None
    if refresh is Refresh.DAILY:
        end = start + timedelta(days=1)
    elif refresh is Refresh.WEEKLY:
        end = start + timedelta(days=7)
    else:
        end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return datetime(end.year, end.month, end.day, tzinfo=UTC)


def account_key(name: str, refresh: Refresh, moment: datetime) -> str:
    """The ledger's key for the budget `name` (an analyst, or DATASET) in the window of `moment`:
    the name alone for `never` (as ledgers before windows keyed every analyst), else
    "name@first-day" (alice@2026-11-28)."""
    start = window_start(refresh, moment)
    return name if start is None else f"{name}@{start.isoformat()}"
