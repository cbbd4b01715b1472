"""`dpproxy explain`: a plan made readable — the SQL after each rewrite pass, the sensitivity, noise
and ± error of every released value, and the cost. Built without touching data or budget."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpproxy.policy import Mechanism
from dpproxy.privacy import (
    Cost,
    QuantileSpec,
)
from dpproxy.privacy.bounds import CAPPED_SHARE, DistinctChoice
from dpproxy.release import (
    selectors,
)
from dpproxy.release.aggregates import fine_components
from dpproxy.release.bounds import families
from dpproxy.results import format_number
from dpproxy.sql.bounds import component_bounds
from dpproxy.sql.numbers import emit
from dpproxy.sql.query import FINE, PrivateQuery

if TYPE_CHECKING:
    from dpproxy.engine.plan import Plan


@dataclass(frozen=True)
class Explanation:
    text: str  # the statement as analyzed
    kind: str  # "private", "public" or "constant"
    steps: tuple[tuple[str, str, str], ...] = ()  # (pass, summary, SQL after it)
    final_sql: str = ""
    released: tuple[tuple[str, int, int, float, float], ...] = ()  # (component, sensitivity, g, scale, ±95%)
    selection: str | None = None
    cost: Cost = Cost.ZERO
    outputs: tuple[tuple[str, str], ...] = ()  # (name, type)
    auxiliary: tuple[tuple[str, str, str], ...] = ()  # the row pipeline's statements
    choices: tuple[str, ...] = ()  # releases by the exponential mechanism
    subqueries: str | None = None  # how subqueries over public tables were answered, if any
    target: str | None = None  # accuracy first: the target and the ε it costs (dpproxy.engine.accuracy)
    clipping: str | None = None  # value ranges chosen per query (dpproxy.engine.clipping)

    def render(self) -> str:
        lines = [f"query: {self.text}", f"kind: {self.kind}"]
        if self.target:
            lines.append(f"accuracy: {self.target}")
        if self.subqueries:
            lines.append(f"subqueries: {self.subqueries}")
        if self.clipping:
            lines.append(f"value ranges: {self.clipping}")
        for i, (name, summary, sql) in enumerate(self.steps, 1):
            lines += ["", f"-- pass {i}: {name} — {summary}", sql]
        if self.final_sql:
            lines += ["", "-- final SQL sent to the backend", self.final_sql]
        elif self.auxiliary:
            lines += ["", "-- no per-person sums statement: every value comes from the row pipeline"]
        for name, summary, sql in self.auxiliary:
            lines += ["", f"-- row pipeline, {name}: {summary}", sql]
        if self.released:
            lines += ["", "released values (per group; sensitivity and noise in grid units):"]
            for name, sensitivity, groups, scale, error in self.released:
                lines.append(
                    f"  {name}: sensitivity {sensitivity} per group, ≤ {groups} group(s) per unit, "
                    f"noise scale {scale:.6g}, ±{error:.6g} at 95%"
                )
        if self.choices:
            lines += ["", "chosen by the exponential mechanism:", *(f"  {c}" for c in self.choices)]
        if self.selection:
            lines += ["", f"partition selection: {self.selection}"]
        lines += ["", f"cost: ε={format_number(self.cost.epsilon)}, δ={format_number(self.cost.delta)}"]
        if self.outputs:
            lines.append("result columns: " + ", ".join(f"{n} {t}" for n, t in self.outputs))
        return "\n".join(lines)


def explain_plan(plan: Plan, dialect: str) -> Explanation:
    """What a private plan runs and releases, without data or budget: the SQL after each rewrite
    pass, every released value's sensitivity, noise scale and ± error, the exponential-mechanism
    choices, partition selection and the cost."""
    query = plan.query
    steps = tuple(
        (step.name, step.summary, emit(plan.rewrite.query(i), dialect, owned=True, pretty=True))
        for i, step in enumerate(plan.rewrite.steps)
    )
    if plan.responses is not None:
        tally = plan.responses.tally_noise
        released: tuple[tuple[str, int, int, float, float], ...] = (
            (
                "tallies of reported ones and of reported zeros (randomized response: each person "
                "reports the WHERE condition truthfully with probability 3/4)",
                1,
                query.max_groups,
                tally.scale,
                tally.error95(),
            ),
        )
    else:
        # Components noised on the fine grid (bounds chosen per query) are shown in their own grid's
        # units, as they are released.
        fine = fine_components(query)
        released = tuple(
            (
                c.kind.value + (f"({c.argument.sql('postgres')})" if c.argument is not None else ""),
                sensitivity // FINE if i in fine else sensitivity,
                groups,
                spec.scale / FINE if i in fine else spec.scale,
                spec.error95() / FINE if i in fine else spec.error95(),
            )
            for i, (c, (sensitivity, groups), spec) in enumerate(
                zip(query.components, component_bounds(query, -1, -1), plan.noise.columns, strict=True)
            )
        )
    for spec, name in (  # SET dpproxy.estimate_left_out (dpproxy.release.left_out)
        (
            plan.noise.estimate,
            "what bounding removed: the rows' worth k takes below the ceiling and what it keeps (a "
            "pair that one person moves by at most the ceiling in all; SET dpproxy.estimate_left_out)",
        ),
        (
            plan.noise.hidden,
            "the groups that hold persons, beside those partition selection releases (a person is "
            "counted in at most g of them; SET dpproxy.estimate_left_out)",
        ),
    ):
        if spec is not None:
            released += ((name, spec.sensitivity, 1, spec.scale, spec.error95()),)
    selection = None
    if plan.noise.selection is not None:
        s = plan.noise.selection
        laplace = s.mechanism == Mechanism.LAPLACE
        noise = f"Laplace scale {s.scale:.6g}" if laplace else f"Gaussian σ {s.scale:.6g}"
        spent = f"ε={format_number(s.epsilon)}" if s.epsilon else f"ρ={format_number(s.rho)}"
        selection = (
            f"a group is released when its noisy count of units reaches {s.threshold} "
            f"({noise}; {spent}, δ={format_number(s.delta)})"
        )
    elif query.keys:
        selection = (
            "all keys are public: every combination of their declared values is released (zero-filled)"
        )
    origins = [k.origin for k in query.keys if k.origin]  # keys from public tables and date ranges
    if origins:
        selection = "; ".join([selection, *origins] if selection else origins)
    chosen = selectors(query)
    choices = []
    for a, index in chosen.by_aggregate.items():
        spec = plan.noise.selectors[index]
        choices.append(
            f"{query.aggregates[a].text}: exponential mechanism over {spec.candidates} candidates per "
            f"group (score sensitivity {spec.sensitivity}, noise scale {spec.scale:.6g})"
            + (
                f", then refined by a second statement: a second pick over {refined.candidates} "
                f"candidates (the coarse bins outside a window around the first pick, sub-bins inside; "
                f"noise scale {refined.scale:.6g})"
                if (refined := getattr(spec, "refined", None)) is not None
                else ""
            )
        )
    for a, (low, _high) in chosen.interval_ends.items():
        spec = plan.noise.selectors[low]
        assert isinstance(spec, QuantileSpec)
        choices.append(
            f"dp_interval_low/high({query.aggregates[a].text}): two more picks over {spec.candidates} "
            f"candidates per group, their target ranks moved by ∓{abs(spec.shift)} (noise scale "
            f"{spec.scale:.6g}, half a share each)"
        )
    two_ks = any(getattr(choice, "means", False) for choice in plan.noise.choices)
    for choice in plan.noise.choices:
        by = "report-noisy-max, "
        if isinstance(choice, DistinctChoice):
            by = ""
            what = (
                "the generalised exponential mechanism, the most values persons can carry less their noise"
                f" ({format_number(choice.penalty)} per unit of ℓ)"
            )
            name = "ℓ, the distinct values a person is counted for (COUNT(DISTINCT x))"
        elif choice.kind == "rows":
            floor = (
                "k at least a quarter of the ceiling"
                if choice.floor
                else "no floor under a WHERE or an aggregate's condition"
            )
            if choice.quartile:
                aim = (
                    ("three quarters of the persons" if choice.lower else "half the persons")
                    if choice.half
                    else "a quarter of the persons"
                )
            elif choice.decile and choice.resolved:
                persons = math.ceil(choice.resolution / CAPPED_SHARE)
                aim = (
                    f"a tenth of the persons ({floor}), or {persons} persons where a tenth is fewer (about"
                    " what the choice's noise moves it by), at most half of them"
                )
            elif choice.after_selection:
                aim = (
                    f"about {choice.target} person(s) per group partition selection releases (drawn"
                    f" after it), at most a tenth of the persons ({floor})"
                )
            elif choice.decile:
                aim = f"a tenth of the persons ({floor})"
            elif choice.capped and choice.per_group:
                aim = (
                    f"about {choice.target} person(s) (so many per public group released, at most a"
                    f" tenth of the persons, {floor})"
                )
            elif choice.capped:
                aim = f"about {choice.target} person(s) (at most a tenth of the persons)"
            else:
                aim = f"about {choice.target} person(s)"
            what = f"aiming at {aim} with more rows (their rows scaled down to k)"
            name = "k, a person's rows in the whole query"
            if two_ks:  # dpproxy.sql.bounds.mean_components
                family = families(query)[1 if choice.means else 0]
                name = f"k of the {family} (the query has two), a person's rows in the whole query"
        else:
            what = (
                "the noisy median of the persons' numbers of groups"
                if choice.median
                else "aiming at a tenth of the persons with more groups (counted in their first g)"
                if choice.decile
                else f"aiming at about {choice.target} person(s) with more groups (counted in their first g)"
            )
            name = "g, the groups a person counts in (partition selection, COUNT(DISTINCT unit))"
        choices.append(
            f"contribution bound {name}: chosen among {', '.join(map(str, choice.candidates))} by "
            f"{by}{what} (noise scale {choice.scale:.6g}, "
            f"ε={format_number(choice.epsilon)}{f', ρ={format_number(choice.rho)}' if choice.rho else ''}); "
            "the values above are shown at the ceilings, the answer's are noised for the chosen bounds"
        )
    auxiliary = tuple(
        (step.name, step.summary, emit(step.select, dialect, pretty=True)) for step in plan.rewrite.auxiliary
    )
    return Explanation(
        query.text,
        "private",
        steps,
        emit(plan.rewrite.query(), dialect, owned=True, pretty=True) if steps else "",
        released,
        selection,
        plan.cost,
        tuple((o.name, o.type.value) for o in query.post_processing.outputs),
        auxiliary,
        tuple(choices),
        _subqueries_note(query),
    )


def _subqueries_note(query: PrivateQuery) -> str | None:
    if query.subquery_placeholders:
        return (
            "run first over the public tables and inlined as constants; without a backend they are "
            "shown as placeholder values of their type"
        )
    if query.inlined_subqueries:
        return "run first over the public tables; their rows are inlined as the constants shown"
    return None
