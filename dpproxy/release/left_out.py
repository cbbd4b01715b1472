"""What the bounds and partition selection leave out, estimated privately when the analyst asks (`SET
dpproxy.estimate_left_out = on`; docs/privacy.md §3, "What bounding removed", and §5, "What an answer
says about hidden groups").

A query with bounds chosen per query scales each person's rows down to k rows' worth when they
have more. The noise's ± does not cover what that takes away, and how much it takes is a fact of
the data. Asked for, the main statement also counts, at every candidate k_j
(dpproxy.sql.rewrite.per_group), each person's rows t (each group's at most the ceiling C) as

    removed_j = Σ over persons with t > k_j of min(t, C) − k_j
    reach     = Σ over persons of min(t, C)

and the release adds noise to the pair (removed_j, kept_j = reach − removed_j) at the chosen k:
one person moves removed_j by min(t, C) − k_j and kept_j by min(t, k_j), together by min(t, C) ≤ C
(L1, and so L2), whatever the others hold. Both coordinates get the noise of one value of
sensitivity C in one group: a Laplace or Gaussian vector mechanism at one released value's share of
the query's ε, planned with the others (dpproxy.engine.plan._query_noise), so the query's cost is
the same whichever k is chosen. The chosen k is itself released (the notice says it), so which pair
is noised is public.

Rows beyond the ceiling (a person's rows in one group above C, or all their groups' rows above C)
are not counted: what the ceiling removes is the data owner's choice, and counting it would have
no bound. Each person counts at least one row there (the statement's TOTAL), so kept is a little
above the truth when some persons' rows add nothing.

Over keys that go through partition selection, the groups selection chose from that hold a person
counted there (ExactGroups.present: the units selection reads, at the chosen g or the fixed limit,
above 0) are counted with noise too: one person is counted in at most g groups, so they move that
count by at most g, and it gets the noise of one value of sensitivity g in one group, planned as
one more value. The notice then says about how many groups hold persons beside how many are shown.
"""

from __future__ import annotations

from dpproxy.privacy.noise import NoiseSpec
from dpproxy.release.exact import Candidates


def removed_note(found: Candidates, index: int, k: int, ceiling: int, spec: NoiseSpec, label: str) -> str:
    """The notice's sentence on what k (candidate `index`; `label`: what it bounds, "" or " for
    averages") removed below the ceiling: the noisy pair (removed, kept) at k (the module
    docstring), or, at the ceiling, that nothing was removed below it (exactly: no noise needed)."""
    if k >= ceiling:
        return (
            f"what bounding removed: nothing below the ceiling of {ceiling} row(s) per person{label} "
            "(k is the ceiling; rows beyond it are not counted)"
        )
    removed = found.excess[index]
    kept = found.reach - removed
    noise = spec.sample(2)
    noisy_removed, noisy_kept = removed + noise[0], kept + noise[1]
    shown_removed, shown_total = max(0, noisy_removed), max(0, noisy_removed) + max(0, noisy_kept)
    error = int(spec.error95())
    share = f" ({_percent(shown_removed, shown_total)})" if shown_total > 0 else ""
    return (
        f"what bounding removed (estimated): at most {k} row(s) per person{label} took about "
        f"{shown_removed:,} (±{error:,} at 95%) of about {shown_total:,} rows' worth{share}; rows beyond "
        f"the ceiling of {ceiling} per person are not counted"
    )


def _percent(part: int, whole: int) -> str:
    share = 100 * part / whole
    return f"{share:.0f}%" if share >= 10 or share == 0 else f"{share:.1f}%"


def hidden_note(present: int, spec: NoiseSpec, shown: int) -> str:
    """The notice's sentence on the groups partition selection did not show: the noisy count of the
    groups that hold persons (the module docstring), never below the `shown` ones (released by
    selection, so public; HAVING and LIMIT may show fewer), and its ±."""
    found = max(shown, present + spec.sample(1)[0])
    error = int(spec.error95())
    return (
        f"groups not shown (estimated): partition selection released {shown:,} of about {found:,} "
        f"groups that hold persons (±{error:,} at 95%), before HAVING and LIMIT"
    )
