"""Statistics for the accuracy gate: Wilson intervals, paired tests, group-sequential bounds.

Paired notation (both arms answered the same n questions):
    a = both right, b = control only right (a loss), c = candidate only right (a win), d = neither.
The difference is candidate minus control: (c - b) / n. Non-inferiority at margin δ tests
H0: Δ ≤ -δ with Tango's score statistic; `confidence` is the one-sided level of that claim.

References (formulas and test vectors): Wilson 1927; McNemar 1947; Tango 1998; Nam 1997 /
Liu et al. 2002 (sample size); Lan & DeMets 1983 (O'Brien-Fleming-type alpha spending).
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, astuple, dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from kvgate.errors import SpecError
from kvgate.spec.margins import DEFAULT_MARGIN_PP

# numpy and scipy (about 1-3 s to import) are imported in the functions that use them: planning a
# fixed-n gate and the paired counts need neither, so `kvgate eval` can refuse a run early.
if TYPE_CHECKING:
    import numpy as np

_NORMAL = NormalDist()  # quantiles: the standard library's (Wichura AS241, ~1e-16 accurate)

Interval = tuple[float, float]

DEFAULT_MARGIN = DEFAULT_MARGIN_PP / 100  # the one default margin, as a fraction
DEFAULT_CONFIDENCE = 0.95
DEFAULT_POWER = 0.80


# --------------------------------------------------------------------------- validation


def check_confidence(confidence: float, field: str = "confidence") -> None:
    if not (isinstance(confidence, int | float) and 0.5 < confidence < 1.0):
        raise SpecError(field, f"{confidence!r} is not in (0.5, 1); use e.g. 0.95")


def check_margin(margin: float, field: str = "margin") -> None:
    if not (isinstance(margin, int | float) and 0.0 < margin < 1.0):
        raise SpecError(
            field, f"{margin!r} is not in (0, 1): a margin is a fraction; write 0.02 or 2pp"
        )


def _check_count(value: int, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise SpecError(field, f"{value!r} is not a non-negative integer")


def z_two_sided(confidence: float) -> float:
    """Normal quantile for a two-sided interval at `confidence` (1.96 for 0.95)."""
    check_confidence(confidence)
    return _NORMAL.inv_cdf(0.5 + confidence / 2.0)


def z_one_sided(confidence: float) -> float:
    """Normal quantile for a one-sided bound at `confidence` (1.645 for 0.95)."""
    check_confidence(confidence)
    return _NORMAL.inv_cdf(confidence)


# --------------------------------------------------------------------------- one arm


def wilson_interval(correct: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Wilson score interval for correct/n at two-sided `confidence`."""
    return _wilson(correct, n, z_two_sided(confidence))


def wilson_lower_bound(correct: int, n: int, confidence: float) -> float:
    """One-sided Wilson lower bound for correct/n at `confidence`."""
    return _wilson(correct, n, z_one_sided(confidence))[0]


def _wilson(correct: int, n: int, z: float) -> Interval:
    _check_count(correct, "correct")
    _check_count(n, "n")
    if n == 0:
        raise SpecError("n", "0 questions; an accuracy needs at least one")
    if correct > n:
        raise SpecError("correct", f"{correct} is more than n={n}")
    p = correct / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Clamp rounding noise so 0/n and n/n give exactly 0 and 1.
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True, slots=True)
class ArmResult:
    """One arm's accuracy with its Wilson 95% interval."""

    correct: int
    n: int
    accuracy: float
    wilson95: Interval

    @classmethod
    def from_counts(cls, correct: int, n: int) -> ArmResult:
        low_high = wilson_interval(correct, n, 0.95)
        return cls(correct=correct, n=n, accuracy=correct / n, wilson95=low_high)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "wilson95": list(self.wilson95)}


# --------------------------------------------------------------------------- paired counts


@dataclass(frozen=True, slots=True)
class PairedCounts:
    """The 2x2 table of a paired comparison on the same questions."""

    both: int
    control_only: int  # b: losses
    candidate_only: int  # c: wins
    neither: int

    def __post_init__(self) -> None:
        for name in ("both", "control_only", "candidate_only", "neither"):
            _check_count(getattr(self, name), name)

    @classmethod
    def from_outcomes(cls, outcomes: Iterable[tuple[bool, bool]]) -> PairedCounts:
        """Count (control_right, candidate_right) pairs."""
        seen = Counter((bool(control), bool(candidate)) for control, candidate in outcomes)
        return cls(seen[True, True], seen[True, False], seen[False, True], seen[False, False])

    def __add__(self, other: PairedCounts) -> PairedCounts:
        return PairedCounts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def n(self) -> int:
        return self.both + self.control_only + self.candidate_only + self.neither

    @property
    def discordant(self) -> int:
        return self.control_only + self.candidate_only

    @property
    def difference(self) -> float:
        """Candidate minus control accuracy."""
        self._require_questions()
        return (self.candidate_only - self.control_only) / self.n

    @property
    def discordance(self) -> float:
        self._require_questions()
        return self.discordant / self.n

    def control(self) -> ArmResult:
        self._require_questions()
        return ArmResult.from_counts(self.both + self.control_only, self.n)

    def candidate(self) -> ArmResult:
        self._require_questions()
        return ArmResult.from_counts(self.both + self.candidate_only, self.n)

    def _require_questions(self) -> None:
        if self.n == 0:
            raise SpecError("paired", "0 questions; a paired comparison needs at least one")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


# --------------------------------------------------------------------------- McNemar


def mcnemar_exact_p(counts: PairedCounts) -> float:
    """Exact conditional McNemar p-value (two-sided) for H0: no difference."""
    from scipy.stats import binomtest

    m = counts.discordant
    if m == 0:
        return 1.0
    k = min(counts.control_only, counts.candidate_only)
    return float(binomtest(k, m, 0.5, alternative="two-sided").pvalue)


# --------------------------------------------------------------------------- paired intervals


def _tango_loss_mle(n: float, b: float, c: float, delta0: float) -> float:
    """Restricted MLE of P(loss) under Δ = delta0 (root of Tango's quadratic)."""
    qa = 2.0 * n
    qb = -c - b + (2.0 * n - c + b) * delta0
    qc = -b * delta0 * (1.0 - delta0)
    disc = math.sqrt(max(0.0, qb * qb - 4.0 * qa * qc))
    # Stable form of (-B + sqrt(D)) / 2A when B > 0 (avoids cancellation).
    if qb <= 0:
        return (disc - qb) / (2.0 * qa)
    return (-2.0 * qc) / (qb + disc) if (qb + disc) > 0 else 0.0


def tango_statistic(counts: PairedCounts, delta0: float) -> float:
    """Tango's score statistic T(Δ0); large positive values say Δ > Δ0 (`tango_statistics`)."""
    counts._require_questions()
    return float(tango_statistics(counts.n, counts.control_only, counts.candidate_only, delta0))


def score_limit(counts: PairedCounts, z: float) -> float:
    """The Δ0 at which Tango's T(Δ0) equals `z` (T decreases in Δ0), clipped to [-1, 1].

    z > 0 gives a lower confidence limit, z < 0 an upper one; z = z_{c} gives the one-sided
    bound at confidence c, and z = a sequential boundary gives a repeated confidence bound.
    """
    from scipy.optimize import brentq

    delta = counts.difference
    if z == 0:
        return delta
    eps = 1e-12

    def f(d0: float) -> float:
        return tango_statistic(counts, d0) - z

    if z > 0:
        if delta <= -1.0 + eps or f(-1.0 + eps) <= 0:
            return -1.0
        return float(brentq(f, -1.0 + eps, delta, xtol=1e-12))
    if delta >= 1.0 - eps or f(1.0 - eps) >= 0:
        return 1.0
    return float(brentq(f, delta, 1.0 - eps, xtol=1e-12))


def tango_interval(counts: PairedCounts, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Tango 1998 asymptotic score interval for candidate minus control (two-sided)."""
    z = z_two_sided(confidence)
    # T decreases in Δ0 and is 0 at Δ0 = Δ̂: lower limit solves T = +z, upper T = -z.
    return (score_limit(counts, z), score_limit(counts, -z))


def noninferiority_p(counts: PairedCounts, margin: float) -> float:
    """One-sided p-value of Tango's score test of H0: Δ ≤ -margin."""
    from scipy.stats import norm

    check_margin(margin)
    return float(norm.sf(tango_statistic(counts, -margin)))


def lower_confidence_bound(counts: PairedCounts, confidence: float) -> float:
    """One-sided lower bound for Δ at `confidence` (the lower end of the 2c-1 Tango interval)."""
    return score_limit(counts, z_one_sided(confidence))


def upper_confidence_bound(counts: PairedCounts, confidence: float) -> float:
    """One-sided upper bound for Δ at `confidence`."""
    return score_limit(counts, -z_one_sided(confidence))


@dataclass(frozen=True, slots=True)
class PairedAnalysis:
    """Fixed-n paired analysis: the numbers the gate and `kvgate stats --paired` report."""

    counts: PairedCounts
    margin: float
    confidence: float
    difference: float
    tango95: Interval
    mcnemar_p: float
    noninferiority_p: float
    noninferior: bool
    # Every loss larger than this (a fraction, ≥ 0) is ruled out at `confidence`, one-sided;
    # 0 means even a zero loss is ruled out (the candidate is shown better).
    largest_loss_ruled_out: float
    # The one-sided lower bound for Δ at `confidence` the decision uses (one look, fixed n).
    lower_bound: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.counts.to_dict(),
            "n": self.counts.n,
            "margin": self.margin,
            "confidence": self.confidence,
            "difference": self.difference,
            "lower_bound": self.lower_bound,
            "lower_bound_sided": "one-sided, fixed n (one look)",
            "tango95": [self.tango95[0], self.tango95[1]],
            "tango95_sided": "two-sided, fixed n (one look)",
            "mcnemar_p": self.mcnemar_p,
            "noninferiority_p": self.noninferiority_p,
            "noninferior": self.noninferior,
            "largest_loss_ruled_out": self.largest_loss_ruled_out,
        }


def analyse_paired(
    counts: PairedCounts,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedAnalysis:
    """Fixed-n non-inferiority: pass iff the one-sided Tango bound at `confidence` exceeds -margin."""
    check_margin(margin)
    check_confidence(confidence)
    counts._require_questions()
    lower = lower_confidence_bound(counts, confidence)
    return PairedAnalysis(
        counts=counts,
        margin=margin,
        confidence=confidence,
        difference=counts.difference,
        tango95=tango_interval(counts, 0.95),
        mcnemar_p=mcnemar_exact_p(counts),
        noninferiority_p=noninferiority_p(counts, margin),
        noninferior=lower > -margin,
        largest_loss_ruled_out=max(0.0, -lower),
        lower_bound=lower,
    )


# --------------------------------------------------------------------------- sample size


def questions_needed(
    discordance: float,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
    power: float = DEFAULT_POWER,
    true_difference: float = 0.0,
) -> int:
    """Paired questions for the one-sided NI test to reach `power` (Nam 1997 / Liu et al. 2002).

    `discordance` is ψ = P(win) + P(loss); `true_difference` is the assumed Δ (candidate - control).
    The test is Tango's score test, the gate's.
    """
    check_margin(margin)
    check_confidence(confidence)
    check_confidence(power, "power")
    if not 0.0 <= discordance <= 1.0:
        raise SpecError("discordance", f"{discordance!r} is not in [0, 1]")
    if abs(true_difference) > discordance:
        raise SpecError(
            "true_difference", f"|{true_difference}| exceeds the discordance {discordance}"
        )
    if true_difference <= -margin:
        raise SpecError(
            "true_difference",
            f"{true_difference} is at or beyond the margin -{margin}; no n shows non-inferiority",
        )
    z_a, z_b = z_one_sided(confidence), z_one_sided(power)
    effect = true_difference + margin
    sigma1 = math.sqrt(max(0.0, discordance - true_difference**2))
    p_win = (discordance + true_difference) / 2.0
    p_loss = (discordance - true_difference) / 2.0
    delta0 = -margin
    q = _tango_loss_mle(1.0, p_loss, p_win, delta0)
    sigma0 = math.sqrt(max(0.0, 2.0 * q + delta0 * (1.0 - delta0)))
    n = (z_a * sigma0 + z_b * sigma1) ** 2 / effect**2
    return max(1, math.ceil(n - 1e-9))


# --------------------------------------------------------------------------- group-sequential


def obf_spending(fraction: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending α(t) = 2 - 2Φ(z_{1-α/2}/√t) (gsDesign sfLDOF)."""
    from scipy.stats import norm

    if fraction <= 0.0:
        return 0.0
    t = min(fraction, 1.0)
    return float(2.0 * norm.sf(norm.isf(alpha / 2.0) / math.sqrt(t)))


def power_spending(fraction: float, alpha: float, rho: float) -> float:
    """Kim-DeMets power-family spending α(t) = α·t^ρ (ρ = 1 is close to Pocock; gsDesign sfPower)."""
    if fraction <= 0.0:
        return 0.0
    return float(alpha * min(fraction, 1.0) ** rho)


def spending(fraction: float, alpha: float, function: str) -> float:
    """Cumulative α spent by information `fraction` under `function`: "obf" or "power:RHO"."""
    if function == "obf":
        return obf_spending(fraction, alpha)
    kind, _, param = function.partition(":")
    if kind == "power":
        try:
            rho = float(param)
        except ValueError:
            rho = -1.0
        if rho > 0:
            return power_spending(fraction, alpha, rho)
    raise SpecError("spending", f"{function!r} is not 'obf' or 'power:RHO' with RHO > 0")


_GRID_POINTS = 1601  # per look; trapezoid error is far below the 3rd decimal of a boundary
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_GRID_LOW_SD = 9.0  # mass below -9 sd of the score is negligible (< 1e-18)


def _check_fractions(fractions: Sequence[float]) -> list[float]:
    ts = [float(t) for t in fractions]
    if not ts or any(t <= 0 for t in ts) or any(b <= a for a, b in itertools.pairwise(ts)):
        raise SpecError("looks", f"{list(fractions)!r} must be increasing fractions in (0, 1]")
    if ts[-1] > 1.0 + 1e-12:
        raise SpecError("looks", f"the last fraction {ts[-1]} is beyond 1")
    return ts


def _continuation(
    k: int, ts: list[float], c: float, grid: np.ndarray, mass: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Grid and trapezoid mass of S_k on its continuation region S_k < c √t_k."""
    import numpy as np
    from scipy.stats import norm

    t = ts[k]
    upper = c * math.sqrt(t)
    new_grid = np.linspace(min(-_GRID_LOW_SD * math.sqrt(t), upper - 1.0), upper, _GRID_POINTS)
    h = new_grid[1] - new_grid[0]
    weights = np.full(_GRID_POINTS, h)
    weights[0] = weights[-1] = h / 2
    if k == 0:
        density = norm.pdf(new_grid, scale=math.sqrt(t))
    else:
        sd = math.sqrt(t - ts[k - 1])
        u = (new_grid[:, None] - grid[None, :]) / sd
        density = (np.exp(-0.5 * u * u) / (sd * _SQRT_2PI)) @ mass
    return new_grid, weights * density


def sequential_boundaries(
    fractions: Sequence[float], alpha: float, function: str = "obf"
) -> tuple[float, ...]:
    """One-sided z boundaries for looks at information `fractions` under α-spending `function`.

    Computed by recursive numerical integration (Armitage, McPherson & Rowe 1969) on the score
    scale S_k ~ N(0, t_k) with independent increments; boundary k spends α(t_k) - α(t_{k-1}).
    Any other stopping rule is treated as non-binding and ignored, which keeps the crossing
    probability ≤ α. By symmetry the same boundaries serve a lower (harm) boundary -c_k.
    """
    if not 0.0 < alpha < 0.5:
        raise SpecError("alpha", f"{alpha!r} is not in (0, 0.5)")
    ts = _check_fractions(fractions)
    spending(1.0, alpha, function)  # validates the name
    return _boundaries(tuple(ts), float(alpha), function)


@functools.lru_cache(maxsize=32)
def _boundaries(ts: tuple[float, ...], alpha: float, function: str) -> tuple[float, ...]:
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    boundaries: list[float] = []
    grid = np.empty(0)
    mass = np.empty(0)  # trapezoid weight x density of S_{k-1} on its continuation region
    spent = 0.0
    for k, t in enumerate(ts):
        target = spending(t, alpha, function) - spent
        if k == 0:
            c = float(norm.isf(max(target, 1e-300)))
            spent += target
        else:
            args = (math.sqrt(t), math.sqrt(t - ts[k - 1]), grid, mass)
            if target <= 1e-300:
                c = 40.0
            else:
                c = float(brentq(_crossing, -10.0, 40.0, args=(*args, target), xtol=1e-10))
            spent += _crossing(c, *args, 0.0)
        boundaries.append(c)
        if k == len(ts) - 1:
            break
        grid, mass = _continuation(k, list(ts), c, grid, mass)
    return tuple(boundaries)


def stagewise_p(
    fractions: Sequence[float], boundaries: Sequence[float], look: int, statistic: float
) -> float:
    """Stage-wise-ordering p-value of stopping at 0-based `look` with z = `statistic`.

    P under H0 of crossing the upper boundary at an earlier look, or of reaching `look` and
    seeing at least `statistic` there (Armitage-McPherson-Rowe recursion; other stops are
    non-binding and ignored, as in `sequential_boundaries`). At or above the boundary it is at
    most the α spent so far; below the boundary at the last look it exceeds the design's α, so
    it agrees with the decision.
    """
    from scipy.stats import norm

    ts = _check_fractions(fractions)
    if not 0 <= look < len(ts) or len(boundaries) != len(ts):
        raise SpecError("look", f"{look} is outside the plan's {len(ts)} looks")
    if math.isnan(statistic):
        raise SpecError("statistic", "is not a number")
    z = min(max(statistic, -40.0), 40.0)
    if look == 0:
        return float(norm.sf(z))
    chain, crossed = _chain(tuple(ts), tuple(float(b) for b in boundaries))
    grid, mass = chain[look - 1]
    sqrt_t, sd = math.sqrt(ts[look]), math.sqrt(ts[look] - ts[look - 1])
    return float(min(1.0, max(0.0, crossed[look - 1] + _crossing(z, sqrt_t, sd, grid, mass, 0.0))))


@functools.lru_cache(maxsize=16)
def _chain(
    ts: tuple[float, ...], boundaries: tuple[float, ...]
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[float]]:
    """Continuation densities after each look but the last, and P(crossed by look k) under H0."""
    import numpy as np
    from scipy.stats import norm

    chain: list[tuple[np.ndarray, np.ndarray]] = []
    crossed = [float(norm.sf(boundaries[0]))]
    grid, mass = np.empty(0), np.empty(0)
    for k in range(len(ts) - 1):
        grid, mass = _continuation(k, list(ts), boundaries[k], grid, mass)
        chain.append((grid, mass))
        sqrt_t, sd = math.sqrt(ts[k + 1]), math.sqrt(ts[k + 1] - ts[k])
        crossed.append(crossed[-1] + _crossing(boundaries[k + 1], sqrt_t, sd, grid, mass, 0.0))
    return chain, crossed


def _crossing(
    cz: float, sqrt_t: float, sd: float, grid: np.ndarray, mass: np.ndarray, minus: float
) -> float:
    """P(continue until look k-1, then cross z = cz at look k) under H0, minus `minus`."""
    import numpy as np
    from scipy.special import ndtr

    return float(np.dot(mass, ndtr((grid - cz * sqrt_t) / sd))) - minus


def tango_statistics(
    n: np.ndarray | int, losses: np.ndarray | int, wins: np.ndarray | int, delta0: float
) -> np.ndarray:
    """Tango's T(Δ0) over arrays of (n, b, c), for simulations (and for one table, above)."""
    import numpy as np

    n = np.asarray(n, dtype=float)
    b = np.asarray(losses, dtype=float)
    c = np.asarray(wins, dtype=float)
    qa = 2.0 * n
    qb = -c - b + (2.0 * n - c + b) * delta0
    qc = -b * delta0 * (1.0 - delta0)
    disc = np.sqrt(np.maximum(0.0, qb * qb - 4.0 * qa * qc))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(qb <= 0, (disc - qb) / (2.0 * qa), (-2.0 * qc) / (qb + disc))
        q = np.nan_to_num(q, nan=0.0)
        numerator = c - b - n * delta0
        variance = n * (2.0 * q + delta0 * (1.0 - delta0))
        t = numerator / np.sqrt(np.where(variance > 0, variance, np.nan))
    degenerate = np.copysign(np.inf, numerator)
    degenerate = np.where(numerator == 0, 0.0, degenerate)
    return np.where(variance > 0, t, degenerate)
