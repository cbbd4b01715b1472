"""The maths of privacy: samplers, calibration, privacy cost, thresholds, error bounds.

This package owns how a query's (ε, δ) is split over the values it releases, the noise scale each of
them gets, the threshold of DP partition selection, the selections made by the exponential mechanism
(quantiles, MIN/MAX, MODE), randomized response, how costs compose under pure or zCDP
accounting, the error bounds shown to analysts, and the draws themselves. It never sees SQL, policies
or data rows: only sensitivities, group limits and the numeric vectors handed to it (unit counts for
partition selection, per-group histograms and scores for the selectors, tallies of bits).

Two rules keep it honest:

* Everything random comes from OpenDP: discrete Laplace / discrete Gaussian samplers on integers
  (exact, no floating-point noise, so no Mironov-style attacks), exact exponential / Gumbel noise for
  report-noisy-max, and exact Bernoulli coins for randomized response, all drawing from the OS CSPRNG.
* Every privacy cost is read from an OpenDP measurement's privacy map (`meas.map(d_in)`). Textbook
  formulas only give a starting parameter; the map then has the last word (calibration). Two known
  OpenDP bugs are worked around, still with OpenDP's own maps: see selection._THRESHOLD_MAP_SHIFT.

One module per job:

  accounting   Cost, pure and zCDP composition, ρ ↔ ε conversions (all the ledger imports)
  checks       refusals of impossible parameters
  calibration  fitting a scale to OpenDP's map
  noise        additive integer noise for released values, its samplers and 95% bounds
  sampling     the exact discrete Laplace / Gaussian draws: the float stage, slots, bits
  exact_stages the draws' double-double and `decimal` decisions, with their error bounds
  selection    DP partition selection of group keys that are not public
  selectors    report-noisy-max: quantiles, MIN/MAX, MODE
  responses    randomized response
  planning     one query's noise and cost (plan_query_noise, QueryNoise)

Callers import the names below from here. Why each mechanism costs what it is charged, under which
neighbouring relation, is argued in docs/privacy.md.
"""

from dpproxy.privacy.accounting import (
    FIT_RELATIVE_TOLERANCE,
    Accounting,
    Cost,
    converted_epsilon,
    zcdp_to_approx_dp,
)
from dpproxy.privacy.noise import ERROR_ALPHA, NoiseSpec, component_alpha, gaussian_noise, laplace_noise
from dpproxy.privacy.planning import QueryNoise, plan_query_noise
from dpproxy.privacy.responses import (
    RANDOMIZED_RESPONSE_TRUTH,
    RandomizedResponseCount,
    RandomizedResponseRelease,
    RandomizedResponseSpec,
    randomized_response,
    randomized_response_count_plan,
)
from dpproxy.privacy.selection import SelectionSpec, gaussian_partition_selection, partition_selection
from dpproxy.privacy.selectors import (
    ModeRequest,
    ModeSpec,
    QuantileRequest,
    QuantileSpec,
    SelectorRequest,
    SelectorSpec,
    mode_mechanism,
    quantile_mechanism,
)

__all__ = [
    "ERROR_ALPHA",
    "FIT_RELATIVE_TOLERANCE",
    "RANDOMIZED_RESPONSE_TRUTH",
    "Accounting",
    "Cost",
    "ModeRequest",
    "ModeSpec",
    "NoiseSpec",
    "QuantileRequest",
    "QuantileSpec",
    "QueryNoise",
    "RandomizedResponseCount",
    "RandomizedResponseRelease",
    "RandomizedResponseSpec",
    "SelectionSpec",
    "SelectorRequest",
    "SelectorSpec",
    "component_alpha",
    "converted_epsilon",
    "gaussian_noise",
    "gaussian_partition_selection",
    "laplace_noise",
    "mode_mechanism",
    "partition_selection",
    "plan_query_noise",
    "quantile_mechanism",
    "randomized_response",
    "randomized_response_count_plan",
    "zcdp_to_approx_dp",
]
