"""Guarantee risk: what the 90% guarantee costs before signing, and during the year.

Pure functions, no database (the ledger-backed forecast is :mod:`billing.forecast`).
docs/risk.md states the model, every assumption and the proofs; in short:

* **Failure law.**  A job of ``G`` GPUs fails as a Poisson process of rate
  ``λ(G) = (G / G_ref)^α / MTTF_ref`` per hour.  Fitted through the published mean
  times to failure (Meta FAIR, HPCA 2025: 7.9 h at 1,024 GPUs, 1.8 h at 16,384) the
  exponent is ``α = ln(7.9/1.8) / ln 16 ≈ 0.534``: failures grow slower than the GPU
  count.  The study's projection of 0.23 h at 131,072 GPUs does *not* follow this law
  (it gives 0.59 h): the projection assumes a constant per-GPU rate (α = 1) from the
  16,384-GPU point.  :func:`published_law_check` shows both.
* **Classes, causes, outcomes.**  Each failure independently takes a class (mix),
  a cause within its class (mix; some causes are excluded by the terms), and is resolved
  live with the probability of its class.  By Poisson thinning the covered failures of a
  year are Poisson, and resolved / unresolved covered failures are *independent*
  Poissons, so the probability of missing the threshold is an exact sum
  (:func:`miss_probability`) under the exact rule ``resolved × 100 ≥ covered ×
  threshold`` (no covered failure: met).
* **Lost GPU-hours.**  A live migration stalls the job ``migration_seconds``; any other
  outcome costs a checkpoint restart: ``restart`` plus the progress since the last
  checkpoint, uniform over the checkpoint interval.  Means are exact; distributions
  (percentiles, with and without live migration) come from a seeded, vectorised Monte
  Carlo (:func:`simulate_years`).
* **Forecast during a year** (:func:`forecast_year`): the covered-failure rate has a
  Gamma prior and the live-resolution probability a Beta prior, both updated with the
  year to date; the remaining failures are negative binomial, their resolutions (and
  those of pending failures) beta-binomial; the probability of ending below the
  threshold is an exact sum over both.

Probabilities are floats (they are estimates); money is ``Decimal`` in the contract's
currency, rounded half-up to its minor unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from billing.money import credit_minor_units, from_minor_units, minor_unit_exponent
from billing.terms import FAILURE_CLASSES, Terms

__all__ = [
    "CAUSE_MIX",
    "CLASS_MIX",
    "LIVE_PROBABILITY",
    "OUTCOME_MIX",
    "PROJECTED_MTTF",
    "PUBLISHED_MTTF",
    "ClassMix",
    "FailureLaw",
    "Forecast",
    "JobKind",
    "LaunchAssumptions",
    "LivePrior",
    "RatePrior",
    "RiskModel",
    "RiskResult",
    "SimulatedYears",
    "YearToDate",
    "beta_binomial_cdf",
    "calibration_table",
    "evaluate",
    "forecast_year",
    "forecast_year_monte_carlo",
    "launch_figures",
    "miss_probability",
    "miss_probability_binomial",
    "published_law_check",
    "simulate_years",
]

# --------------------------------------------------------------------------- published data

#: Mean time to failure (hours) of a job by GPU count (Meta FAIR, HPCA 2025).  The
#: first two are measured; the third is the study's projection.
PUBLISHED_MTTF: tuple[tuple[int, float], ...] = ((1024, 7.9), (16384, 1.8))
PROJECTED_MTTF: tuple[int, float] = (131072, 0.23)

#: Class and cause mix of failures, and the share of each class resolved live: a vendor
#: that live-migrates most failures (the same mix :mod:`yoco.simulate` generates).
CLASS_MIX: tuple[tuple[str, float], ...] = (
    ("unplanned", 0.70),
    ("preemptive", 0.22),
    ("planned", 0.08),
)
CAUSE_MIX: Mapping[str, tuple[tuple[str, float], ...]] = {
    "unplanned": (
        ("gpu_lost", 30),
        ("ecc_uncorrectable", 20),
        ("node_power", 8),
        ("kernel_panic", 10),
        ("process_killed", 12),
        ("nic_down", 10),
        ("network_wide_outage", 4),
        ("facility_power", 2),
        ("customer_code", 4),
    ),
    "preemptive": (("ecc_rising", 40), ("thermal", 25), ("row_remap_pending", 20), ("xid", 15)),
    "planned": (("maintenance", 60), ("firmware", 25), ("patching", 15)),
}
LIVE_PROBABILITY: Mapping[str, float] = {"unplanned": 0.90, "preemptive": 0.97, "planned": 0.99}
#: Outcome mix of each class (live share from :data:`LIVE_PROBABILITY`).
OUTCOME_MIX: Mapping[str, tuple[tuple[str, float], ...]] = {
    "unplanned": (("live_migrated", 0.90), ("rolled_back", 0.08), ("failed", 0.02)),
    "preemptive": (("live_migrated", 0.97), ("rolled_back", 0.03), ("failed", 0.0)),
    "planned": (("live_migrated", 0.99), ("rolled_back", 0.01), ("failed", 0.0)),
}

_CLASSES = ("unplanned", "preemptive", "planned")
_HOURS_PER_YEAR = 8760.0
_DAYS_PER_YEAR = 365.0
# Truncation of exact sums: the neglected tail mass is below this.
_TAIL = 1e-13
# Above this many possible future failures the forecast falls back to Monte Carlo.
_EXACT_LIMIT = 20_000


def _pos(name: str, value: float, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ValueError(f"{name}: must be {'>= 0' if zero else '> 0'}, got {value!r}")
    return v


def _prob(name: str, value: float) -> float:
    v = _pos(name, value, zero=True)
    if v > 1:
        raise ValueError(f"{name}: must be a probability in [0, 1], got {value!r}")
    return v


def _posint(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


# --------------------------------------------------------------------------- failure law


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureLaw:
    """Failure rate of one job by its GPU count: ``λ(G) = (G/ref_gpus)^alpha / mttf_hours``.

    ``alpha`` = 1 is a constant per-GPU rate; ``alpha`` < 1 grows slower than the GPU
    count.  :meth:`fit` fits it through measured (GPUs, MTTF hours) points.
    """

    ref_gpus: int = 1024
    mttf_hours: float = 7.9
    alpha: float = math.log(7.9 / 1.8) / math.log(16384 / 1024)

    def __post_init__(self) -> None:
        _posint("ref_gpus", self.ref_gpus)
        _pos("mttf_hours", self.mttf_hours)
        a = _pos("alpha", self.alpha, zero=True)
        if a > 2:
            raise ValueError(f"alpha: must be in [0, 2], got {self.alpha!r}")

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]] = PUBLISHED_MTTF) -> FailureLaw:
        """Least-squares fit of ``log MTTF = log m - alpha log(G/G0)`` (exact for two points).

        ``G0`` is the first point's GPU count.  Raises ValueError for fewer than two
        distinct GPU counts or non-positive values.
        """
        if len({g for g, _ in points}) < 2:
            raise ValueError("points: need at least two distinct GPU counts to fit a law")
        g0 = _posint("gpus", points[0][0])
        xs = np.array([math.log(_posint("gpus", g) / g0) for g, _ in points])
        ys = np.array([math.log(_pos("mttf_hours", m)) for _, m in points])
        slope, intercept = np.polyfit(xs, ys, 1)
        return cls(ref_gpus=g0, mttf_hours=float(math.exp(intercept)), alpha=float(-slope))

    def rate_per_hour(self, gpus: int) -> float:
        """Failures per hour of one job of ``gpus`` GPUs."""
        return (_posint("gpus", gpus) / self.ref_gpus) ** self.alpha / self.mttf_hours

    def mttf(self, gpus: int) -> float:
        """Mean time to failure (hours) of one job of ``gpus`` GPUs."""
        return 1.0 / self.rate_per_hour(gpus)

    def to_json(self) -> dict[str, Any]:
        """The law as JSON: its reference point and exponent."""
        return {
            "formula": "rate_per_hour = (gpus / ref_gpus) ** alpha / mttf_hours",
            "ref_gpus": self.ref_gpus,
            "mttf_hours": round(self.mttf_hours, 6),
            "alpha": round(self.alpha, 6),
        }


def published_law_check(law: FailureLaw | None = None) -> list[dict[str, Any]]:
    """Published MTTFs next to the law's: the measured points and the projection.

    Also gives what a constant per-GPU rate (alpha = 1) from each measured point predicts,
    which is how the study's 131,072-GPU projection reads.
    """
    law = law or FailureLaw.fit()
    rows = []
    for (g, m), kind in (
        (PUBLISHED_MTTF[0], "measured"),
        (PUBLISHED_MTTF[1], "measured"),
        (PROJECTED_MTTF, "projected"),
    ):
        rows.append(
            {
                "gpus": g,
                "published_mttf_hours": m,
                "kind": kind,
                "fitted_law_mttf_hours": law.mttf(g),
                "per_gpu_from_1024_mttf_hours": 7.9 * 1024 / g,
                "per_gpu_from_16384_mttf_hours": 1.8 * 16384 / g,
            }
        )
    return rows


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True, kw_only=True)
class JobKind:
    """``count`` jobs of ``gpus`` GPUs, each running ``hours`` hours of a contract year.

    A checkpoint is taken every ``checkpoint_minutes``; a checkpoint restart idles the
    job ``restart_minutes`` and loses the progress since the last checkpoint (uniform
    over the interval); a live migration stalls it ``migration_seconds``.
    ``step_seconds`` converts lost time into lost steps.
    """

    gpus: int
    count: int = 1
    hours: float = _HOURS_PER_YEAR
    step_seconds: float = 2.0
    checkpoint_minutes: float = 60.0
    restart_minutes: float = 30.0
    migration_seconds: float = 60.0

    def __post_init__(self) -> None:
        _posint("gpus", self.gpus)
        _posint("count", self.count)
        _pos("hours", self.hours)
        _pos("step_seconds", self.step_seconds)
        _pos("checkpoint_minutes", self.checkpoint_minutes)
        _pos("restart_minutes", self.restart_minutes, zero=True)
        _pos("migration_seconds", self.migration_seconds, zero=True)

    @property
    def rollback_hours(self) -> float:
        """Expected hours of progress one checkpoint restart costs (restart + half an interval)."""
        return (self.restart_minutes + self.checkpoint_minutes / 2) / 60

    @property
    def migration_hours(self) -> float:
        """Hours of progress one live migration costs (the stall)."""
        return self.migration_seconds / 3600

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "job") -> JobKind:
        """A job kind from JSON; unknown keys are refused (naming ``where`` and the key)."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: expected an object, got {obj!r}")
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(obj) - known)
        if bad:
            raise ValueError(f"{where}: unknown field {bad[0]!r} (known: {sorted(known)})")
        try:
            return cls(**dict(obj))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        """The job kind as JSON."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassMix:
    """Share of each failure class, cause weights within a class, live probability by class."""

    classes: Mapping[str, float] = field(default_factory=lambda: dict(CLASS_MIX))
    causes: Mapping[str, tuple[tuple[str, float], ...]] = field(
        default_factory=lambda: dict(CAUSE_MIX)
    )
    live: Mapping[str, float] = field(default_factory=lambda: dict(LIVE_PROBABILITY))

    def __post_init__(self) -> None:
        for name, m in (("classes", self.classes), ("live", self.live)):
            bad = sorted(set(m) - FAILURE_CLASSES)
            if bad:
                raise ValueError(f"{name}: unknown failure class {bad[0]!r}")
        total = sum(_pos(f"classes.{c}", v, zero=True) for c, v in self.classes.items())
        if total <= 0:
            raise ValueError("classes: the shares must not all be zero")
        for c, v in self.live.items():
            _prob(f"live.{c}", v)
        for c, causes in self.causes.items():
            if c not in FAILURE_CLASSES:
                raise ValueError(f"causes: unknown failure class {c!r}")
            for cause, w in causes:
                _pos(f"causes.{c}.{cause}", w, zero=True)

    def share(self, cls: str) -> float:
        """Normalised share of class ``cls``."""
        return self.classes.get(cls, 0.0) / sum(self.classes.values())

    def excluded_share(self, cls: str, excluded_causes: frozenset[str]) -> float:
        """Share of class ``cls``'s failures whose cause is excluded."""
        causes = self.causes.get(cls, ())
        total = sum(w for _, w in causes)
        if total <= 0:
            return 0.0
        return sum(w for c, w in causes if c in excluded_causes) / total

    def live_of(self, cls: str) -> float:
        """Probability a failure of class ``cls`` is resolved live (0 when not given)."""
        return float(self.live.get(cls, 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskModel:
    """Everything a price of the guarantee depends on (see docs/risk.md)."""

    jobs: tuple[JobKind, ...]
    law: FailureLaw = field(default_factory=FailureLaw)
    mix: ClassMix = field(default_factory=ClassMix)
    terms: Terms = field(default_factory=Terms)
    currency: str = "USD"
    credit_base: Decimal = Decimal("1000000.00")
    gpu_hour_price: Decimal | None = None
    term_years: int = 1

    def __post_init__(self) -> None:
        if not self.jobs:
            raise ValueError("jobs: at least one job kind is needed")
        for j in self.jobs:
            if not isinstance(j, JobKind):
                raise ValueError(f"jobs: expected JobKind, got {j!r}")
        minor_unit_exponent(self.currency)
        if not isinstance(self.credit_base, Decimal) or self.credit_base < 0:
            raise ValueError(f"credit_base: expected a Decimal >= 0, got {self.credit_base!r}")
        if self.gpu_hour_price is not None and (
            not isinstance(self.gpu_hour_price, Decimal) or self.gpu_hour_price < 0
        ):
            raise ValueError(
                f"gpu_hour_price: expected a Decimal >= 0, got {self.gpu_hour_price!r}"
            )
        _posint("term_years", self.term_years)

    # Derived rates ----------------------------------------------------------------
    def failures_per_year(self, job: JobKind) -> float:
        """Expected failures of all ``job.count`` jobs of a kind over one contract year."""
        return job.count * job.hours * self.law.rate_per_hour(job.gpus)

    @property
    def expected_failures(self) -> float:
        """Expected failures (all classes) per contract year."""
        return sum(self.failures_per_year(j) for j in self.jobs)

    def class_probabilities(self) -> dict[str, tuple[float, float]]:
        """Per class: (P(a failure is of the class and covered), P(... and resolved live))."""
        out = {}
        for c in _CLASSES:
            share = self.mix.share(c)
            if c in self.terms.covered_classes:
                cov = share * (1 - self.mix.excluded_share(c, self.terms.excluded_causes))
            else:
                cov = 0.0
            out[c] = (cov, cov * self.mix.live_of(c))
        return out

    @property
    def covered_share(self) -> float:
        """Probability that one failure is covered."""
        return sum(c for c, _ in self.class_probabilities().values())

    @property
    def resolved_share(self) -> float:
        """Probability that one covered failure is resolved live (0 when none is covered)."""
        cov = self.covered_share
        return sum(r for _, r in self.class_probabilities().values()) / cov if cov else 0.0

    @property
    def credit_minor(self) -> int:
        """The credit of one missed year, in minor units (exact, half-up)."""
        return credit_minor_units(self.credit_base, self.terms.credit_percent, self.currency)

    def live_share(self) -> float:
        """Probability that one failure (any class) is resolved live."""
        return sum(self.mix.share(c) * self.mix.live_of(c) for c in _CLASSES)


# --------------------------------------------------------------------------- exact sums


def _threshold(threshold_percent: Decimal) -> tuple[int, int]:
    fr = Fraction(threshold_percent)
    if not 0 < fr <= 100:
        raise ValueError(f"threshold_percent: must satisfy 0 < t <= 100, got {threshold_percent}")
    return fr.numerator, fr.denominator


def _poisson_pmf(mu: float, n_max: int) -> np.ndarray:
    """P(N = n) for n = 0..n_max, by the log-space recurrence (no overflow)."""
    n = np.arange(n_max + 1, dtype=float)
    if mu == 0:
        out = np.zeros(n_max + 1)
        out[0] = 1.0
        return out
    logs = n * math.log(mu) - mu - _lgamma_int(n_max + 1)
    return np.exp(logs)


def _lgamma_int(n: int) -> np.ndarray:
    """log(k!) for k = 0..n-1."""
    out = np.zeros(n)
    if n > 1:
        out[1:] = np.cumsum(np.log(np.arange(1, n, dtype=float)))
    return out


def _poisson_upper(mu: float) -> int:
    """An n beyond which the Poisson(mu) tail mass is below :data:`_TAIL`."""
    return int(mu + 12 * math.sqrt(mu) + 40)


def miss_probability(mu_resolved: float, mu_unresolved: float, threshold_percent: Decimal) -> float:
    """Exact P(resolved × 100 < covered × threshold) for independent Poisson counts.

    ``resolved ~ Poisson(mu_resolved)``, ``unresolved ~ Poisson(mu_unresolved)`` (the
    thinned covered failures); covered = resolved + unresolved.  No covered failure
    meets the guarantee.  Sums ``P(U = u) · P(R ≤ r_max(u))`` with the integer rule
    ``R (100 - t) < t U``, truncated where the neglected mass is below 1e-13.
    """
    num, den = _threshold(threshold_percent)
    a = _pos("mu_resolved", mu_resolved, zero=True)
    b = _pos("mu_unresolved", mu_unresolved, zero=True)
    u_max = _poisson_upper(b)
    pu = _poisson_pmf(b, u_max)
    u = np.arange(u_max + 1)
    if num == 100 * den:
        # t = 100: missed whenever one covered failure is unresolved.
        return float(1.0 - pu[0])
    # R(100 den - num) < num U  <=>  R <= ceil(num U / (100 den - num)) - 1
    q = 100 * den - num
    r_max = -((-num * u) // q) - 1
    r_hi = int(max(r_max.max(), 0))
    pr_cdf = np.cumsum(_poisson_pmf(a, max(r_hi, _poisson_upper(a))))
    cdf = np.where(r_max >= 0, pr_cdf[np.clip(r_max, 0, None)], 0.0)
    return float(np.clip(np.dot(pu, np.minimum(cdf, 1.0)), 0.0, 1.0))


def miss_probability_binomial(
    mu_covered: float, resolved_share: float, threshold_percent: Decimal
) -> float:
    """The same probability by the direct sum over Poisson(covered) × Binomial(resolved).

    ``Σ_c P(C = c) · P(Bin(c, r) × 100 < c × t)``: the textbook form, O(c²), used to
    check :func:`miss_probability` (they agree to rounding).
    """
    num, den = _threshold(threshold_percent)
    mu = _pos("mu_covered", mu_covered, zero=True)
    r = _prob("resolved_share", resolved_share)
    c_max = _poisson_upper(mu)
    pc = _poisson_pmf(mu, c_max)
    total = 0.0
    for c in range(1, c_max + 1):
        # k * 100 den < c num  <=>  k <= ceil(c num / (100 den)) - 1
        k_max = -((-c * num) // (100 * den)) - 1
        if k_max < 0:
            continue
        total += pc[c] * _binomial_cdf(c, r, min(k_max, c))
    return float(min(total, 1.0))


def _binomial_cdf(n: int, p: float, k: int) -> float:
    if k >= n:
        return 1.0
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0
    ks = np.arange(k + 1, dtype=float)
    lf = _lgamma_int(n + 1)
    logs = lf[n] - lf[: k + 1] - lf[n - k : n + 1][::-1] + ks * math.log(p)
    logs += (n - ks) * math.log1p(-p)
    return float(min(np.exp(logs).sum(), 1.0))


def beta_binomial_cdf(n: int, a: float, b: float, k: int) -> float:
    """P(K ≤ k) for K ~ BetaBinomial(n, a, b) (exact sum in log space)."""
    _posint("n", n, 0)
    _pos("a", a)
    _pos("b", b)
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return _BetaBinomial(a, b, n).cdf(n, k)


class _BetaBinomial:
    """Log tables for BetaBinomial(n, a, b) CDFs with n up to ``n_max``.

    ``lgamma(a + k)`` and ``lgamma(b + k)`` come from ``lgamma`` of the base plus a
    cumulative sum of ``log(a + j)``: one pass, no special function per term.
    """

    def __init__(self, a: float, b: float, n_max: int) -> None:
        self.a, self.b = a, b
        self.lf = _lgamma_int(n_max + 1)
        j = np.arange(n_max + 1, dtype=float)
        self.la = math.lgamma(a) + np.concatenate(([0.0], np.cumsum(np.log(a + j[:-1]))))
        self.lb = math.lgamma(b) + np.concatenate(([0.0], np.cumsum(np.log(b + j[:-1]))))
        self.lbeta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    def cdf(self, n: int, k: int) -> float:
        """P(K ≤ k) for ``0 <= k < n``, summing the shorter side."""
        lower = k + 1 <= n - k
        ks = np.arange(0, k + 1) if lower else np.arange(k + 1, n + 1)
        # log C(n,k) + log B(k+a, n-k+b) - log B(a, b)
        logs = (
            self.lf[n] - self.lf[ks] - self.lf[n - ks] + self.la[ks] + self.lb[n - ks]
            - math.lgamma(n + self.a + self.b) - self.lbeta
        )
        s = float(np.exp(logs).sum())
        return min(max(s if lower else 1.0 - s, 0.0), 1.0)


# --------------------------------------------------------------------------- Monte Carlo

#: Above this many terms a sum of uniforms is drawn from its normal limit.
_EXACT_UNIFORM_SUM = 48


def _uniform_sums(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Per element of ``n``: the sum of ``n`` independent U(0, 1) draws.

    Exact (one draw per term) for ``n <= 48``; above, the Irwin-Hall distribution is
    drawn from its normal limit N(n/2, n/12), clipped to [0, n].  The limit's error is
    far below the Poisson spread of the count itself (docs/risk.md), and it keeps a year
    of thousands of failures O(1).
    """
    small = np.where(n <= _EXACT_UNIFORM_SUM, n, 0)
    total = int(small.sum())
    out = np.zeros(n.shape[0])
    if total:
        owner = np.repeat(np.arange(n.shape[0]), small)
        out += np.bincount(owner, weights=rng.random(total), minlength=n.shape[0])
    big = n > _EXACT_UNIFORM_SUM
    if big.any():
        nb = n[big].astype(float)
        out[big] = np.clip(rng.normal(nb / 2, np.sqrt(nb / 12)), 0, nb)
    return out


@dataclass(frozen=True, slots=True)
class SimulatedYears:
    """Per simulated contract year: failure counts, verdicts and lost GPU-hours."""

    failures: np.ndarray
    covered: np.ndarray
    resolved: np.ndarray
    missed: np.ndarray
    lost_gpu_hours_live: np.ndarray
    lost_gpu_hours_restart: np.ndarray


def _missed(resolved: np.ndarray, covered: np.ndarray, threshold: Decimal) -> np.ndarray:
    num, den = _threshold(threshold)
    # Exact integer rule; object arithmetic would be exact too but int64 does not overflow
    # here (counts < 2**31, num/den from a Decimal with few digits).
    return resolved.astype(np.int64) * (100 * den) < covered.astype(np.int64) * num


def simulate_years(model: RiskModel, years: int, seed: int) -> SimulatedYears:
    """Simulate ``years`` independent contract years of ``model`` (seeded, vectorised).

    Per job kind: failures ~ Poisson; each failure's (class, covered, live) drawn by one
    multinomial; rollback losses uniform over the checkpoint interval.  The same
    failures give the lost GPU-hours with live migration (live ones stall, the others
    roll back) and without it (every failure rolls back).
    """
    _posint("years", years)
    rng = np.random.default_rng(seed)
    probs = model.class_probabilities()
    # 4 categories per class: covered&live, covered&not, uncovered&live, uncovered&not.
    cats = []
    for c in _CLASSES:
        share = model.mix.share(c)
        live = model.mix.live_of(c)
        cov, _ = probs[c]
        unc = share - cov
        cats += [cov * live, cov * (1 - live), unc * live, unc * (1 - live)]
    pv = np.clip(np.array(cats), 0, None)
    pv = pv / pv.sum()
    cov_live = np.array([i % 4 == 0 for i in range(len(cats))])
    cov_any = np.array([i % 4 in (0, 1) for i in range(len(cats))])
    live_any = np.array([i % 4 in (0, 2) for i in range(len(cats))])

    failures = np.zeros(years, dtype=np.int64)
    covered = np.zeros(years, dtype=np.int64)
    resolved = np.zeros(years, dtype=np.int64)
    lost_live = np.zeros(years)
    lost_restart = np.zeros(years)
    for job in model.jobs:
        n = rng.poisson(model.failures_per_year(job), size=years)
        split = rng.multinomial(n, pv)
        live_n = split[:, live_any].sum(axis=1)
        failures += n
        covered += split[:, cov_any].sum(axis=1)
        resolved += split[:, cov_live].sum(axis=1)
        rolled = n - live_n
        sum_rolled = _uniform_sums(rng, rolled)
        sum_all = sum_rolled + _uniform_sums(rng, live_n)
        interval_h = job.checkpoint_minutes / 60
        restart_h = job.restart_minutes / 60
        lost_live += job.gpus * (
            live_n * job.migration_hours + rolled * restart_h + sum_rolled * interval_h
        )
        lost_restart += job.gpus * (n * restart_h + sum_all * interval_h)
    return SimulatedYears(
        failures=failures,
        covered=covered,
        resolved=resolved,
        missed=_missed(resolved, covered, model.terms.threshold_percent),
        lost_gpu_hours_live=lost_live,
        lost_gpu_hours_restart=lost_restart,
    )


# --------------------------------------------------------------------------- results


def _money(minor: int, currency: str) -> Decimal:
    return from_minor_units(minor, currency)


def _cost(hours: float, price: Decimal | None, currency: str) -> Decimal | None:
    if price is None:
        return None
    exp = minor_unit_exponent(currency)
    # Hours are a model estimate (float); the product is rounded once to the minor unit.
    value = Decimal(repr(hours)) * price
    return value.quantize(Decimal(1).scaleb(-exp), rounding=ROUND_HALF_UP)


def _poisson_quantile(mu: float, q: float) -> int:
    cdf = np.cumsum(_poisson_pmf(mu, _poisson_upper(mu)))
    return int(np.searchsorted(cdf, q - 1e-12))


def _binomial_quantile(n: int, p: float, q: float) -> int:
    for k in range(n + 1):
        if _binomial_cdf(n, p, k) >= q - 1e-12:
            return k
    return n


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskResult:
    """The price of the guarantee for one model: exact figures and Monte Carlo estimates."""

    model: RiskModel
    exact: dict[str, Any]
    monte_carlo: dict[str, Any]
    per_job: list[dict[str, Any]]
    rate_histogram: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (money as decimal strings, probabilities as numbers)."""
        m = self.model
        return {
            "law": m.law.to_json(),
            "published_mttf": published_law_check(m.law),
            "terms": m.terms.to_json(),
            "currency": m.currency,
            "credit_base": format(m.credit_base, "f"),
            "gpu_hour_price": None if m.gpu_hour_price is None else format(m.gpu_hour_price, "f"),
            "term_years": m.term_years,
            "jobs": [j.to_json() for j in m.jobs],
            "per_job": self.per_job,
            "exact": self.exact,
            "monte_carlo": self.monte_carlo,
            "resolution_rate_histogram": self.rate_histogram,
        }


def evaluate(model: RiskModel, *, samples: int = 20_000, seed: int = 1) -> RiskResult:
    """Price the guarantee of ``model``: exact where a formula exists, Monte Carlo otherwise.

    Exact: expected failures, covered failures (Poisson quantiles), P(no covered failure),
    P(missing the threshold) in a year, expected credit per year and over the term and the
    95th percentiles of both (the credit is a two-point distribution per year, binomial
    over a term of independent years), expected lost GPU-hours and their cost with and
    without live migration.  Monte Carlo (``samples`` seeded years): P(miss) with its
    standard error (a check of the exact value), the resolution-rate distribution, and
    percentiles of lost GPU-hours.
    """
    _posint("samples", samples)
    cur = model.currency
    mu = model.expected_failures
    c_share = model.covered_share
    r_share = model.resolved_share
    mu_cov = mu * c_share
    mu_res = mu_cov * r_share
    threshold = model.terms.threshold_percent
    p_miss = miss_probability(mu_res, mu_cov - mu_res, threshold)
    credit = model.credit_minor
    p95_year = credit if p_miss > 0.05 else 0
    term_p95_years = _binomial_quantile(model.term_years, p_miss, 0.95)
    live_share = model.live_share()

    per_job = []
    lost_live = lost_restart = 0.0
    for j in model.jobs:
        n = model.failures_per_year(j)
        per_failure_live = live_share * j.migration_hours + (1 - live_share) * j.rollback_hours
        ll = n * j.gpus * per_failure_live
        lr = n * j.gpus * j.rollback_hours
        lost_live += ll
        lost_restart += lr
        per_day = 24 * j.count * model.law.rate_per_hour(j.gpus)
        per_job.append(
            {
                "gpus": j.gpus,
                "count": j.count,
                "mttf_hours": model.law.mttf(j.gpus),
                "failures_per_year": n,
                "failures_per_running_day": per_day,
                "lost_progress_hours_per_day_restart": per_day * j.rollback_hours / j.count,
                "lost_progress_hours_per_day_live": per_day * per_failure_live / j.count,
                "lost_steps_per_rollback": j.checkpoint_minutes * 30 / j.step_seconds,
                "lost_gpu_hours_live": ll,
                "lost_gpu_hours_restart": lr,
            }
        )
    price = model.gpu_hour_price
    exact = {
        "expected_failures": mu,
        "covered_share": c_share,
        "resolved_share_of_covered": r_share,
        "expected_covered_failures": mu_cov,
        "covered_failures_p05": _poisson_quantile(mu_cov, 0.05),
        "covered_failures_p50": _poisson_quantile(mu_cov, 0.50),
        "covered_failures_p95": _poisson_quantile(mu_cov, 0.95),
        "p_no_covered_failures": math.exp(-mu_cov),
        "p_miss": p_miss,
        "credit_if_missed": format(_money(credit, cur), "f"),
        "expected_credit_per_year": format(_expected_money(p_miss, credit, cur), "f"),
        "credit_p95_per_year": format(_money(p95_year, cur), "f"),
        "expected_credit_over_term": format(
            _expected_money(p_miss * model.term_years, credit, cur), "f"
        ),
        "credit_p95_over_term": format(_money(term_p95_years * credit, cur), "f"),
        "expected_lost_gpu_hours_live": lost_live,
        "expected_lost_gpu_hours_restart": lost_restart,
        "expected_cost_live": _fmt(_cost(lost_live, price, cur)),
        "expected_cost_restart": _fmt(_cost(lost_restart, price, cur)),
        "expected_saving": _fmt(_cost(lost_restart - lost_live, price, cur)),
    }
    sim = simulate_years(model, samples, seed)
    missed = sim.missed
    p_mc = float(missed.mean())
    se = math.sqrt(max(p_miss * (1 - p_miss), 1e-300) / samples)
    cov = sim.covered
    has = cov > 0
    rates = sim.resolved[has] / cov[has]
    credits = missed.astype(float) * credit
    mc = {
        "samples": samples,
        "seed": seed,
        "p_miss": p_mc,
        "p_miss_standard_error": se,
        "p_miss_agrees_with_exact": abs(p_mc - p_miss) <= 4 * se + 1e-12,
        "credit_p95_per_year": format(_money(int(np.quantile(credits, 0.95,
                                                             method="inverted_cdf")), cur), "f"),
        "resolution_rate_p05": _q(rates, 0.05),
        "resolution_rate_p50": _q(rates, 0.50),
        "resolution_rate_p95": _q(rates, 0.95),
        "p_no_covered_failures": float(1 - has.mean()),
        "mean_lost_gpu_hours_live": float(sim.lost_gpu_hours_live.mean()),
        "mean_lost_gpu_hours_live_standard_error": _se(sim.lost_gpu_hours_live),
        "mean_lost_gpu_hours_restart": float(sim.lost_gpu_hours_restart.mean()),
        "mean_lost_gpu_hours_restart_standard_error": _se(sim.lost_gpu_hours_restart),
        "lost_gpu_hours_live_p50": _q(sim.lost_gpu_hours_live, 0.5),
        "lost_gpu_hours_live_p95": _q(sim.lost_gpu_hours_live, 0.95),
        "lost_gpu_hours_restart_p50": _q(sim.lost_gpu_hours_restart, 0.5),
        "lost_gpu_hours_restart_p95": _q(sim.lost_gpu_hours_restart, 0.95),
        "cost_live_p95": _fmt(_cost(_q(sim.lost_gpu_hours_live, 0.95) or 0.0, price, cur)),
        "cost_restart_p95": _fmt(
            _cost(_q(sim.lost_gpu_hours_restart, 0.95) or 0.0, price, cur)
        ),
    }
    return RiskResult(
        model=model,
        exact=exact,
        monte_carlo=mc,
        per_job=per_job,
        rate_histogram=_histogram(rates, samples, threshold),
    )


def _expected_money(p: float, minor: int, currency: str) -> Decimal:
    exp = minor_unit_exponent(currency)
    value = Decimal(repr(p)) * _money(minor, currency)
    return value.quantize(Decimal(1).scaleb(-exp), rounding=ROUND_HALF_UP)


def _fmt(d: Decimal | None) -> str | None:
    return None if d is None else format(d, "f")


def _q(x: np.ndarray, q: float) -> float | None:
    return None if x.size == 0 else float(np.quantile(x, q))


def _se(x: np.ndarray) -> float:
    return float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0


def _histogram(rates: np.ndarray, samples: int, threshold: Decimal) -> list[dict[str, Any]]:
    """Share of simulated years by resolution rate, in 5-point bins (rate 1.0 in the last)."""
    edges = np.linspace(0, 1, 21)
    counts, _ = np.histogram(rates, bins=edges)
    t = float(threshold) / 100
    return [
        {
            "from": float(edges[i]),
            "to": float(edges[i + 1]),
            "share": float(counts[i]) / samples,
            "below_threshold": bool(edges[i + 1] <= t),
        }
        for i in range(20)
    ]


# --------------------------------------------------------------------------- launch figures


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchAssumptions:
    """The assumptions under which :func:`launch_figures` reproduces the launch figures."""

    checkpoint_minutes: float = 60.0
    restart_minutes: float = 30.0
    migration_seconds: float = 60.0
    h200_gpu_hour_price: Decimal = Decimal("2.50")
    live_share_at_guarantee: float = 0.90


def launch_figures(a: LaunchAssumptions | None = None) -> list[dict[str, Any]]:
    """Each published launch figure, the assumptions that reproduce it and our result."""
    a = a or LaunchAssumptions()
    law = FailureLaw.fit()
    job = JobKind(
        gpus=1024,
        checkpoint_minutes=a.checkpoint_minutes,
        restart_minutes=a.restart_minutes,
        migration_seconds=a.migration_seconds,
    )
    per_day = 24 * law.rate_per_hour(1024)
    restart_h = per_day * job.rollback_hours
    live_min = per_day * job.migration_hours * 60
    at_line = per_day * (
        a.live_share_at_guarantee * job.migration_hours
        + (1 - a.live_share_at_guarantee) * job.rollback_hours
    ) * 60
    # Share of failures that must be live for < 10 min/day.
    span = job.rollback_hours - job.migration_hours
    need = 1 - (10 / 60 / per_day - job.migration_hours) / span
    rows: list[dict[str, Any]] = []
    for g, m in PUBLISHED_MTTF:
        rows.append(
            {
                "figure": f"MTTF {m} h on {g:,} GPUs",
                "assumptions": f"failure law fitted through both measured points (alpha = "
                f"{law.alpha:.3f})",
                "ours": f"{law.mttf(g):.2f} h",
                "consistent": True,
            }
        )
    g, m = PROJECTED_MTTF
    rows.append(
        {
            "figure": f"MTTF {m} h projected on {g:,} GPUs",
            "assumptions": "same fitted law; the projection itself assumes a constant per-GPU "
            "rate from the 16,384-GPU point",
            "ours": f"{law.mttf(g):.2f} h (per-GPU rate from 16,384: {1.8 * 16384 / g:.3f} h; "
            f"from 1,024: {7.9 * 1024 / g:.3f} h)",
            "consistent": False,
        }
    )
    rows.append(
        {
            "figure": "~3 h of progress lost per day on 1,024 GPUs with checkpoint-restart",
            "assumptions": f"MTTF {law.mttf(1024):.1f} h ({per_day:.2f} failures/day); "
            f"checkpoint every {a.checkpoint_minutes:g} min (half lost on average); restart "
            f"{a.restart_minutes:g} min",
            "ours": f"{restart_h:.2f} h/day",
            "consistent": 2.5 <= restart_h <= 3.5,
        }
    )
    rows.append(
        {
            "figure": "under 10 min per day with live migration",
            "assumptions": f"every failure live-migrated with a {a.migration_seconds:g} s stall",
            "ours": f"{live_min:.1f} min/day; at the guarantee's floor "
            f"({a.live_share_at_guarantee:.0%} live, the rest restarted) "
            f"{at_line:.1f} min/day; < 10 min needs >= {need:.1%} live",
            "consistent": live_min < 10,
        }
    )
    big = JobKind(
        gpus=2048,
        checkpoint_minutes=a.checkpoint_minutes,
        restart_minutes=a.restart_minutes,
    )
    n = _HOURS_PER_YEAR * law.rate_per_hour(2048)
    gpu_h = n * 2048 * big.rollback_hours
    cost = _cost(gpu_h, a.h200_gpu_hour_price, "USD")
    breakeven = Decimal(repr(6_000_000 / gpu_h)).quantize(Decimal("0.01"))
    rows.append(
        {
            "figure": "over $6M a year of waste on 2,048 H200s",
            "assumptions": f"one 2,048-GPU job all year (MTTF {law.mttf(2048):.2f} h, "
            f"{n:,.0f} failures); same checkpoint/restart; "
            f"${a.h200_gpu_hour_price}/GPU-hour",
            "ours": f"{gpu_h:,.0f} GPU-hours, ${cost:,} (>$6M at any price >= "
            f"${breakeven}/GPU-hour)",
            "consistent": cost is not None and cost > 6_000_000,
        }
    )
    return rows


# --------------------------------------------------------------------------- forecast


@dataclass(frozen=True, slots=True, kw_only=True)
class RatePrior:
    """Gamma(shape, rate) prior of the covered-failure rate, per day."""

    shape: float
    rate: float

    def __post_init__(self) -> None:
        _pos("shape", self.shape)
        _pos("rate", self.rate)

    @classmethod
    def from_mean(cls, mean_per_day: float, weight_days: float = 30.0) -> RatePrior:
        """A prior worth ``weight_days`` of observation at ``mean_per_day`` (+ half a failure).

        Shape ``0.5 + mean × weight`` (the 0.5 is Jeffreys' shape: with no information it
        still says "a few failures at most"); rate ``weight`` days.
        """
        m = _pos("mean_per_day", mean_per_day, zero=True)
        w = _pos("weight_days", weight_days)
        return cls(shape=0.5 + m * w, rate=w)


@dataclass(frozen=True, slots=True, kw_only=True)
class LivePrior:
    """Beta(a, b) prior of the probability that a covered failure is resolved live."""

    a: float = 9.5
    b: float = 0.5

    def __post_init__(self) -> None:
        _pos("a", self.a)
        _pos("b", self.b)


@dataclass(frozen=True, slots=True, kw_only=True)
class YearToDate:
    """A contract year so far: covered failures (pending among them) and how many resolved.

    ``unresolved`` = covered with an outcome that is not live (rolled back or failed);
    ``covered = resolved + unresolved + pending``.  ``elapsed_days`` / ``remaining_days``
    split the year at the forecast instant.
    """

    covered: int
    resolved: int
    pending: int
    elapsed_days: float
    remaining_days: float

    def __post_init__(self) -> None:
        _posint("covered", self.covered, 0)
        _posint("resolved", self.resolved, 0)
        _posint("pending", self.pending, 0)
        if self.resolved + self.pending > self.covered:
            raise ValueError(
                f"resolved + pending ({self.resolved} + {self.pending}) exceed covered "
                f"({self.covered})"
            )
        _pos("elapsed_days", self.elapsed_days, zero=True)
        _pos("remaining_days", self.remaining_days, zero=True)

    @property
    def unresolved(self) -> int:
        """Covered failures whose outcome is known and not live."""
        return self.covered - self.resolved - self.pending


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    """P(the year ends below the threshold), with what it was computed from."""

    p_miss: float
    method: str
    standard_error: float
    expected_covered_at_end: float
    expected_resolved_at_end: float
    rate_posterior: RatePrior
    live_posterior: LivePrior
    already_decided: bool

    def to_json(self) -> dict[str, Any]:
        """The forecast as JSON."""
        return {
            "p_miss": self.p_miss,
            "method": self.method,
            "standard_error": self.standard_error,
            "expected_covered_at_end": self.expected_covered_at_end,
            "expected_resolved_at_end": self.expected_resolved_at_end,
            "rate_posterior": {
                "shape": self.rate_posterior.shape,
                "rate": self.rate_posterior.rate,
            },
            "live_posterior": {"a": self.live_posterior.a, "b": self.live_posterior.b},
            "already_decided": self.already_decided,
        }


def _posteriors(ytd: YearToDate, rate: RatePrior, live: LivePrior) -> tuple[RatePrior, LivePrior]:
    return (
        RatePrior(shape=rate.shape + ytd.covered, rate=rate.rate + ytd.elapsed_days),
        LivePrior(a=live.a + ytd.resolved, b=live.b + ytd.unresolved),
    )


def _negbin_pmf(shape: float, rate: float, days: float, n_max: int) -> np.ndarray:
    """P(N = n), N ~ Poisson(λ days) with λ ~ Gamma(shape, rate): negative binomial."""
    if days == 0:
        out = np.zeros(n_max + 1)
        out[0] = 1.0
        return out
    n = np.arange(n_max + 1, dtype=float)
    logp = math.log(rate / (rate + days))
    logq = math.log(days / (rate + days))
    # lgamma(n + shape) - lgamma(shape) = sum_{j < n} log(shape + j)
    rising = np.concatenate(([0.0], np.cumsum(np.log(shape + n[:-1]))))
    logs = rising - _lgamma_int(n_max + 1) + shape * logp + n * logq
    return np.exp(logs)


def _negbin_log_pmf(shape: float, rate: float, days: float, n: int) -> float:
    return (
        math.lgamma(n + shape) - math.lgamma(shape) - math.lgamma(n + 1)
        + shape * math.log(rate / (rate + days)) + n * math.log(days / (rate + days))
    )


def _negbin_upper(shape: float, rate: float, days: float) -> int:
    """An n beyond which the negative binomial tail is negligible (< 1e-13).

    Starts at mean + 14 standard deviations and grows by half until the pmf there,
    times the expected number of further terms, is below 1e-16 (the pmf decreases
    geometrically past the mode).
    """
    mean = shape * days / rate
    var = mean * (1 + days / rate)
    q = days / (rate + days)
    n = int(mean + 14 * math.sqrt(var) + 40)
    while n < 10 * _EXACT_LIMIT:
        if _negbin_log_pmf(shape, rate, days, n) - math.log1p(-q) < math.log(1e-16):
            break
        n = int(n * 1.5)
    return n


def forecast_year(
    ytd: YearToDate,
    threshold_percent: Decimal,
    rate_prior: RatePrior,
    live_prior: LivePrior = LivePrior(),
) -> Forecast:
    """P(the year ends with resolved × 100 < covered × threshold), given the year so far.

    Remaining covered failures ``N ~ NegBin`` (Poisson over ``remaining_days`` with the
    Gamma posterior rate); the ``pending + N`` failures whose resolution is unknown are
    each resolved with the Beta posterior probability, so their resolved count is
    beta-binomial.  Exact sum over ``N`` of the beta-binomial CDF at the largest count
    that still misses; when the number of possible failures exceeds 20,000 it falls back
    to :func:`forecast_year_monte_carlo` (``method`` says which).
    """
    num, den = _threshold(threshold_percent)
    rp, lp = _posteriors(ytd, rate_prior, live_prior)
    mean_n = rp.shape * ytd.remaining_days / rp.rate
    p_live = lp.a / (lp.a + lp.b)
    exp_cov = ytd.covered + mean_n
    exp_res = ytd.resolved + (ytd.pending + mean_n) * p_live
    decided = ytd.pending == 0 and ytd.remaining_days == 0
    n_max = _negbin_upper(rp.shape, rp.rate, ytd.remaining_days) if ytd.remaining_days else 0
    if n_max + ytd.pending > _EXACT_LIMIT:
        return forecast_year_monte_carlo(
            ytd, threshold_percent, rate_prior, live_prior, samples=200_000, seed=0
        )
    pn = _negbin_pmf(rp.shape, rp.rate, ytd.remaining_days, n_max)
    bb = _BetaBinomial(lp.a, lp.b, n_max + ytd.pending)
    total = 0.0
    for n in range(n_max + 1):
        if pn[n] < 1e-300:
            continue
        m = ytd.pending + n
        c = ytd.covered + n
        # (R0 + K) 100 den < c num  <=>  K <= ceil((c num - 100 den R0) / (100 den)) - 1
        k_max = -((100 * den * ytd.resolved - c * num) // (100 * den)) - 1
        if k_max < 0:
            continue
        cdf = 1.0 if k_max >= m else bb.cdf(m, k_max)
        total += pn[n] * cdf
    return Forecast(
        p_miss=float(min(max(total, 0.0), 1.0)),
        method="exact",
        standard_error=0.0,
        expected_covered_at_end=exp_cov,
        expected_resolved_at_end=exp_res,
        rate_posterior=rp,
        live_posterior=lp,
        already_decided=decided,
    )


def forecast_year_monte_carlo(
    ytd: YearToDate,
    threshold_percent: Decimal,
    rate_prior: RatePrior,
    live_prior: LivePrior = LivePrior(),
    *,
    samples: int = 100_000,
    seed: int = 0,
) -> Forecast:
    """The same probability as :func:`forecast_year`, by seeded Monte Carlo.

    Draws λ from the Gamma posterior, the remaining failures from Poisson(λ · days),
    p from the Beta posterior and the resolved unknowns from Binomial(pending + N, p).
    ``standard_error`` is the binomial standard error of the estimate.
    """
    _posint("samples", samples)
    rp, lp = _posteriors(ytd, rate_prior, live_prior)
    rng = np.random.default_rng(seed)
    lam = rng.gamma(rp.shape, 1 / rp.rate, size=samples)
    n = rng.poisson(lam * ytd.remaining_days)
    p = rng.beta(lp.a, lp.b, size=samples)
    k = rng.binomial(n + ytd.pending, p)
    missed = _missed(ytd.resolved + k, ytd.covered + n, threshold_percent)
    pm = float(missed.mean())
    mean_n = rp.shape * ytd.remaining_days / rp.rate
    p_live = lp.a / (lp.a + lp.b)
    return Forecast(
        p_miss=pm,
        method="monte_carlo",
        standard_error=math.sqrt(max(pm * (1 - pm), 1 / samples) / samples),
        expected_covered_at_end=ytd.covered + mean_n,
        expected_resolved_at_end=ytd.resolved + (ytd.pending + mean_n) * p_live,
        rate_posterior=rp,
        live_posterior=lp,
        already_decided=ytd.pending == 0 and ytd.remaining_days == 0,
    )


# --------------------------------------------------------------------------- calibration


def calibration_table(
    *,
    years: int,
    seed: int,
    threshold_percent: Decimal = Decimal(90),
    rate_prior: RatePrior = RatePrior(shape=4.0, rate=40.0),
    live_prior: LivePrior = LivePrior(a=18.0, b=2.0),
    year_days: float = _DAYS_PER_YEAR,
    pending_share: float = 0.05,
    bins: int = 10,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Forecast simulated contract years at a random instant and compare with the end.

    Each simulated year draws its true rate from ``rate_prior`` and its live probability
    from ``live_prior`` (the rates are known to the generator, not to the forecast),
    places Poisson failures over the year, resolves each with its probability, and leaves
    each failure before the forecast instant pending with ``pending_share``.  The
    forecast (:func:`forecast_year` with the same priors) is taken at a uniformly random
    instant.  Returns the reliability table: per bin of forecast probability, the number
    of years, the mean forecast, the observed frequency of missed years and the
    binomial standard error of that frequency; plus totals (sum of forecasts vs misses).
    ``progress(done, years)`` is called after each simulated year (it does not change
    the table: the draws are the seed's whatever it does).
    """
    _posint("years", years)
    rng = np.random.default_rng(seed)
    forecasts = np.zeros(years)
    outcomes = np.zeros(years, dtype=bool)
    for i in range(years):
        lam = rng.gamma(rate_prior.shape, 1 / rate_prior.rate)
        p = rng.beta(live_prior.a, live_prior.b)
        n = int(rng.poisson(lam * year_days))
        times = rng.random(n) * year_days
        live = rng.random(n) < p
        t = float(rng.random() * year_days)
        before = times < t
        pend = before & (rng.random(n) < pending_share)
        ytd = YearToDate(
            covered=int(before.sum()),
            resolved=int((before & live & ~pend).sum()),
            pending=int(pend.sum()),
            elapsed_days=t,
            remaining_days=year_days - t,
        )
        forecasts[i] = forecast_year(ytd, threshold_percent, rate_prior, live_prior).p_miss
        outcomes[i] = bool(_missed(np.array([live.sum()]), np.array([n]), threshold_percent)[0])
        if progress is not None:
            progress(i + 1, years)
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(forecasts, edges[1:-1]), 0, bins - 1)
    rows = []
    for b in range(bins):
        sel = idx == b
        k = int(sel.sum())
        if k == 0:
            rows.append({"from": float(edges[b]), "to": float(edges[b + 1]), "years": 0})
            continue
        mean_f = float(forecasts[sel].mean())
        obs = float(outcomes[sel].mean())
        # The spread expected of the observed frequency if the forecasts are right.
        se = math.sqrt(float((forecasts[sel] * (1 - forecasts[sel])).sum())) / k
        rows.append(
            {
                "from": float(edges[b]),
                "to": float(edges[b + 1]),
                "years": k,
                "mean_forecast": mean_f,
                "observed": obs,
                "standard_error": se,
            }
        )
    var = float((forecasts * (1 - forecasts)).sum())
    return {
        "years": years,
        "seed": seed,
        "rows": rows,
        "sum_forecast": float(forecasts.sum()),
        "missed": int(outcomes.sum()),
        "sum_standard_error": math.sqrt(var),
        "brier": float(((forecasts - outcomes) ** 2).mean()),
    }
