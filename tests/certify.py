"""The sensitivity certificate shared by the certificate tests: one plan, D and each neighbour."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import duckdb

from dpproxy.engine import Plan
from dpproxy.policy import Policy, parse_policy
from dpproxy.release import ExactGroups
from dpproxy.release.aggregates import fine_components
from dpproxy.release.exact import Candidates, holding_persons
from dpproxy.sql.bounds import distinct_bounds
from dpproxy.sql.query import FINE, ComponentKind
from dpproxy.sql.rewrite.row_pipeline import histogram_rows

# Runs one statement on D (without=None) or on D minus one person.
Runner = Callable[[str, "int | None"], Sequence[tuple]]


def measure(plan: Plan, run: Runner, without: int | None = None) -> ExactGroups:
    return plan.measure(*(run(sql, without) for sql in plan.statements))


def at_ceilings(plan: Plan, measured: ExactGroups) -> ExactGroups:
    """The true values as a test compares them with raw SQL: with bounds chosen per query, those at
    the policy's ceilings (the last candidates) and each component on its own grid (the fine grid's
    divided by FINE: an int when whole, else a float); with fixed limits, as measured, on its own
    grid too."""
    query = plan.query
    fine = fine_components(query)
    if measured.candidates is None:
        resolved = measured  # fixed limits: the values measured, their scaled components on the fine grid
    else:
        assert query.bounds is not None
        resolved = measured.resolve(query, -1, -1 if query.bounds.groups else None)

    def own(value: int) -> int | float:
        whole, part = divmod(value, FINE)
        return whole if part == 0 else value / FINE

    components = [[own(v) if i in fine else v for i, v in enumerate(row)] for row in resolved.components]
    return ExactGroups(resolved.keys, components, resolved.units, resolved.histograms)  # type: ignore[arg-type]


def certification_duckdb() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB for the databases certificates run on: one thread. Their tables hold a few
    hundred rows and pytest-xdist gives each worker a core; DuckDB's pool of a thread per core only
    added scheduling (a language chunk ran 9% faster on one)."""
    return duckdb.connect(config={"threads": 1})


class NeighbourReader:
    """A second connection to a certification DuckDB, for reading its neighbours (D minus a person,
    deleted inside this connection's transaction, which D's connection never sees): DuckDB's
    optimizer off, and each statement prepared once and executed for every neighbour. On tables this
    small, binding and optimizing the rewritten SQL was nearly all of a run (~11 of ~11.5 ms), and a
    certificate runs each statement once per person; a language chunk took 30% less time. D is still
    read with the optimizer on, as users' DuckDB reads it (so a certificate also compares D's
    optimized answer with its neighbours' unoptimized ones).

    Unoptimized, DuckDB also evaluates what its optimizer prunes or reorders: a cast that fails in a
    column nobody reads, a conjunct before the one that guards it. Such an error is the optimizer's
    absence, not the neighbour's: a read that fails is made again `optimized()`, as users' DuckDB
    makes it, and only that read's error stands (`rows_without`, tests/sql/language/databases.py)."""

    # The most statements kept prepared (all dropped beyond).
    PREPARED = 32

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self.conn = conn.cursor()
        self.conn.execute("PRAGMA disable_optimizer")
        # A cursor is a session of its own: it reads times in D's connection's time zone too.
        (zone,) = conn.execute("SELECT current_setting('TimeZone')").fetchone()  # type: ignore[misc]
        self.conn.execute("SET TimeZone = ?", [zone])
        self._prepared: dict[str, str] = {}
        self._names = itertools.count()

    def rows(self, sql: str) -> list[tuple]:
        """The rows of `sql`, prepared on the first call for this text."""
        name = self._prepared.get(sql)
        if name is None:
            if len(self._prepared) >= self.PREPARED:
                self.forget()
            name = f"neighbour_{next(self._names)}"
            self.conn.execute(f"PREPARE {name} AS {sql}")
            self._prepared[sql] = name
        return self.conn.execute(f"EXECUTE {name}").fetchall()

    @contextlib.contextmanager
    def optimized(self) -> Iterator[None]:
        """The optimizer on within (entered and left outside a transaction: an aborted one refuses
        even a PRAGMA)."""
        self.conn.execute("PRAGMA enable_optimizer")
        try:
            yield
        finally:
            self.conn.execute("PRAGMA disable_optimizer")

    def forget(self) -> None:
        """Drop the prepared statements (their tables are about to be replaced)."""
        for name in self._prepared.values():
            self.conn.execute(f"DEALLOCATE {name}")
        self._prepared.clear()


def insert_rows(conn, kind: str, table: str, rows: Sequence[tuple]) -> None:
    """INSERT `rows` into `table` on a raw PostgreSQL (psycopg's executemany) or DuckDB connection
    (one statement of them all: DuckDB's executemany runs a statement a row, ~0.8 ms each, most of
    the time a certificate's example took to load its table)."""
    if not rows:
        return
    width = len(rows[0])
    if kind == "postgres":
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * width)})", rows)
        return
    tuples = ", ".join([f"({', '.join(['?'] * width)})"] * len(rows))
    conn.execute(f"INSERT INTO {table} VALUES {tuples}", [value for row in rows for value in row])


def rows_without(
    conn, reader: NeighbourReader | None, deletes: Sequence[tuple[str, object]], sql: str
) -> list[tuple]:
    """The rows of `sql` on a neighbour: `deletes` (DELETE statements, each with one parameter mark
    of its engine, and its value) run first, inside a transaction rolled back after. PostgreSQL
    (`reader` None): on the psycopg connection `conn`; DuckDB: on `reader`."""
    if reader is None:
        with conn.transaction(force_rollback=True):
            for delete, value in deletes:
                conn.execute(delete, (value,))
            return conn.execute(sql).fetchall()

    def read(rows: Callable[[str], list[tuple]]) -> list[tuple]:
        reader.conn.execute("BEGIN")
        try:
            for delete, value in deletes:
                reader.conn.execute(delete, [value])
            return rows(sql)
        finally:
            reader.conn.execute("ROLLBACK")

    try:
        return read(reader.rows)
    except duckdb.Error:  # made again as users' DuckDB makes it (NeighbourReader)
        with reader.optimized():
            return read(lambda sql: reader.conn.execute(sql).fetchall())


@functools.cache
def cached_policy(text: str) -> Policy:
    """parse_policy(text), once per text: property tests build the same few policy texts for every
    example, and parsing took a tenth of their time (a Policy is frozen, so sharing it is safe)."""
    return parse_policy(text)


def _moved(p: Sequence[int], q: Sequence[int]) -> int:
    """The L1 distance of two histograms of the same bins (0 at once when equal, as most are: one
    person is in few groups)."""
    if p == q:
        return 0
    return sum(abs(x - y) for x, y in zip(p, q, strict=True))


def by_key(m: ExactGroups) -> dict[tuple, tuple[list[int], int, list[list[int]]]]:
    histograms = m.histograms or [[] for _ in m.keys]
    return {k: (c, u, h) for k, c, u, h in zip(m.keys, m.components, m.units, histograms, strict=True)}


def certify(plan: Plan, run: Runner, persons: int | Iterable[int]) -> None:
    """See `certify_fixed`; with bounds chosen per query, `certify_candidates`. The count of groups
    holding persons (release.left_out) is noised for g, the most groups a person is counted in
    there, which both check a person moves by at most g."""
    hidden = plan.noise.hidden
    if hidden is not None:
        bounds = plan.query.bounds
        g = bounds.groups[-1] if plan.chooses_bounds and bounds and bounds.groups else plan.query.max_groups
        assert (hidden.sensitivity, hidden.max_groups) == (g, 1), (plan.query.text, hidden)
    if plan.chooses_bounds:
        certify_candidates(plan, run, persons)
    else:
        certify_fixed(plan, run, persons)


def certify_candidates(plan: Plan, run: Runner, persons: int | Iterable[int]) -> None:
    """With bounds chosen per query, every candidate's values (ExactGroups.candidates, on the fine
    grid: FINE times the component's): a component at candidate k moves by at most FINE times its
    sensitivity for min(k, row ceiling) rows in one group and for k rows over all groups (L1); each count of persons per candidate (above, wider, persons) by at most
    1 in all; the units counted at candidate g by at most 1 per group, in at most g groups; no person
    changes the counts of units or the row pipeline's values in more groups than the group ceiling
    (the scaled values may move in all of a person's groups, within k rows' worth in all); the row
    pipeline as with fixed limits."""
    query = plan.query
    bounds = query.bounds
    assert bounds is not None
    measured = measure(plan, run)
    full = _candidates_by_key(measured)
    spelled = {key: repr(key) for key in measured.keys}
    assert measured.candidates is not None
    empty_row = (
        [[0] * len(bounds.rows) for _ in query.components],
        [0] * len(bounds.groups),
        [0] * len(query.components),
        [[0] * h.candidates for h in query.histograms],
    )
    for unit in range(persons) if isinstance(persons, int) else persons:
        neighbour_measured = measure(plan, run, unit)
        assert neighbour_measured.candidates is not None
        neighbour = _candidates_by_key(neighbour_measured)
        for key in neighbour_measured.keys:
            assert key not in spelled or spelled[key] == repr(key), (query.text, "key spelling", key)
        a_found, b_found = measured.candidates, neighbour_measured.candidates
        for name, a, b in (
            ("above", a_found.above, b_found.above),
            ("wider", a_found.wider, b_found.wider),
            ("persons", [a_found.persons], [b_found.persons]),
        ):
            for j, (x, y) in enumerate(zip(a, b, strict=True)):
                assert abs(x - y) <= 1, (query.text, unit, name, j, x, y)
        _certify_removed(plan, a_found, b_found, unit)
        l1 = [[0] * len(bounds.rows) for _ in query.components]
        units_changed = [0] * len(bounds.groups)
        changed = 0
        for key in set(full) | set(neighbour):
            (ca, ua, xa, ha), (cb, ub, xb, hb) = full.get(key, empty_row), neighbour.get(key, empty_row)
            moved = False
            for i, component in enumerate(query.components):
                if component.kind.row_pipeline:
                    delta = abs(xa[i] - xb[i])
                    assert delta <= component.sensitivity(bounds.row_cap), (query.text, key, i, delta)
                    moved = moved or delta > 0
                    continue
                if component.kind.name == "UNITS":
                    continue  # read from the units per candidate g, checked below
                for j, k in enumerate(bounds.rows):
                    # A scaled value may move in every group the person has: what bounds it is k
                    # rows' worth in all (l1, below) and min(k, r̄) rows' worth in one group.
                    delta = abs(ca[i][j] - cb[i][j])
                    per_group = FINE * component.sensitivity(min(k, bounds.row_cap))  # the fine grid
                    assert delta <= per_group, (query.text, key, i, k, delta, per_group)
                    l1[i][j] += delta
            for j, (x, y) in enumerate(zip(ua, ub, strict=True)):
                assert abs(x - y) <= 1, (query.text, key, "units", j, x, y)
                if x != y:
                    units_changed[j] += 1
                    moved = True
            moved_histograms = [_moved(p, q) for p, q in zip(ha, hb, strict=True)]
            for h, histogram_moved in enumerate(moved_histograms):
                assert histogram_moved <= query.max_rows, (query.text, key, "histogram", h, histogram_moved)
            if moved or any(moved_histograms):
                changed += 1
        assert changed <= max(bounds.group_cap, query.max_groups), (query.text, unit, changed)
        _certify_carried(plan, measured, neighbour_measured, unit)
        _certify_histograms_per_candidate(plan, measured, neighbour_measured, unit)
        for j, g in enumerate(bounds.groups):
            assert units_changed[j] <= g, (query.text, unit, "units in groups", g, units_changed[j])
            # The groups holding a person counted at g (ExactGroups.present, release.left_out), and
            # the noise planned for them at that g.
            present = [holding_persons(m.units_at(j)) for m in (measured, neighbour_measured)]
            assert abs(present[0] - present[1]) <= g, (query.text, unit, "groups holding persons", g, present)
            hidden = plan.noise_at(len(bounds.rows) - 1, j).hidden
            assert hidden is None or hidden.sensitivity == g, (query.text, g, hidden)
        for i, component in enumerate(query.components):
            if component.kind.row_pipeline or component.kind.name == "UNITS":
                continue
            for j, k in enumerate(bounds.rows):
                assert l1[i][j] <= FINE * component.sensitivity(k), (query.text, unit, i, k, l1[i][j])


def _certify_removed(plan: Plan, a: Candidates, b: Candidates, unit: int) -> None:
    """What bounding removed (dpproxy.release.left_out), when the plan estimates it: at every
    candidate k_j the pair (removed_j, kept_j = reach − removed_j) moves by at most the ceiling in
    all (L1), the sensitivity its noise is planned for; never negative, and removed_j is 0 at the
    ceiling."""
    estimate = plan.noise.estimate
    bounds = plan.query.bounds
    assert bounds is not None
    if estimate is None:
        assert not a.excess and not b.excess, (plan.query.text, "removed counted but not planned")
        return
    assert estimate.sensitivity == bounds.row_cap and estimate.max_groups == 1, plan.query.text
    assert len(a.excess) == len(b.excess) == len(bounds.rows), (plan.query.text, a.excess, b.excess)
    for j, k in enumerate(bounds.rows):
        for found in (a, b):
            assert 0 <= found.excess[j] <= found.reach, (plan.query.text, unit, k, found.excess, found.reach)
            assert k < bounds.row_cap or found.excess[j] == 0, (plan.query.text, k, found.excess[j])
        moved = abs(a.excess[j] - b.excess[j]) + abs((a.reach - a.excess[j]) - (b.reach - b.excess[j]))
        assert moved <= bounds.row_cap, (plan.query.text, unit, "removed and kept", k, moved)


def _certify_carried(plan: Plan, a: ExactGroups, b: ExactGroups, unit: int) -> None:
    """COUNT(DISTINCT x) per person at every candidate ℓ (ExactGroups.carried): each such aggregate's
    counts of all groups together move by at most ℓ (L1) when one person goes (each is noised on its
    own), and all of them together by at most weight·ℓ, the sensitivity of the choice of ℓ
    (privacy/bounds.distinct_choice: the sum over the groups and the query's COUNT(DISTINCT …)s)."""
    caps = distinct_bounds(plan.query)
    empty = [0] * len(caps)

    def by_key(m: ExactGroups) -> dict[tuple[tuple, int], list[int]]:
        return {(m.keys[g], i): counts for (g, i), counts in m.carried.items()}

    full, neighbour = by_key(a), by_key(b)
    l1: dict[int, list[int]] = {}
    for key in set(full) | set(neighbour):
        moved = l1.setdefault(key[1], [0] * len(caps))
        for j, (x, y) in enumerate(zip(full.get(key, empty), neighbour.get(key, empty), strict=True)):
            assert abs(x - y) <= caps[j], (plan.query.text, unit, key, caps[j], x, y)
            moved[j] += abs(x - y)
    weight = sum(1 for c in plan.query.components if c.kind is ComponentKind.DISTINCT_VALUES)
    for j, cap in enumerate(caps):
        for i, moved in l1.items():
            assert moved[j] <= cap, (plan.query.text, unit, "COUNT(DISTINCT) component", i, cap, moved[j])
        total = sum(moved[j] for moved in l1.values())
        assert total <= weight * cap, (plan.query.text, unit, "all COUNT(DISTINCT)s", weight, cap, total)


def _certify_histograms_per_candidate(plan: Plan, a: ExactGroups, b: ExactGroups, unit: int) -> None:
    """At every pair of candidates (k, g) the histograms count (row_pipeline.histogram_rows), each
    histogram of a group moves by at most k counts (L1 over its bins: a person keeps k of their rows
    in a group), in at most g groups (the ceiling when g is not chosen there)."""
    query = plan.query
    ranks = histogram_rows(query)
    if ranks is None:
        return
    assert query.bounds is not None
    g_indexes: list[int | None] = list(range(len(ranks.groups))) if ranks.groups else [None]
    ceiling_g = -1 if query.bounds.groups else None  # the units' candidate g when not a pair's

    def at(m: ExactGroups, j: int, i: int | None) -> ExactGroups:
        return m.resolve(query, j, ceiling_g if i is None else i)

    # Not vacuous: at the ceilings, the histograms are those measured; fewer rows or groups, fewer counts.
    assert at(a, -1, g_indexes[-1]).histograms == a.histograms, query.text
    totals = {
        (j, i): [sum(map(sum, histograms)) for histograms in at(a, j, i).histograms]
        for j in range(len(ranks.rows))
        for i in g_indexes
    }
    for (j, i), total in totals.items():
        for smaller in ((j - 1, i), (j, i - 1) if i is not None else (j - 1, i)):
            if smaller in totals:
                assert all(x <= y for x, y in zip(totals[smaller], total, strict=True)), query.text
    for j, i in totals:
        k, g = ranks.at(j, i)
        at_a, at_b = by_key(at(a, j, i)), by_key(at(b, j, i))
        empty = [[0] * h.candidates for h in query.histograms]
        changed = 0
        for key in set(at_a) | set(at_b):
            ha, hb = at_a[key][2] if key in at_a else empty, at_b[key][2] if key in at_b else empty
            for h, (p, q) in enumerate(zip(ha, hb, strict=True)):
                moved = _moved(p, q)
                assert moved <= k, (query.text, unit, key, "histogram", h, "at k", k, moved)
            changed += ha != hb
        most = g if g is not None else query.max_groups
        assert changed <= most, (query.text, unit, "histogram groups at k, g", k, g, changed)


def _candidates_by_key(
    m: ExactGroups,
) -> dict[tuple, tuple[list[list[int]], list[int], list[int], list[list[int]]]]:
    assert m.candidates is not None
    histograms = m.histograms or [[] for _ in m.keys]
    return {
        k: (c, u, x, h)
        for k, c, u, x, h in zip(
            m.keys, m.candidates.components, m.candidates.units, m.components, histograms, strict=True
        )
    }


def certify_fixed(plan: Plan, run: Runner, persons: int | Iterable[int]) -> None:
    """Every released value moves by at most its sensitivity when one person is removed; over the
    query's groups by at most max_groups × that (L1); no person changes more than max_groups groups;
    each histogram of a group moves by at most max_rows counts (L1 over its candidates); a group key
    is spelled the same on both (the spelling is released, with no noise).

    `persons`: the persons to remove one at a time (a count n means persons 0…n−1)."""
    measured = measure(plan, run)
    full = by_key(measured)
    spelled = {key: repr(key) for key in measured.keys}
    fine = fine_components(plan.query)  # measured on the fine grid: FINE times their own
    sensitivities = [FINE * s if i in fine else s for i, s in enumerate(plan.sensitivities)]
    g, r = plan.query.max_groups, plan.query.max_rows
    empty = ([0] * len(sensitivities), 0, [[0] * h.candidates for h in plan.query.histograms])
    for unit in range(persons) if isinstance(persons, int) else persons:
        measured_neighbour = measure(plan, run, unit)
        neighbour = by_key(measured_neighbour)
        for key in measured_neighbour.keys:
            # Equal keys must be spelled alike (-0.0 and 0.0 are equal, and printed differently).
            assert key not in spelled or spelled[key] == repr(key), (plan.query.text, "key spelling", key)
        l1 = [0] * len(sensitivities)
        changed = 0
        for key in set(full) | set(neighbour):
            (a, units_a, hist_a), (b, units_b, hist_b) = full.get(key, empty), neighbour.get(key, empty)
            hist_a = hist_a or empty[2]
            hist_b = hist_b or empty[2]
            assert abs(units_a - units_b) <= 1, (plan.query.text, key, "unit count moved by more than 1")
            moved_histograms = [_moved(ha, hb) for ha, hb in zip(hist_a, hist_b, strict=True)]
            if a != b or units_a != units_b or any(moved_histograms):
                changed += 1
            for i, sensitivity in enumerate(sensitivities):
                delta = abs(a[i] - b[i])
                assert delta <= sensitivity, (plan.query.text, key, i, delta, sensitivity)
                l1[i] += delta
            for h, moved in enumerate(moved_histograms):
                assert moved <= r, (plan.query.text, key, "histogram", h, moved, r)
        assert changed <= g, (plan.query.text, unit, changed, g)
        present = [holding_persons(m.units) for m in (measured, measured_neighbour)]  # release.left_out
        assert abs(present[0] - present[1]) <= g, (plan.query.text, unit, "groups holding persons", present)
        _certify_carried(plan, measured, measured_neighbour, unit)
        for i, sensitivity in enumerate(sensitivities):
            assert l1[i] <= g * sensitivity, (plan.query.text, i, l1[i], g, sensitivity)


def runner(kind: str, conn) -> Runner:  # type: ignore[no-untyped-def]
    """Rows of a statement on D, or on D minus person `without` (deleted from table t by pid inside a
    rolled-back transaction, `rows_without`), on a raw DuckDB or PostgreSQL connection whose table
    stays as it is while the runner is used."""
    reader = NeighbourReader(conn) if kind == "duckdb" else None
    delete = f"DELETE FROM t WHERE pid = {'%s' if kind == 'postgres' else '?'}"

    def run(sql: str, without: int | None = None) -> list[tuple]:
        if without is None:
            return conn.execute(sql).fetchall()
        return rows_without(conn, reader, [(delete, without)], sql)

    return run
