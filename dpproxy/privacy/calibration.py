"""Fitting a noise scale to OpenDP's privacy map, and the OpenDP setup every mechanism shares.

Textbook formulas (Laplace b = Δ/ε, Gaussian σ = Δ/√(2ρ)) only give a starting scale; the map has
the last word. OpenDP rounds maps up (`map(3)` at Laplace scale 10 is 0.30000000000000004), so
`calibrate_scale` nudges the scale up by tiny factors until the map says the cost fits: the nudging
is not cosmetic. This module also enables OpenDP's "contrib" features, which the measurements of
the package need (every module that builds one imports this module, directly or through another),
and holds the domain of i64 vectors they are built on. Measurements are built once per parameter
set and cached by their builders: construction and maps cost ~0.05-0.3 ms each.

It never builds a measurement or reads a cost itself: callers hand it the map to satisfy.
"""

from __future__ import annotations

from collections.abc import Callable

from dpproxy.privacy import opendp_names as dp

dp.enable_features("contrib")

# Calibration nudges a scale up by a factor 1 + 2^(step - 50): the first steps move it by a few ulps
# (all OpenDP's upward rounding ever needs), later ones by whole factors, so the search always ends.
_MAX_CALIBRATION_STEPS = 60

I64_VECTORS = dp.vector_domain(dp.atom_domain(T="i64"))


def calibrate_scale(start: float, cost_at: Callable[[float], float], target: float) -> float:
    """The first scale from `start` upwards, by tiny factors, whose OpenDP cost is <= target."""
    scale = start
    for step in range(_MAX_CALIBRATION_STEPS):
        if cost_at(scale) <= target:
            return scale
        scale *= 1.0 + 2.0 ** (step - 50)
    raise AssertionError(f"no noise scale near {start!r} brings the OpenDP map to {target!r}")
