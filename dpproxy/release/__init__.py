"""From the backend's exact, bounded components to released rows.

Order of operations, which is what makes the answer differentially private:
  1. `exact_groups` (exact): read the per-group components the rewritten SQL computed (exact integers).
  2. `choose_groups` (groups): choose the released groups *without looking at values*: every
     combination of public keys (zero-filled), or DP partition selection on the noisy count of units
     per group (`ORDER BY <count> DESC LIMIT k` is no exception: its k groups are the first k by
     their noisy values, in step 5). With bounds chosen per query, k and g are drawn first (step
     1½, `choose_bounds`, which calls this step), but over keys that are not public k may be drawn
     after the groups are: it reads how many were released. Asked for, what k removed is
     estimated there too, from one more value's share (removed).
  3. `release_aggregates` (aggregates): add noise to every component of every released group
     (dpproxy.privacy owns the samplers), and
  4. compute COUNT/SUM/AVG… from noisy components (rounding, clamping into bounds), with their 95% ±.
  5. `post_process` (post_processing): canonical order, projection, HAVING, ORDER BY, LIMIT — post-processing
     on released values only.
True values never leave this package: only steps 4–5's output is returned. `exact_groups` is also
the test seam the sensitivity certificates use (through Plan.measure): it returns true components,
and nothing in production prints or returns them.

The selector requests a query makes (requests) are in one order the plan and the release share, and
the error bars' interval arithmetic (spans) is rounded outwards. Why the whole release is DP is
argued in docs/privacy.md.
"""

from dpproxy.release.aggregates import ReleasedGroups, add_noise, release_aggregates
from dpproxy.release.exact import ExactGroups, canonical_value, canonical_values, exact_groups
from dpproxy.release.groups import choose_groups
from dpproxy.release.post_processing import canonical_key, post_process
from dpproxy.release.requests import Selectors, selectors

__all__ = [
    "ExactGroups",
    "ReleasedGroups",
    "Selectors",
    "add_noise",
    "canonical_key",
    "canonical_value",
    "canonical_values",
    "choose_groups",
    "exact_groups",
    "post_process",
    "release_aggregates",
    "selectors",
]
