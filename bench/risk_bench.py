"""Risk-model benchmark: simulated contract years per second (DESIGN §6: 10,000 < 1 s).

Usage::

    python bench/risk_bench.py --years 10000 --repeat 5

Times, for several contract mixes, ``billing.risk.simulate_years`` (the vectorised Monte
Carlo behind ``yoco risk price``: per contract year, Poisson failures per job kind, one
multinomial split into class × covered × live, rollback losses) and the whole
``billing.risk.evaluate`` (exact figures plus the same Monte Carlo); then the forecast
(``forecast_year``, exact) of one open year and its Monte Carlo twin.  Prints the median
of ``--repeat`` runs and the load average.  No database.  ``--calibration N`` also prints
the forecast's reliability table over N simulated years (docs/risk.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from billing import risk

MIXES = {
    "1 x 1,024-GPU job all year (~1,100 failures/year)": (risk.JobKind(gpus=1024),),
    "1 x 2,048-GPU job all year (~1,600 failures/year)": (risk.JobKind(gpus=2048),),
    "mixed cluster: 4x2048 + 8x512 + 40x64 + 100x8 (~9,700 failures/year)": (
        risk.JobKind(gpus=2048, count=4),
        risk.JobKind(gpus=512, count=8, hours=6000.0),
        risk.JobKind(gpus=64, count=40, hours=5000.0),
        risk.JobKind(gpus=8, count=100, hours=4000.0),
    ),
    "small: 2x256 GPUs, 2,000 h (~30 failures/year)": (
        risk.JobKind(gpus=256, count=2, hours=2000.0),
    ),
}


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    """Run the benchmark and print one line per measurement."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--years", type=int, default=10_000, help="simulated contract years per run")
    p.add_argument("--repeat", type=int, default=5, help="runs per measurement (median)")
    p.add_argument("--calibration", type=int, default=0, help="also print the reliability "
                   "table over this many simulated years")
    a = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    risk.simulate_years(risk.RiskModel(jobs=(risk.JobKind(gpus=8),)), 10, 0)  # warm up
    for name, jobs in MIXES.items():
        model = risk.RiskModel(jobs=jobs, gpu_hour_price=Decimal("2.50"))
        sim = _median(lambda m=model: risk.simulate_years(m, a.years, 1), a.repeat)
        ev = _median(lambda m=model: risk.evaluate(m, samples=a.years, seed=1), a.repeat)
        res = risk.evaluate(model, samples=a.years, seed=1)
        print(
            f"RISK {name}: simulate_years({a.years:,}) {sim * 1000:.0f} ms "
            f"({a.years / sim:,.0f} contract-years/s); evaluate {ev * 1000:.0f} ms; "
            f"P(miss) exact {res.exact['p_miss']:.4f}, MC {res.monte_carlo['p_miss']:.4f} "
            f"± {res.monte_carlo['p_miss_standard_error']:.4f} (goal: {a.years:,} < 1 s)"
        )
    ytd = risk.YearToDate(covered=400, resolved=366, pending=2, elapsed_days=180,
                          remaining_days=185)
    prior = risk.RatePrior.from_mean(2.0)
    ex = _median(lambda: risk.forecast_year(ytd, Decimal(90), prior), a.repeat)
    mc = _median(lambda: risk.forecast_year_monte_carlo(ytd, Decimal(90), prior,
                                                        samples=a.years), a.repeat)
    f = risk.forecast_year(ytd, Decimal(90), prior)
    print(f"FORECAST one open year (400 covered so far, ~810 expected): exact {ex * 1000:.1f} ms "
          f"(p_miss {f.p_miss:.4f}); Monte Carlo of {a.years:,} years {mc * 1000:.1f} ms")
    if a.calibration:
        t = time.perf_counter()
        table = risk.calibration_table(years=a.calibration, seed=20261130)
        print(f"CALIBRATION over {a.calibration:,} simulated years "
              f"({time.perf_counter() - t:.1f} s):")
        print("| forecast | years | mean forecast | observed | ± s.e. |")
        print("|---|---|---|---|---|")
        for r in table["rows"]:
            if r["years"]:
                print(f"| {r['from']:.1f}–{r['to']:.1f} | {r['years']} | "
                      f"{r['mean_forecast']:.3f} | {r['observed']:.3f} | "
                      f"{r['standard_error']:.3f} |")
        print(f"missed {table['missed']} vs sum of forecasts {table['sum_forecast']:.1f} "
              f"± {table['sum_standard_error']:.1f}; Brier {table['brier']:.4f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
