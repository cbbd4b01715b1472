"""Additive integer noise for released values: calibration, samplers and 95% error bounds.

This module owns NoiseSpec, the discrete Laplace or discrete Gaussian noise of one released column:
its calibration against OpenDP's map (laplace_noise: ε at L1 = g·Δ; gaussian_noise: ρ at
L2 = √g·Δ), the draws themselves (dpproxy.privacy.sampling's exact, vectorised samplers of the same
distributions OpenDP's integer measurements sample, so no floating-point noise and no Mironov-style
attacks, drawing from the OS CSPRNG in bulk; docs/privacy.md, "How noise is drawn"), and the
half-widths shown to analysts as ± at 95% (error_at: the exact integer quantile of the noise,
computed in `decimal` with proved error bounds; component_alpha for a figure derived from several
noisy values).

Released values live on an integer grid (counts, integer sums, fixed-point sums scaled by 10^s), so
noise is an integer vector that callers add with Python ints: no saturation, no rounding.

Samplers never see SQL, true values or group keys: only sensitivities, group limits, a budget and
how many draws to make.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    getcontext,
    localcontext,
)
from fractions import Fraction
from functools import lru_cache
from statistics import NormalDist

from dpproxy.policy import Mechanism
from dpproxy.privacy import opendp_names as dp
from dpproxy.privacy.calibration import I64_VECTORS, calibrate_scale
from dpproxy.privacy.checks import check_count, check_positive, check_unit_limits
from dpproxy.privacy.sampling import BytesSource, sample_discrete_gaussian, sample_discrete_laplace

# The two-sided significance of the error bounds shown to analysts: ± covers the noise 95% of the time.
ERROR_ALPHA = 0.05


@lru_cache(maxsize=4096)
def _vector_measurement(mechanism: Mechanism, scale: float) -> dp.Measurement:
    """Additive integer noise on an i64 vector: discrete Laplace (L1, ε) or discrete Gaussian (L2, ρ)."""
    if mechanism == Mechanism.LAPLACE:
        return dp.m.make_laplace(I64_VECTORS, dp.l1_distance(T="i64"), scale=scale)
    # The L2 distance is a float: √g·sensitivity is not an integer, and rounding it up would waste budget.
    return dp.m.make_gaussian(I64_VECTORS, dp.l2_distance(T="f64"), scale=scale)


def _l2_sensitivity(sensitivity: int, max_groups: int) -> float:
    """√g · sensitivity as a float never below the exact value (it is the map's input)."""
    exact_square = max_groups * sensitivity * sensitivity
    d_in = math.sqrt(max_groups) * sensitivity
    while Fraction(d_in) ** 2 < exact_square:
        d_in = math.nextafter(d_in, math.inf)
    return d_in


@dataclass(frozen=True)
class NoiseSpec:
    """Additive integer noise for one released column: a vector with one value per released group."""

    mechanism: Mechanism
    sensitivity: int  # per-group L-infinity sensitivity, in grid units (>= 1)
    max_groups: int  # groups one unit can change (g >= 1)
    scale: float  # Laplace b or Gaussian σ, in grid units
    d_in: float  # the map's input: L1 = g·sensitivity (Laplace) or L2 = √g·sensitivity (Gaussian)
    epsilon: float  # Laplace: map(d_in); Gaussian: 0 (its cost is rho)
    rho: float  # Gaussian: zCDP ρ = map(d_in); Laplace: 0

    def sample(self, n: int, bytes_source: BytesSource = os.urandom) -> list[int]:
        """n independent draws of the noise, as Python ints, to add to the true values.

        OpenDP's measurement on an i64 vector x returns x + Z, Z drawn independently of x from the
        discrete Laplace (P(z) ∝ exp(−|z|/b)) or discrete Gaussian (P(z) ∝ exp(−z²/2σ²)) with the
        scale read as an exact rational; its map certifies that additive mechanism. Z is drawn here
        from exactly that distribution (dpproxy.privacy.sampling, tested against OpenDP's draws),
        and x + Z computed with Python ints is the mechanism, for every x, without the saturation at
        the i64 range OpenDP's output would hit. `bytes_source` is for tests only.
        """
        if n < 0:
            raise ValueError("the number of draws must be >= 0")
        if n == 0:
            return []
        if self.mechanism == Mechanism.LAPLACE:
            return sample_discrete_laplace(self.scale, n, bytes_source).tolist()
        return sample_discrete_gaussian(self.scale, n, bytes_source).tolist()

    def error95(self) -> float:
        """The smallest integer e (grid units) with P(|noise| <= e) >= 0.95."""
        return self.error_at(ERROR_ALPHA)

    def error_at(self, alpha: float) -> float:
        """The smallest integer e (grid units) with P(|noise| <= e) >= 1 − alpha, 0 < alpha < 1 (a float;
        infinite only for a scale within a factor 3 of the largest float)."""
        if self.mechanism == Mechanism.LAPLACE:
            return _laplace_error(self.scale, alpha)
        return _gaussian_error(self.scale, alpha)


@lru_cache(maxsize=4096)
def _laplace_error(scale: float, alpha: float = ERROR_ALPHA) -> float:
    """The smallest integer w >= 0 with P(|Z| <= w) >= 1 − α for the discrete Laplace of this scale.

    P(|Z| > w) = 2q^(w+1)/(1 + q), q = e^(−1/b), so w = max(0, ceil(y) − 1) with
    y = b·ln(2/(α(1 + q))), evaluated in `decimal` until an error allowance far above its rounding
    errors cannot move the ceiling.
    """
    _check_alpha(alpha)
    b = Fraction(scale)
    for digits in _PRECISIONS:
        with localcontext(_context(digits + _magnitude_digits(scale))) as ctx:
            big_b = _decimal(b)
            q = (-1 / big_b).exp()
            y = big_b * (2 / (Decimal(alpha) * (1 + q))).ln()
            allowance = (abs(y) + 1) * Decimal(10) ** (5 - ctx.prec)
            low, high = _ceil(y - allowance), _ceil(y + allowance)
        if low == high:
            return _as_float(max(0, low - 1))
    return _as_float(max(0, high - 1))  # never reached in practice: the wider of the two, still a bound


@lru_cache(maxsize=4096)
def _gaussian_error(scale: float, alpha: float = ERROR_ALPHA) -> float:
    """The smallest integer w >= 0 with P(|Z| <= w) >= 1 − α for the discrete Gaussian of this σ.

    P(|Z| > w) is bounded on both sides (_GaussianTail) tightly enough to compare it with α, from a
    first guess w ≈ σ·z − 1/2 (z the normal quantile) up or down one unit at a time; where a
    precision cannot tell, the next one is tried.
    """
    _check_alpha(alpha)
    sigma = Fraction(scale)
    guess: int | None = None
    for digits in _PRECISIONS:
        with localcontext(_context(digits + _magnitude_digits(scale) + math.ceil(-math.log10(alpha)))):
            z = _normal_quantile(alpha)
            if guess is None:
                guess = max(0, _ceil(_decimal(sigma) * z - Decimal("0.5")))
            try:
                tail = _GaussianTail(sigma)
                w = guess
                while not tail.at_most(w, alpha):
                    w += 1
                while w > 0 and tail.at_most(w - 1, alpha):
                    w -= 1
                return _as_float(w)
            except _Undecided:
                continue
    assert guess is not None
    return _as_float(guess + 2)  # never reached in practice: P(|Z| > σz + 3/2) <= α


# Digits beyond the magnitude of the result that the bounds are first computed with; a case they
# cannot settle (a tail within ~10^-digits of α) is computed again with more.
_PRECISIONS = (40, 80, 160, 320)


# Euler–Maclaurin terms at most (σ >= 8 needs about 22 for 45 digits, 45 for 85).
_MAX_TERMS = 100


class _Undecided(Exception):
    """The tail's bounds straddle α at this precision."""


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, float | int) and 0 < alpha < 1):
        raise ValueError("the significance of an error bound must be in (0, 1)")


def _context(prec: int) -> Context:
    return Context(prec=prec, Emin=MIN_EMIN, Emax=MAX_EMAX, rounding=ROUND_HALF_EVEN)


def _magnitude_digits(scale: float) -> int:
    return max(0, math.ceil(math.log10(scale))) + 2


def _decimal(value: Fraction) -> Decimal:
    """value in the current context (one rounding)."""
    return Decimal(value.numerator) / Decimal(value.denominator)


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def _as_float(w: int) -> float:
    try:
        return float(w)
    except OverflowError:  # a scale near the float maximum: the bound is beyond every float
        return math.inf


@lru_cache(maxsize=16)
def _pi(prec: int) -> Decimal:
    """π to prec digits, by Machin's formula 16·atan(1/5) − 4·atan(1/239), with 10 guard digits."""
    with localcontext(_context(prec + 10)):

        def atan_inverse(k: int) -> Decimal:
            total, power, n = Decimal(0), Decimal(1) / k, 0
            while power.adjusted() > -(prec + 12):
                total += power / (2 * n + 1) if n % 2 == 0 else -power / (2 * n + 1)
                power /= k * k
                n += 1
            return total

        value = 16 * atan_inverse(5) - 4 * atan_inverse(239)
    with localcontext(_context(prec)):
        return +value


def _erfc(x: Decimal) -> Decimal:
    """erfc(x), x >= 0, in the current context: 1 − (2/√π)·e^(−x²)·Σ 2^n·x^(2n+1)/(1·3···(2n+1)), a
    series of positive terms, stopped where the rest (below the last term) is under 10^-(prec + 10)."""
    x2 = x * x
    term = total = x
    limit = Decimal(10) ** -(getcontext().prec + 10)
    n = 0
    while True:
        n += 1
        ratio = 2 * x2 / (2 * n + 1)
        term *= ratio
        total += term
        if ratio < Decimal("0.5") and term < limit:  # the rest is below term·ratio/(1 − ratio) <= term
            return 1 - 2 / _pi(getcontext().prec).sqrt() * (-x2).exp() * total


def _normal_density(u: Decimal) -> Decimal:
    return (-u * u / 2).exp() / (2 * _pi(getcontext().prec)).sqrt()


def _normal_quantile(alpha: float) -> Decimal:
    """z with P(|N(0, 1)| > z) = α, by Newton's method on erfc(z/√2) = α from the float quantile."""
    z = Decimal(NormalDist().inv_cdf(1.0 - alpha / 2.0))
    root2 = Decimal(2).sqrt()
    for _ in range(64):
        step = (_erfc(z / root2) - Decimal(alpha)) / (2 * _normal_density(z))
        z += step
        if step == 0 or step.adjusted() < -(getcontext().prec - 5):
            break
    return z


_BERNOULLI: list[Fraction] = []  # B_0, B_1, … as far as needed so far
_BERNOULLI_ROW: list[Fraction] = []


def _bernoulli(m: int) -> Fraction:
    """B_m (Akiyama–Tanigawa; B_1 comes out as +1/2 and is not used)."""
    while len(_BERNOULLI) <= m:
        k = len(_BERNOULLI)
        _BERNOULLI_ROW.append(Fraction(1, k + 1))
        for j in range(k, 0, -1):
            _BERNOULLI_ROW[j - 1] = j * (_BERNOULLI_ROW[j - 1] - _BERNOULLI_ROW[j])
        _BERNOULLI.append(_BERNOULLI_ROW[0])
    return _BERNOULLI[m]


class _GaussianTail:
    """Bounds on P(|Z| > w), Z discrete Gaussian with this σ, in the current decimal context.

    σ < 8: the pmf summed term by term up to where it is below 10^-(prec + 5), the rest bounded by a
    geometric series. σ >= 8: Euler–Maclaurin at the midpoints, with its remainder bounded
    (docs/privacy.md, "The ± of one noisy value"): with u = (w + 1/2)/σ and φ the normal density,
        θ·P(|Z| > w) = erfc(u/√2) + (θ − 1) + 2φ(u)·Σ_{j=1..p} c_j·σ^(−2j)·He_(2j−1)(u) + ρ,
    c_j = (2^(1−2j) − 1)·B_2j/(2j)!, |ρ| <= 2ζ(2p)·√((2p)!)·(2πσ)^(−2p), and
    θ = Σ_k e^(−k²/2σ²)/(√(2π)·σ) ∈ [1, 1 + 3e^(−2π²σ²)] (Poisson summation).
    """

    def __init__(self, sigma: Fraction) -> None:
        self.sigma = sigma
        prec = getcontext().prec
        self.allowance = Decimal(10) ** (12 - prec)  # rounding errors, relative, far above their sum
        if sigma < 8:
            two_var = _decimal(2 * sigma * sigma)
            cut = math.ceil(float(sigma) * math.sqrt(2.0 * (prec + 5) * math.log(10.0))) + 1
            # f(k) = e^(−k²/2σ²) by f(k+1) = f(k)·g·h^k, g = e^(−1/2σ²), h = e^(−1/σ²): 3 roundings a term.
            g, h = (-1 / two_var).exp(), (-2 / two_var).exp()
            terms, power = [Decimal(1)], Decimal(1)
            for _ in range(cut):
                terms.append(terms[-1] * g * power)
                power *= h
            ratio = (-Decimal(2 * cut + 1) / two_var).exp()  # f(k+1)/f(k) <= ratio for k >= cut
            self.rest = terms[cut] * ratio / (1 - ratio)  # Σ_{k > cut} f(k)
            self.suffix = [Decimal(0)] * (cut + 2)  # suffix[k] = Σ_{k <= i <= cut} f(i)
            for k in range(cut, -1, -1):
                self.suffix[k] = self.suffix[k + 1] + terms[k]
            self.total = 2 * (self.suffix[0] + self.rest) - 1
            return
        self.sigma_decimal = _decimal(sigma)
        self.coefficients: list[Decimal] = []
        p = 0
        while True:
            p += 1
            if p > _MAX_TERMS:
                raise _Undecided
            c = (Fraction(2) ** (1 - 2 * p) - 1) * _bernoulli(2 * p) / math.factorial(2 * p)
            self.coefficients.append(_decimal(c) / self.sigma_decimal ** (2 * p))
            # log10 of the bound on |ρ| after p terms, with ζ(2p) <= ζ(2) < 1.65.
            log_bound = (
                math.log10(3.3)
                + math.lgamma(2 * p + 1) / (2 * math.log(10))
                - 2 * p * math.log10(2 * math.pi * float(sigma))
            )
            if log_bound < -(prec + 2):
                break
        self.remainder = Decimal(10) ** math.ceil(log_bound)
        pi = _pi(prec)
        self.theta = 3 * (-2 * pi * pi * _decimal(sigma * sigma)).exp()
        self.root2 = Decimal(2).sqrt()

    def at_most(self, w: int, alpha: float) -> bool:
        low, high = self._bounds(w)
        if high <= Decimal(alpha):
            return True
        if low > Decimal(alpha):
            return False
        raise _Undecided

    def _bounds(self, w: int) -> tuple[Decimal, Decimal]:
        if self.sigma < 8:
            tail = (self.suffix[w + 1] if w + 1 < len(self.suffix) else Decimal(0)) + self.rest
            value = 2 * tail / self.total
            slack = value * self.allowance + 2 * self.rest / self.total
            return value - slack, value + slack
        u = _decimal(Fraction(2 * w + 1, 2) / self.sigma)
        # He_(2j−1)(u) by He_(n+1) = u·He_n − n·He_(n−1), from He_0 = 1 and He_1 = u.
        series, previous, current = Decimal(0), Decimal(1), u
        for j, c in enumerate(self.coefficients, start=1):
            series += c * current
            for n in (2 * j - 1, 2 * j):
                previous, current = current, u * current - n * previous
        value = _erfc(u / self.root2) + 2 * _normal_density(u) * series
        slack = (abs(value) + 1) * self.allowance + self.remainder
        return (value - slack) / (1 + self.theta), value + slack + self.theta


def component_alpha(components: int) -> float:
    """The significance each of `components` noisy values gets when one released figure is derived
    from all of them (AVG from a sum and a count; VAR and STDDEV from three): by the union bound,
    all of them lie within their error_at(component_alpha(k)) together with probability
    >= 1 − ERROR_ALPHA, so the figure's ± derived from those bounds is a true 95% bound. Bounding
    each at 95% instead would only guarantee 1 − k·5% jointly (90% for AVG, 85% for VAR)."""
    check_count("the number of noisy components", components)
    return ERROR_ALPHA / components


@lru_cache(maxsize=4096)
def laplace_noise(sensitivity: int, max_groups: int, epsilon: float) -> NoiseSpec:
    """Discrete Laplace noise whose OpenDP map, at L1 = g·sensitivity, is at most epsilon.

    Starts at the textbook b = L1/ε (Dwork & Roth 2014) and nudges b up until the map agrees.
    """
    check_unit_limits(sensitivity, max_groups)
    check_positive("epsilon", epsilon)
    d_in = max_groups * sensitivity
    scale = calibrate_scale(
        d_in / epsilon, lambda b: _vector_measurement(Mechanism.LAPLACE, b).map(d_in), epsilon
    )
    cost = _vector_measurement(Mechanism.LAPLACE, scale).map(d_in)
    return NoiseSpec(Mechanism.LAPLACE, sensitivity, max_groups, scale, float(d_in), cost, 0.0)


@lru_cache(maxsize=4096)
def gaussian_noise(sensitivity: int, max_groups: int, rho: float) -> NoiseSpec:
    """Discrete Gaussian noise whose OpenDP map (zCDP), at L2 = √g·sensitivity, is at most rho.

    Starts at σ = L2/√(2ρ) (Bun & Steinke 2016; Canonne, Kamath & Steinke 2020 for the discrete
    Gaussian) and nudges σ up until the map agrees.
    """
    check_unit_limits(sensitivity, max_groups)
    check_positive("rho", rho)
    d_in = _l2_sensitivity(sensitivity, max_groups)
    scale = calibrate_scale(
        d_in / math.sqrt(2.0 * rho), lambda s: _vector_measurement(Mechanism.GAUSSIAN, s).map(d_in), rho
    )
    cost = _vector_measurement(Mechanism.GAUSSIAN, scale).map(d_in)
    return NoiseSpec(Mechanism.GAUSSIAN, sensitivity, max_groups, scale, d_in, 0.0, cost)
