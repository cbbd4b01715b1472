"""The budget windows a ledger charges: which window a reservation falls in, and that window's
totals when the budget's refresh changed since the ledger last charged it.

A ledger keeps one total per budget and window (`account_key`: "alice", "alice@2026-11-28"). Two
things would make a window's total miss what was spent in it:
  - the refresh changed (a policy reload or a restart from daily to never, or back): the new key was
    never added to, and a daily budget of 1.0 spent that day let 1.0 more be spent at once;
  - the clock stepped back (NTP, a VM restored from a snapshot, hosts with different clocks on one
    ledger): a window already left, and spent, would be charged afresh.
So every reservation's moment is at least the newest entry's, and a window whose budget last
followed another refresh has its total rebuilt from the entries it holds (README, Policy reference:
refresh). Mixed into `Ledger`; every method runs under the caller's transaction and lock.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from dpproxy.budget.composition import Totals, exact_totals
from dpproxy.policy import DATASET, Refresh, account_key
from dpproxy.policy.refresh import window_start

log = logging.getLogger("dpproxy.budget")


def _up(value: Decimal) -> float:
    """The float nearest `value` from above (a cost entered must never be below what it stands for)."""
    near = float(value)
    return near if Decimal(near) >= value else math.nextafter(near, math.inf)


_SKEW = timedelta(minutes=5)  # a newest entry further ahead of the clock than this is logged

# The totals keys of one budget in every window: "name" and "name@…" (not "names", another's).
_KEYS_OF_NAME = "(analyst = ? OR substr(analyst, 1, ?) = ?)"


def _keys_of_name(name: str) -> tuple[str, int, str]:
    return name, len(name) + 1, name + "@"


class WindowTotals:
    """The window methods of `Ledger` (which provides the store's statements and conversions)."""

    def _sql(self, statement: str) -> str:
        raise NotImplementedError

    def _moment(self, stored: Any) -> datetime:
        raise NotImplementedError

    def _stamp(self, moment: datetime) -> Any:
        raise NotImplementedError

    def _totals(self, conn: Any, analyst: str) -> Totals:
        raise NotImplementedError

    def _write_totals(self, conn: Any, analyst: str, totals: Totals) -> None:
        raise NotImplementedError

    def _data_set_reset_line(self, conn: Any) -> int:
        raise NotImplementedError

    def _not_before_newest(self, conn: Any, now: datetime) -> datetime:
        """`now`, or the newest entry's moment if the clock reads earlier (an NTP step back, a VM
        restored from a snapshot, hosts with different clocks on one ledger): a window once left is
        never charged again, or stepping the clock back a day would open a spent day afresh."""
        row = conn.execute(self._sql("SELECT created_at FROM {entries} ORDER BY id DESC LIMIT 1")).fetchone()
        if row is None:
            return now
        newest = self._moment(row[0])
        newest = newest if newest.tzinfo is not None else newest.replace(tzinfo=UTC)
        if newest - now > _SKEW:  # conservative (windows do not refresh early), but say so
            log.warning(
                "ledger: the newest entry is stamped %s, ahead of this host's clock (%s): reservations "
                "are charged at that moment until the clock reaches it; check the clocks of the hosts "
                "sharing the ledger",
                newest.isoformat(timespec="seconds"),
                now.isoformat(timespec="seconds"),
            )
        return max(now, newest)

    def _window_totals(self, conn: Any, name: str, refresh: Refresh, now: datetime) -> Totals:
        """The totals of `name`'s window at `now`, true when its refresh changed (a reload, a restart
        under another policy) since the ledger last charged it: totals are kept per window key, so
        what was spent under another refresh (daily, then never) is not in the new key's. Then they
        are rebuilt from the window's entries and written, with the refresh they follow (kept if the
        caller's transaction commits: once per change); under the caller's lock. A data-set budget
        rebuilt so counts every entry since its last reset, those from before it existed included."""
        marker = f"refresh:{name}"
        key = account_key(name, refresh, now)
        row = conn.execute(self._sql("SELECT value FROM {meta} WHERE key = ?"), (marker,)).fetchone()
        if row is not None and row[0] == refresh.value:
            return self._totals(conn, key)
        keys = self._window_keys(conn, name)
        if row is None and (key in keys or not keys):
            # The first charge of `name`, or under a ledger from before refreshes were followed with
            # its key in use: its total is what it was, as a data-set budget a reload adds counts
            # spending from then on (README, Policy reload).
            self._set_meta(conn, marker, refresh.value)
            return self._totals(conn, key)
        start = window_start(refresh, now)
        where = ["status <> 'released'"]
        params: list[Any] = []
        if name == DATASET:  # every analyst's entries, since the last reset of the data set's budget
            where.append("id > ?")
            params.append(self._data_set_reset_line(conn))
        else:
            where.append("analyst = ?")
            params.append(name)
        if start is not None:
            where.append("created_at >= ?")
            params.append(self._stamp(datetime(start.year, start.month, start.day, tzinfo=UTC)))
        query = "SELECT epsilon, delta, rho FROM {entries} WHERE " + " AND ".join(where)
        totals = exact_totals(conn.execute(self._sql(query), tuple(params)).fetchall())
        self._write_totals(conn, key, totals)
        self._set_meta(conn, marker, refresh.value)
        return totals

    def _window_keys(self, conn: Any, name: str) -> set[str]:
        """The totals keys of `name` in every window ("name" and "name@…")."""
        query = "SELECT analyst FROM {totals} WHERE " + _KEYS_OF_NAME
        return {k for (k,) in conn.execute(self._sql(query), _keys_of_name(name)).fetchall()}

    def _delete_totals(self, conn: Any, name: str) -> None:
        """Delete the totals of `name` in every window."""
        conn.execute(self._sql("DELETE FROM {totals} WHERE " + _KEYS_OF_NAME), _keys_of_name(name))

    def _set_meta(self, conn: Any, key: str, value: str) -> None:
        conn.execute(
            self._sql(
                "INSERT INTO {meta} (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
            ),
            (key, value),
        )

    def _keep_reset_costs(self, conn: Any, now: Any) -> None:
        """Migration to schema 6: before it, an analyst's reset deleted their entries while the data
        set's lifetime total kept their cost, so a total rebuilt from the entries would miss it.
        What the total holds beyond the entries since the data set's last reset is entered once, as
        committed entries of RESET_ENTRIES stamped `now`, the migration's moment: a window rebuilt
        later counts them if it holds that moment (perhaps more than it spent, never less)."""
        from dpproxy.budget.ledger import RESET_ENTRIES

        stored = self._totals(conn, DATASET)
        rows = conn.execute(
            self._sql("SELECT epsilon, delta, rho FROM {entries} WHERE status <> 'released' AND id > ?"),
            (self._data_set_reset_line(conn),),
        ).fetchall()
        counted = exact_totals(rows)
        epsilon, delta, rho = (
            _up(max(Decimal(0), getattr(stored, part) - getattr(counted, part)))
            for part in ("epsilon", "delta", "rho")
        )
        insert = (
            "INSERT INTO {entries} (analyst, epsilon, delta, rho, status, statement, created_at) "
            "VALUES (?, ?, ?, ?, 'committed', 'spent by analysts reset before schema 6', ?)"
        )
        for cost in ((epsilon, delta, 0.0), (0.0, 0.0, rho)):
            if any(cost):
                conn.execute(self._sql(insert), (RESET_ENTRIES, *cost, now))
