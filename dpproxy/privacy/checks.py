"""Refusals of impossible privacy parameters, shared by every mechanism of the package.

This module owns the checks that run before anything is calibrated or drawn: sensitivities and group
limits that are integers >= 1 and within OpenDP's i64 distances, finite ε, ρ and δ above 0, counts,
and histograms of the right shape. Parameters raise InvalidParameter; histograms, being read from
protected tables, raise ValueError with a message that never shows a value.

It never sees noise, costs or SQL: it only says no.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpproxy.errors import InvalidParameter

# OpenDP's L1 distance on i64 vectors is itself an i64.
MAX_L1_SENSITIVITY = 2**62


def check_unit_limits(sensitivity: int, max_groups: int) -> None:
    for name, value in (("sensitivity", sensitivity), ("max_groups", max_groups)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameter(f"{name} of a released value must be an integer >= 1, not {value!r}")
    if sensitivity * max_groups > MAX_L1_SENSITIVITY:
        raise InvalidParameter(
            f"sensitivity {sensitivity} over {max_groups} group(s) is too large to calibrate noise for",
            hint="tighten the column bounds, max_rows_per_unit or max_groups_per_unit in the policy",
        )


def check_positive(name: str, value: float) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise InvalidParameter(f"{name} must be a finite number > 0, not {value!r}")


def check_count(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidParameter(f"{name} must be an integer >= {minimum}, not {value!r}")


def check_histogram(values: Sequence[int], length: int | None, what: str) -> list[int]:
    """Integer, non-negative, and as many as the candidates. Messages never show values (they are
    read from protected tables)."""
    counts = [int(v) for v in values]
    if length is not None and len(counts) != length:
        raise ValueError(f"{what} has {len(counts)} entries for {length} candidates")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what} must be >= 0")
    return counts
