"""billing.risk: the failure law, exact sums against independent brute force, exact against
Monte Carlo within their stated error, calibration of the forecast, the launch figures."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from billing import risk
from billing.terms import Terms

T90 = Decimal(90)


def _pois(mu: float, n: int) -> float:
    return math.exp(-mu) * mu**n / math.factorial(n)


def _brute_miss(mu_r: float, mu_u: float, threshold: Decimal) -> float:
    """Double sum over independent Poissons with the DESIGN rule in exact Decimal."""
    total = 0.0
    for r in range(60):
        for u in range(60):
            covered = r + u
            if covered and Decimal(r * 100) < covered * threshold:
                total += _pois(mu_r, r) * _pois(mu_u, u)
    return total


# --------------------------------------------------------------------------- failure law


def test_law_fitted_through_published_points_and_projection_checked() -> None:
    law = risk.FailureLaw.fit()
    assert law.alpha == pytest.approx(math.log(7.9 / 1.8) / math.log(16))
    assert law.alpha == pytest.approx(0.5335, abs=1e-4)
    assert law.mttf(1024) == pytest.approx(7.9)
    assert law.mttf(16384) == pytest.approx(1.8)
    rows = {r["gpus"]: r for r in risk.published_law_check(law)}
    # The fitted law misses the projection by a factor ~2.6; a per-GPU law from the
    # 16,384-GPU point reproduces it.
    assert rows[131072]["fitted_law_mttf_hours"] == pytest.approx(0.5936, abs=1e-3)
    assert rows[131072]["per_gpu_from_16384_mttf_hours"] == pytest.approx(0.225, abs=1e-3)
    # Rate scales as GPUs^alpha.
    assert law.rate_per_hour(4096) / law.rate_per_hour(1024) == pytest.approx(4**law.alpha)


def test_law_fit_least_squares_and_refusals() -> None:
    law = risk.FailureLaw.fit([(1000, 10.0), (2000, 5.0), (4000, 2.5)])
    assert law.alpha == pytest.approx(1.0) and law.mttf(1000) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="two distinct"):
        risk.FailureLaw.fit([(1024, 7.9)])
    with pytest.raises(ValueError, match="alpha"):
        risk.FailureLaw(alpha=-0.1)
    with pytest.raises(ValueError, match="gpus"):
        risk.FailureLaw().rate_per_hour(0)


# --------------------------------------------------------------------------- exact sums


@pytest.mark.parametrize(
    ("mu_r", "mu_u", "t"),
    [
        (2.7, 0.3, T90),
        (9.0, 1.0, T90),
        (12.0, 0.8, Decimal("92.5")),
        (5.0, 0.5, Decimal(100)),
        (0.5, 0.5, Decimal("0.5")),
        (0.0, 0.0, T90),
        (0.0, 2.0, T90),
    ],
)
def test_miss_probability_matches_brute_force_with_exact_rule(mu_r, mu_u, t) -> None:
    assert risk.miss_probability(mu_r, mu_u, t) == pytest.approx(
        _brute_miss(mu_r, mu_u, t), abs=1e-12
    )


@pytest.mark.parametrize(("mu", "r", "t"), [(30, 0.9, T90), (100, 0.93, Decimal("92.5")),
                                            (3, 0.9, T90), (400, 0.91, T90)])
def test_independent_poissons_equal_poisson_times_binomial(mu, r, t) -> None:
    a = risk.miss_probability(mu * r, mu * (1 - r), t)
    b = risk.miss_probability_binomial(mu, r, t)
    assert a == pytest.approx(b, rel=1e-9, abs=1e-14)


def test_no_covered_failure_meets_the_guarantee() -> None:
    assert risk.miss_probability(0.0, 0.0, T90) == 0.0
    # Threshold 100: missed exactly when one covered failure is unresolved.
    assert risk.miss_probability(3.0, 0.7, Decimal(100)) == pytest.approx(1 - math.exp(-0.7))


def test_beta_binomial_cdf_against_exact_rationals() -> None:
    def beta_int(x: int, y: int) -> Fraction:  # B(x, y) for integers
        return Fraction(math.factorial(x - 1) * math.factorial(y - 1), math.factorial(x + y - 1))

    for n, a, b in ((10, 2, 3), (7, 1, 1), (25, 9, 1)):
        for k in range(-1, n + 1):
            exact = sum(
                (math.comb(n, i) * beta_int(i + a, n - i + b) / beta_int(a, b) for i in range(k + 1)),
                Fraction(0),
            )
            assert risk.beta_binomial_cdf(n, a, b, k) == pytest.approx(float(exact), abs=1e-12)


# --------------------------------------------------------------------------- exact vs MC


def _small_model(**over) -> risk.RiskModel:
    # ~33 failures a year: a miss is likely enough to measure its probability well.
    kw = dict(
        jobs=(risk.JobKind(gpus=256, hours=2000.0, checkpoint_minutes=30, restart_minutes=20),
              risk.JobKind(gpus=8, count=20, hours=4000.0)),
        mix=risk.ClassMix(live={"unplanned": 0.88, "preemptive": 0.95, "planned": 0.99}),
        credit_base=Decimal("1000000.02"),
        gpu_hour_price=Decimal("3.10"),
        term_years=3,
    )
    kw.update(over)
    return risk.RiskModel(**kw)


def test_exact_and_monte_carlo_agree_within_stated_error() -> None:
    model = _small_model()
    res = risk.evaluate(model, samples=40_000, seed=11)
    ex, mc = res.exact, res.monte_carlo
    assert 0.1 < ex["p_miss"] < 0.9
    assert abs(mc["p_miss"] - ex["p_miss"]) <= 4 * mc["p_miss_standard_error"]
    assert mc["p_miss_agrees_with_exact"] is True
    for key in ("live", "restart"):
        err = mc[f"mean_lost_gpu_hours_{key}_standard_error"]
        assert err > 0
        assert abs(mc[f"mean_lost_gpu_hours_{key}"] - ex[f"expected_lost_gpu_hours_{key}"]) <= 4 * err
    assert mc["p_no_covered_failures"] == pytest.approx(ex["p_no_covered_failures"], abs=0.01)
    # The histogram covers every year with a covered failure.
    shares = sum(b["share"] for b in res.rate_histogram)
    assert shares == pytest.approx(1 - mc["p_no_covered_failures"])


def test_monte_carlo_counts_follow_the_thinning() -> None:
    model = _small_model()
    sim = risk.simulate_years(model, 50_000, seed=5)
    mu = model.expected_failures
    assert abs(sim.failures.mean() - mu) <= 4 * math.sqrt(mu / 50_000)
    mu_c = mu * model.covered_share
    assert abs(sim.covered.mean() - mu_c) <= 4 * math.sqrt(mu_c / 50_000)
    mu_r = mu_c * model.resolved_share
    assert abs(sim.resolved.mean() - mu_r) <= 4 * math.sqrt(mu_r / 50_000)
    # Seeded: the same seed gives the same years.
    again = risk.simulate_years(model, 50_000, seed=5)
    assert np.array_equal(sim.missed, again.missed)
    assert np.array_equal(sim.lost_gpu_hours_live, again.lost_gpu_hours_live)
    # With live migration a year never loses more than without it.
    assert (sim.lost_gpu_hours_live <= sim.lost_gpu_hours_restart + 1e-9).all()


def test_credit_figures_exact() -> None:
    model = _small_model()
    ex = risk.evaluate(model, samples=1000, seed=1).exact
    p = ex["p_miss"]
    # 25% of 1,000,000.02 = 250,000.005 -> 250,000.01 (half-up, billing.money).
    assert ex["credit_if_missed"] == "250000.01"
    assert Decimal(ex["expected_credit_per_year"]) == (
        Decimal(repr(p)) * Decimal("250000.01")
    ).quantize(Decimal("0.01"))
    assert ex["credit_p95_per_year"] == ("250000.01" if p > 0.05 else "0.00")
    # Over 3 independent years the number of missed years is Binomial(3, p).
    k = next(k for k in range(4) if sum(
        math.comb(3, i) * p**i * (1 - p) ** (3 - i) for i in range(k + 1)) >= 0.95 - 1e-12)
    assert Decimal(ex["credit_p95_over_term"]) == k * Decimal("250000.01")
    safe = risk.evaluate(_small_model(jobs=(risk.JobKind(gpus=8, hours=10.0),)), samples=500)
    assert safe.exact["credit_p95_per_year"] == "0.00"


def test_lost_hours_expectations_by_formula() -> None:
    job = risk.JobKind(gpus=1024, checkpoint_minutes=60, restart_minutes=30, migration_seconds=60)
    mix = risk.ClassMix(live={"unplanned": 1.0, "preemptive": 1.0, "planned": 1.0})
    model = risk.RiskModel(jobs=(job,), mix=mix, gpu_hour_price=Decimal("2.00"))
    ex = risk.evaluate(model, samples=200, seed=1).exact
    n = 8760 / 7.9
    assert ex["expected_lost_gpu_hours_restart"] == pytest.approx(n * 1024 * 1.0)
    assert ex["expected_lost_gpu_hours_live"] == pytest.approx(n * 1024 / 60)
    assert ex["p_miss"] == 0.0
    assert Decimal(ex["expected_cost_restart"]) == pytest.approx(Decimal(n * 1024 * 2), abs=1)


def test_covered_share_follows_terms() -> None:
    model = risk.RiskModel(jobs=(risk.JobKind(gpus=64),))
    # planned is not covered; 10 of 100 unplanned cause weight is excluded (network, power,
    # customer code); no preemptive cause is excluded.
    assert model.covered_share == pytest.approx(0.70 * 90 / 100 + 0.22)
    only_unplanned = risk.RiskModel(
        jobs=(risk.JobKind(gpus=64),),
        terms=Terms.from_json({"covered_classes": ["unplanned"], "excluded_causes": ["x"]}),
    )
    assert only_unplanned.covered_share == pytest.approx(0.70)
    assert only_unplanned.resolved_share == pytest.approx(0.90)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: risk.JobKind(gpus=0), "gpus"),
        (lambda: risk.JobKind(gpus=8, hours=-1.0), "hours"),
        (lambda: risk.JobKind(gpus=8, checkpoint_minutes=float("nan")), "checkpoint_minutes"),
        (lambda: risk.JobKind.from_json({"gpus": 8, "gpu": 1}), "unknown field 'gpu'"),
        (lambda: risk.RiskModel(jobs=()), "at least one job"),
        (lambda: risk.RiskModel(jobs=(risk.JobKind(gpus=8),), currency="XXX"), "XXX"),
        (lambda: risk.RiskModel(jobs=(risk.JobKind(gpus=8),), credit_base=1.5), "credit_base"),
        (lambda: risk.ClassMix(live={"unplanned": 1.5}), "live.unplanned"),
        (lambda: risk.ClassMix(classes={"weird": 1.0}), "weird"),
        (lambda: risk.miss_probability(1.0, 1.0, Decimal(0)), "threshold"),
        (lambda: risk.YearToDate(covered=2, resolved=2, pending=1, elapsed_days=1,
                                 remaining_days=1), "exceed covered"),
        (lambda: risk.RatePrior(shape=0, rate=1), "shape"),
    ],
)
def test_bad_input_is_refused_naming_the_field(build, match) -> None:
    with pytest.raises(ValueError, match=match):
        build()


# --------------------------------------------------------------------------- forecast


CASES = [
    risk.YearToDate(covered=20, resolved=17, pending=1, elapsed_days=100, remaining_days=265),
    risk.YearToDate(covered=0, resolved=0, pending=0, elapsed_days=0, remaining_days=365),
    risk.YearToDate(covered=40, resolved=37, pending=0, elapsed_days=300, remaining_days=65),
    risk.YearToDate(covered=10, resolved=8, pending=2, elapsed_days=365, remaining_days=0),
]


@pytest.mark.parametrize("ytd", CASES)
def test_forecast_exact_and_monte_carlo_agree(ytd) -> None:
    prior = risk.RatePrior.from_mean(0.15)
    live = risk.LivePrior(a=9.5, b=0.5)
    exact = risk.forecast_year(ytd, T90, prior, live)
    mc = risk.forecast_year_monte_carlo(ytd, T90, prior, live, samples=200_000, seed=3)
    assert exact.method == "exact" and mc.method == "monte_carlo"
    assert abs(exact.p_miss - mc.p_miss) <= 4 * mc.standard_error
    assert exact.expected_covered_at_end == pytest.approx(mc.expected_covered_at_end)


def test_forecast_of_a_finished_year_is_its_verdict() -> None:
    prior = risk.RatePrior.from_mean(1.0)
    met = risk.YearToDate(covered=10, resolved=9, pending=0, elapsed_days=365, remaining_days=0)
    missed = risk.YearToDate(covered=9, resolved=8, pending=0, elapsed_days=365, remaining_days=0)
    none = risk.YearToDate(covered=0, resolved=0, pending=0, elapsed_days=365, remaining_days=0)
    assert risk.forecast_year(met, T90, prior).p_miss == 0.0
    assert risk.forecast_year(missed, T90, prior).p_miss == 1.0
    assert risk.forecast_year(none, T90, prior).p_miss == 0.0
    assert risk.forecast_year(missed, T90, prior).already_decided
    # Two pending failures at the end: missed unless both resolve (8+2 of 10 meets 90%,
    # 9 of 10 too; 8 of 10 misses): P = 1 - P(both) under Beta(9.5 + 8, 0.5).
    two = risk.YearToDate(covered=10, resolved=8, pending=2, elapsed_days=365, remaining_days=0)
    a, b = 9.5 + 8, 0.5
    p_none_fail = (a * (a + 1)) / ((a + b) * (a + b + 1))
    p_one = 2 * a * b / ((a + b) * (a + b + 1))
    assert risk.forecast_year(two, T90, risk.RatePrior.from_mean(0.1)).p_miss == pytest.approx(
        1 - p_none_fail - p_one
    )


def test_forecast_moves_with_the_year_to_date() -> None:
    prior = risk.RatePrior.from_mean(0.1)
    good = risk.YearToDate(covered=30, resolved=30, pending=0, elapsed_days=180, remaining_days=185)
    bad = risk.YearToDate(covered=30, resolved=24, pending=0, elapsed_days=180, remaining_days=185)
    assert risk.forecast_year(good, T90, prior).p_miss < 0.05
    assert risk.forecast_year(bad, T90, prior).p_miss > 0.8


def test_forecast_is_calibrated_on_simulated_years() -> None:
    """Years drawn with known rates (from the priors): forecasts match frequencies.

    Tolerances come from the sample: the number of missed years must lie within 3
    standard deviations of the sum of the forecasts (sqrt of sum p(1-p)), and every bin
    with at least 100 years within 3.5 of its own standard errors (ten bins).
    """
    table = risk.calibration_table(years=1500, seed=20261130)
    assert table["years"] == 1500
    assert abs(table["missed"] - table["sum_forecast"]) <= 3 * table["sum_standard_error"]
    checked = 0
    for row in table["rows"]:
        if row["years"] >= 100:
            checked += 1
            assert abs(row["observed"] - row["mean_forecast"]) <= 3.5 * row["standard_error"], row
    assert checked >= 3
    # Better than always forecasting the base rate (a forecast that knows nothing).
    base = table["missed"] / table["years"]
    assert table["brier"] < base * (1 - base)


# --------------------------------------------------------------------------- launch figures


def test_launch_figures_reproduced_and_inconsistency_stated() -> None:
    rows = {r["figure"]: r for r in risk.launch_figures()}
    day = rows["~3 h of progress lost per day on 1,024 GPUs with checkpoint-restart"]
    assert day["ours"] == f"{24 / 7.9 * 1.0:.2f} h/day" and day["consistent"]
    live = rows["under 10 min per day with live migration"]
    assert live["ours"].startswith(f"{24 / 7.9:.1f} min/day") and live["consistent"]
    proj = rows["MTTF 0.23 h projected on 131,072 GPUs"]
    assert not proj["consistent"]
    waste = rows["over $6M a year of waste on 2,048 H200s"]
    assert waste["consistent"] and "$1.83/GPU-hour" in waste["ours"]
    cheap = {r["figure"]: r for r in risk.launch_figures(
        risk.LaunchAssumptions(h200_gpu_hour_price=Decimal("1.50")))}
    assert not cheap["over $6M a year of waste on 2,048 H200s"]["consistent"]


def test_simulate_uses_the_same_mix() -> None:
    from yoco import simulate

    assert simulate.CLASS_MIX == risk.CLASS_MIX
    assert dict(simulate.CAUSES) == dict(risk.CAUSE_MIX)
    assert dict(simulate.OUTCOME_MIX) == dict(risk.OUTCOME_MIX)
