"""What the console's pages show, computed from the policy and the ledger: budgets over time and the
policy as the proxy sees it (the audit page's since/until filters are read by dpproxy.audit).

This module owns turning an analyst's ledger entries into a cumulative spending chart (ε-equivalent
after each charge, composed the way the ledger composes: dpproxy.budget.composition), drawn as SVG
geometry for the templates, and the read-only views of the policy.

It must never see data or a credential: the ledger holds costs and statement texts, the policy
bounds and limits; verifiers and md5 hashes are never copied into a view.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from dpproxy.budget import EntryStatus, Ledger
from dpproxy.budget.composition import Totals
from dpproxy.policy import DATASET, Policy, Refresh, TablePolicy
from dpproxy.policy.refresh import window_start
from dpproxy.privacy.accounting import Cost
from dpproxy.results import remaining_figure, spent_figure

HISTORY = 2000  # the newest entries per analyst the chart draws
WIDTH, HEIGHT = 560, 180  # the chart's drawing area (SVG user units)
LEFT, TOP, BOTTOM = 48, 12, 28  # margins for the axis labels


@dataclass(frozen=True)
class Chart:
    path: str  # the SVG polyline's points: cumulative ε-equivalent, a step per charge
    limit_y: float
    y_labels: tuple[tuple[float, str], ...]
    x_labels: tuple[tuple[float, str], ...]
    width: int = WIDTH + LEFT + 12
    height: int = HEIGHT + TOP + BOTTOM
    left: int = LEFT
    right: int = WIDTH + LEFT
    top: int = TOP
    bottom: int = HEIGHT + TOP
    charges: int = 0
    # Vertical marks within the chart's span: (x, what) for a budget reset or a refresh window's start.
    marks: tuple[tuple[float, str], ...] = ()


@dataclass(frozen=True)
class AnalystBudget:
    name: str
    spent: str  # ε-equivalent, rounded up
    remaining: str  # rounded down
    limit: float
    delta_spent: str
    delta_limit: float
    percent: float
    chart: Chart
    key: str = ""  # the section's id: the analyst's name, or "data-set"


def budgets(policy: Policy, ledger: Ledger, now: datetime | None = None) -> list[AnalystBudget]:
    """Every analyst of the policy: spent, remaining, and spending over time."""
    now = now or datetime.now(UTC)
    shown = []
    budgets: list[tuple[str, Cost, Refresh]] = [
        (a.name, Cost(a.epsilon, a.delta), a.refresh) for a in policy.analysts
    ]
    if policy.budget is not None:  # the data set's, all analysts together: no chart of its own
        budgets.append((DATASET, Cost(policy.budget.epsilon, policy.budget.delta), policy.budget.refresh))
    for name, limit, refresh in budgets:
        spent = ledger.spent_now(name, refresh)  # in the current refresh window
        totals = Totals(Decimal(spent.epsilon), Decimal(spent.delta), Decimal(spent.rho))
        worth = totals.worth(limit.delta)
        left = max(0.0, limit.epsilon - worth)
        opened = window_start(refresh, now)
        since = None if opened is None else datetime(opened.year, opened.month, opened.day, tzinfo=UTC)
        points = _spending(ledger, name, totals, limit, since) if name != DATASET else []
        marks = [(moment, "reset") for moment in _resets(ledger, name)]
        if since is not None:
            marks.append((since, f"{refresh} refresh"))
        shown.append(
            AnalystBudget(
                "all analysts (the data set's budget)" if name == DATASET else name,
                spent_figure(worth, limit.epsilon),
                remaining_figure(left, limit.epsilon),
                limit.epsilon,
                spent_figure(spent.delta, limit.delta),
                limit.delta,
                min(100.0, 100.0 * worth / limit.epsilon) if limit.epsilon else 0.0,
                chart(points, limit.epsilon, now, marks),
                "data-set" if name == DATASET else name,
            )
        )
    return shown


def _resets(ledger: Ledger, name: str) -> list[datetime]:
    """When the budget `name` was last reset by an operator (the audit log's operator records; a
    reset removes the entries before it, so only the last one bounds the chart)."""
    entries = ledger.audit_entries(analyst=name, kind="operator", limit=HISTORY)
    return [_aware(e.at) for e in entries if e.statement.startswith("budget reset")][:1]


def _spending(
    ledger: Ledger, analyst: str, totals: Totals, limit: Cost, since: datetime | None = None
) -> list[tuple[datetime, float]]:
    """(time, ε-equivalent spent just after it), oldest first; the first point is what was spent
    before the entries drawn (0 for an analyst whose whole history fits). With a refresh window
    opened at `since`, only the window's entries (what `totals` holds)."""
    points: list[tuple[datetime, float]] = []
    entries = [
        e
        for e in ledger.history(analyst, HISTORY)
        if e.status != EntryStatus.RELEASED and (since is None or _aware(e.created_at) >= since)
    ]
    for entry in entries:  # newest first: walk the totals back
        points.append((_aware(entry.created_at), totals.worth(limit.delta)))
        totals = totals.minus(entry.cost)
    if points:
        points.append((points[-1][0], max(0.0, totals.worth(limit.delta))))
    points.reverse()
    return points


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def chart(
    points: list[tuple[datetime, float]],
    limit: float,
    now: datetime,
    marks: list[tuple[datetime, str]] | None = None,
) -> Chart:
    """A step chart of cumulative spending from the first charge to `now`, against `limit`, with
    `marks` (resets, refreshes) drawn where they fall within that span."""
    top_value = max([limit, *(v for _, v in points)]) or 1.0
    marks = [(m, what) for m, what in marks or () if m <= now]
    # From the first charge, or from the reset or refresh before it (spending 0 until the charge).
    start = min([m for m, _ in marks] + ([points[0][0]] if points else [now]))
    span = max((now - start).total_seconds(), 1.0)

    def x(moment: datetime) -> float:
        return LEFT + WIDTH * (moment - start).total_seconds() / span

    def y(value: float) -> float:
        return TOP + HEIGHT * (1 - min(value, top_value) / top_value)

    coordinates: list[tuple[float, float]] = []
    previous = 0.0
    for moment, value in points:
        coordinates.append((x(moment), y(previous)))
        coordinates.append((x(moment), y(value)))
        previous = value
    coordinates.append((LEFT + WIDTH, y(previous)))
    if not points or coordinates[0][0] > LEFT:
        coordinates.insert(0, (LEFT, y(0.0)))
    path = " ".join(f"{a:.1f},{b:.1f}" for a, b in coordinates)
    y_labels = ((y(0.0), "0"), (y(limit), f"{limit:g}"))
    middle = start + (now - start) / 2
    # Times to the second over a short span (the labels would otherwise all read alike).
    shown = "%Y-%m-%d %H:%M" if span >= 3 * 3600 else "%Y-%m-%d %H:%M:%S"
    drawn = points or marks
    x_labels = tuple(
        (x(moment), moment.strftime(shown)) for moment in ((start, middle, now) if drawn else (now,))
    )
    shown_marks = tuple((x(m), what) for m, what in marks)
    return Chart(path, y(limit), y_labels, x_labels, charges=max(0, len(points) - 1), marks=shown_marks)


@dataclass(frozen=True)
class ColumnView:
    name: str
    type: str
    bounds: str
    public_values: str
    notes: str


@dataclass(frozen=True)
class TableView:
    name: str
    schema: str | None
    public: bool
    privacy_unit: str
    max_rows_per_unit: int
    max_groups_per_unit: int
    row_bounding: str
    notes: str
    columns: tuple[ColumnView, ...]


@dataclass(frozen=True)
class AnalystView:
    name: str
    epsilon: float
    delta: float
    max_epsilon_per_query: str
    logs_in: str  # which credentials exist (never their values)


def table_views(policy: Policy) -> list[TableView]:
    return [_table_view(t) for t in policy.tables]


def _unit_text(table: TablePolicy) -> str:
    """Who a protected table's rows belong to, as the tables page says it."""
    if table.unit_reference is not None:
        reference = table.unit_reference
        return f"{table.privacy_unit} (through {reference.table}.{reference.on})"
    return table.privacy_unit or "each row"


def _table_view(table: TablePolicy) -> TableView:
    columns = tuple(
        ColumnView(
            c.name,
            c.type.value,
            f"{c.lower} … {c.upper}" if c.bounded else "",
            ", ".join(str(v) for v in c.public_values) if c.public_values is not None else "",
            "; ".join(
                n
                for n in (
                    "the privacy unit" if c.name == table.privacy_unit else "",
                    "not summable" if not c.summable else "",
                    f"grid scale {c.scale}" if c.scale is not None else "",
                )
                if n
            ),
        )
        for c in table.columns
    )
    notes = "; ".join(
        n
        for n in (
            "unit_unique: vouched one row per person" if table.unit_unique else "",
            "randomized response for COUNT(DISTINCT unit)" if table.randomized_response else "",
            "null_units: each row without a unit is a person" if table.null_units == "each_a_person" else "",
            "columns read from the database" if table.public and not table.columns else "",
        )
        if n
    )
    return TableView(
        table.name,
        table.schema,
        table.public,
        "—" if table.public else _unit_text(table),
        table.max_rows_per_unit,
        table.max_groups_per_unit,
        table.row_bounding,
        notes,
        columns,
    )


def analyst_views(policy: Policy) -> list[AnalystView]:
    views = []
    for a in policy.analysts:
        credentials = [name for name, present in (("SCRAM", a.password), ("md5", a.md5_password)) if present]
        views.append(
            AnalystView(
                a.name,
                a.epsilon,
                a.delta,
                f"{a.max_epsilon_per_query:g}" if a.max_epsilon_per_query is not None else "policy default",
                ", ".join(credentials) or "CLI and Python API only",
            )
        )
    return views
