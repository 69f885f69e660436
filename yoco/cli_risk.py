"""``yoco risk …``: what the guarantee costs before signing, and how each open year is going.

* ``yoco risk price``: failures per year, P(missing the threshold), credits, lost
  GPU-hours with and without live migration, for a job mix (no database unless
  ``--contract`` is given).
* ``yoco risk forecast``: P(each open contract year ends below its threshold), from the
  ledger.
* ``yoco risk launch-figures``: the published launch figures reproduced from stated
  assumptions.
* ``yoco risk calibration``: the forecast's reliability table on simulated years.

Every command prints plain text, or JSON with ``--json``; ``price`` and ``forecast``
write an HTML page with an inline SVG chart with ``--html FILE``.  The model and its
assumptions: docs/risk.md.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from yoco.cli import application, fail, out, parse_now

if TYPE_CHECKING:
    from billing.risk import JobKind

risk_app = typer.Typer(
    help="Guarantee risk: price it before signing, forecast it during the year (docs/risk.md).",
    no_args_is_help=True,
)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="Also write an HTML page with a chart to FILE.")
]

_INT_FIELDS = ("gpus", "count")


def register(app: typer.Typer) -> None:
    """Add the ``risk`` command group to the ``yoco`` application."""
    app.add_typer(risk_app, name="risk")


def _write_html(path: Path, html: str) -> None:
    tmp = path.with_name(path.name + ".part")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        fail(f"--html: cannot write {path}: {exc.strerror or exc}")
    out.print(f"chart written to {path}", highlight=False, markup=False)


def parse_job(spec: str, where: str = "--job") -> JobKind:
    """A job kind from ``key=value,...`` (keys of :class:`billing.risk.JobKind`)."""
    from billing.risk import JobKind

    fields: dict[str, Any] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"{where} {spec!r}: expected key=value, got {part!r}")
        try:
            fields[key] = int(value) if key in _INT_FIELDS else float(value)
        except ValueError:
            raise ValueError(f"{where} {spec!r}: {key} must be a number, got {value!r}") from None
    return JobKind.from_json(fields, f"{where} {spec!r}")


def _pairs(text: str | None, where: str) -> dict[str, float]:
    out_: dict[str, float] = {}
    if text is None:
        return out_
    for part in text.split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"{where}: expected class=value, got {part!r}")
        try:
            out_[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{where}: {key.strip()} must be a number, got {value!r}") from None
    return out_


def _decimal(name: str, value: str | None) -> Decimal | None:
    if value is None:
        return None
    try:
        d = Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{name}: expected a decimal number, got {value!r}") from None
    if not d.is_finite() or d < 0:
        raise ValueError(f"{name}: expected a decimal number >= 0, got {value!r}")
    return d


def _load_model_file(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--model: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--model {path}: line {exc.lineno}: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"--model {path}: expected a JSON object")
    known = {
        "jobs", "classes", "live", "alpha", "mttf_hours", "ref_gpus", "terms", "currency",
        "credit_base", "gpu_hour_price", "term_years",
    }
    bad = sorted(set(obj) - known)
    if bad:
        raise ValueError(f"--model {path}: unknown field {bad[0]!r} (known: {sorted(known)})")
    return obj


@risk_app.command("price")
def price(
    job: Annotated[
        list[str] | None,
        typer.Option(
            "--job",
            help="A job kind, key=value,...: gpus (required), count, hours (running hours per "
            "contract year, default 8760), step_seconds, checkpoint_minutes (60), "
            "restart_minutes (30), migration_seconds (60). Repeat for a mix. Default: one "
            "1,024-GPU job all year.",
        ),
    ] = None,
    model_file: Annotated[
        Path | None,
        typer.Option("--model", help="A JSON model: jobs, classes, live, alpha, mttf_hours, "
                     "ref_gpus, terms, currency, credit_base, gpu_hour_price, term_years."),
    ] = None,
    contract: Annotated[
        str | None,
        typer.Option("--contract", help="Take terms, credit base, currency, GPU-hour price "
                     "and term from this contract, and each class's live probability from "
                     "its outcomes in the ledger (Beta(9.5, 0.5) prior)."),
    ] = None,
    live: Annotated[
        str | None,
        typer.Option(help="Probability each class is resolved live, e.g. "
                     "unplanned=0.9,preemptive=0.97,planned=0.99."),
    ] = None,
    classes: Annotated[
        str | None, typer.Option(help="Class mix, e.g. unplanned=0.7,preemptive=0.22,planned=0.08.")
    ] = None,
    alpha: Annotated[
        float | None,
        typer.Option(help="Exponent of the failure law (rate ∝ GPUs^alpha); default: fitted "
                     "through the published MTTFs (0.533). 1 = constant per-GPU rate."),
    ] = None,
    credit_base: Annotated[
        str | None, typer.Option(help="Renewal value a credit is a share of (default 1000000.00).")
    ] = None,
    currency: Annotated[str | None, typer.Option(help="ISO 4217 currency (default USD).")] = None,
    gpu_hour_price: Annotated[
        str | None, typer.Option(help="Price of a GPU-hour, for the cost of lost hours.")
    ] = None,
    threshold: Annotated[
        str | None, typer.Option(help="Guaranteed resolution rate, percent (default 90).")
    ] = None,
    term_years: Annotated[int | None, typer.Option(help="Contract years in the term.")] = None,
    samples: Annotated[int, typer.Option(min=100, help="Simulated contract years.")] = 20000,
    seed: Annotated[int, typer.Option(help="Seed of the Monte Carlo.")] = 1,
    as_json: JsonOpt = False,
    html: HtmlOpt = None,
) -> None:
    """Price the guarantee for a job mix: failures, P(miss), credits, lost GPU-hours.

    Exact formulas where they exist (Poisson failures, thinned into covered and
    resolved; the exact resolved × 100 ≥ covered × threshold rule), seeded Monte Carlo
    for distributions (resolution rate, lost GPU-hours, credit percentiles).
    """
    from billing import risk
    from billing.terms import Terms
    from reports.risk_html import price_page

    try:
        spec: dict[str, Any] = _load_model_file(model_file) if model_file else {}
        jobs = [risk.JobKind.from_json(j, f"--model jobs[{i}]")
                for i, j in enumerate(spec.get("jobs", []))]
        jobs += [parse_job(s) for s in job or []]
        if not jobs:
            jobs = [risk.JobKind(gpus=1024)]
        terms = Terms.from_json(spec.get("terms"))
        cur = spec.get("currency", "USD")
        base = _decimal("credit_base", spec.get("credit_base")) or Decimal("1000000.00")
        price_ = _decimal("gpu_hour_price", spec.get("gpu_hour_price"))
        term = spec.get("term_years", 1)
        live_p = {**risk.LIVE_PROBABILITY, **spec.get("live", {})}
        class_mix = {**dict(risk.CLASS_MIX), **spec.get("classes", {})}
        history: dict[str, Any] | None = None
        if contract is not None:
            history = _contract_inputs(contract)
            terms, cur, base = history["terms"], history["currency"], history["credit_base"]
            price_ = history["gpu_hour_price"] if price_ is None else price_
            term = history["term_years"]
            live_p.update(history["live"])
        live_p.update(_pairs(live, "--live"))
        class_mix.update(_pairs(classes, "--classes"))
        if threshold is not None:
            terms = Terms.from_json({**terms.to_json(), "threshold_percent": threshold})
        law_alpha = alpha if alpha is not None else spec.get("alpha")
        law = risk.FailureLaw.fit()
        if law_alpha is not None or "mttf_hours" in spec or "ref_gpus" in spec:
            law = risk.FailureLaw(
                ref_gpus=spec.get("ref_gpus", law.ref_gpus),
                mttf_hours=spec.get("mttf_hours", law.mttf_hours),
                alpha=law.alpha if law_alpha is None else law_alpha,
            )
        model = risk.RiskModel(
            jobs=tuple(jobs),
            law=law,
            mix=risk.ClassMix(classes=class_mix, live=live_p),
            terms=terms,
            currency=cur if currency is None else currency,
            credit_base=base if credit_base is None else _decimal("--credit-base", credit_base)
            or Decimal(0),
            gpu_hour_price=price_ if gpu_hour_price is None
            else _decimal("--gpu-hour-price", gpu_hour_price),
            term_years=term if term_years is None else term_years,
        )
        result = risk.evaluate(model, samples=samples, seed=seed)
    except ValueError as exc:
        fail(str(exc))
    body = result.to_json()
    if history is not None:
        body["contract"] = {"contract_id": contract, "live_history": history["counts"]}
    if as_json:
        print(json.dumps(body, indent=2))
    else:
        _print_price(body)
    if html is not None:
        _write_html(html, price_page(body))


def _contract_inputs(contract_id: str) -> dict[str, Any]:
    """Terms, money and per-class live probabilities of a contract, from the ledger."""
    from billing.amendments import contract_in_force
    from billing.forecast import DEFAULT_LIVE_PRIOR, live_history
    from billing.services import current_year
    from yoco.cli import _unit

    now = datetime.now(UTC)

    def run(session: Any) -> dict[str, Any]:
        base = contract_in_force(session, contract_id, 1)
        k = current_year(base.contract, now)
        in_force = base if k == 1 else contract_in_force(session, contract_id, k)
        counts = live_history(session, contract_id, now=now)
        return {"in_force": in_force, "counts": counts}

    with application() as ctx:
        got = _unit(ctx, run)
    c = got["in_force"].contract
    a, b = DEFAULT_LIVE_PRIOR.a, DEFAULT_LIVE_PRIOR.b
    live = {
        cls: (a + n["live"]) / (a + b + n["with_outcome"]) for cls, n in got["counts"].items()
    }
    return {
        "terms": got["in_force"].terms,
        "currency": c.currency,
        "credit_base": c.credit_base,
        "gpu_hour_price": c.gpu_hour_price,
        "term_years": got["in_force"].term_years,
        "live": live,
        "counts": got["counts"],
    }


def _print_price(j: dict[str, Any]) -> None:
    ex, mc, law = j["exact"], j["monte_carlo"], j["law"]
    cur = j["currency"]
    lines = [
        f"failure law: rate per job ∝ GPUs^{law['alpha']:.3f} (MTTF {law['mttf_hours']:.2f} h "
        f"at {law['ref_gpus']:,} GPUs)",
    ]
    for p in j["per_job"]:
        lines.append(
            f"  {p['count']} × {p['gpus']:,} GPUs: MTTF {p['mttf_hours']:.2f} h, "
            f"{p['failures_per_year']:,.1f} failures/year; lost progress per job-day "
            f"{p['lost_progress_hours_per_day_restart']:.2f} h with checkpoint-restart, "
            f"{p['lost_progress_hours_per_day_live'] * 60:.1f} min with live migration"
        )
    lines += [
        f"expected failures per contract year: {ex['expected_failures']:,.1f} "
        f"({ex['covered_share']:.1%} covered)",
        f"covered failures: mean {ex['expected_covered_failures']:,.1f}, "
        f"p5 {ex['covered_failures_p05']}, p50 {ex['covered_failures_p50']}, "
        f"p95 {ex['covered_failures_p95']}",
        f"resolved live per covered failure: {ex['resolved_share_of_covered']:.2%} "
        f"(threshold {j['terms']['threshold_percent']}%)",
        f"resolution rate (Monte Carlo): p5 {_pct(mc['resolution_rate_p05'])}, "
        f"p50 {_pct(mc['resolution_rate_p50'])}, p95 {_pct(mc['resolution_rate_p95'])}; "
        f"no covered failure in {mc['p_no_covered_failures']:.2%} of years",
        f"P(year below the threshold): {ex['p_miss']:.4%} exact; "
        f"{mc['p_miss']:.4%} ± {mc['p_miss_standard_error']:.4%} Monte Carlo "
        f"({mc['samples']:,} years, seed {mc['seed']})",
        f"credit if missed: {ex['credit_if_missed']} {cur}; expected per year "
        f"{ex['expected_credit_per_year']} {cur}, p95 {ex['credit_p95_per_year']} {cur}",
        f"over the {j['term_years']}-year term: expected {ex['expected_credit_over_term']} {cur}, "
        f"p95 {ex['credit_p95_over_term']} {cur}",
        f"lost GPU-hours per year with live migration: mean "
        f"{ex['expected_lost_gpu_hours_live']:,.0f}, p95 {mc['lost_gpu_hours_live_p95']:,.0f}",
        f"lost GPU-hours per year with checkpoint-restart only: mean "
        f"{ex['expected_lost_gpu_hours_restart']:,.0f}, "
        f"p95 {mc['lost_gpu_hours_restart_p95']:,.0f}",
    ]
    if ex["expected_cost_live"] is not None:
        lines.append(
            f"their cost at {j['gpu_hour_price']} {cur}/GPU-hour: {ex['expected_cost_live']} "
            f"vs {ex['expected_cost_restart']} {cur} (saving {ex['expected_saving']} {cur})"
        )
    else:
        lines.append("their cost: give --gpu-hour-price (or a contract with one)")
    for line in lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.2%}"


@risk_app.command("forecast")
def forecast(
    contract: Annotated[
        str | None, typer.Option("--contract", help="Only this contract (default: every one).")
    ] = None,
    year: Annotated[
        int | None, typer.Option(help="Contract year K of --contract (default: the current one).")
    ] = None,
    now: Annotated[
        str | None, typer.Option(help="Forecast as of this instant, ISO 8601 with offset.")
    ] = None,
    by: Annotated[
        str, typer.Option(help="Order of the overview: p_miss or expected_credit.")
    ] = "p_miss",
    as_json: JsonOpt = False,
    html: HtmlOpt = None,
) -> None:
    """P(each open contract year ends below its threshold), riskiest first.

    From the year to date (covered, resolved, pending) and the contract's own rates:
    the covered-failure rate with a Gamma prior, the live-resolution probability with a
    Beta prior (docs/risk.md).  The verdict itself is decided only at the year's close.
    """
    from billing.forecast import forecast_contract_year, open_year_forecasts
    from reports.risk_html import forecast_page
    from yoco.cli import _unit

    if year is not None and contract is None:
        fail("--year needs --contract")
    if by not in ("p_miss", "expected_credit"):
        fail(f"--by must be p_miss or expected_credit, got {by!r}")
    at = parse_now(now)
    with application() as ctx:
        if contract is not None and year is not None:
            rows = [_unit(ctx, lambda s: forecast_contract_year(s, contract, year, now=at))]
        else:
            ids = None if contract is None else [contract]
            if contract is not None:
                from ledger.contracts import get_contract

                _unit(ctx, lambda s: get_contract(s, contract))
            rows = _unit(ctx, lambda s: open_year_forecasts(s, now=at, contract_ids=ids))
    if by == "expected_credit":
        rows.sort(key=lambda f: (-f.expected_credit, -f.p_miss, f.contract_id, f.year))
    body = [r.to_json() for r in rows]
    if as_json:
        print(json.dumps(body, indent=2))
    elif not rows:
        out.print("no open contract year", highlight=False, markup=False)
    else:
        for r in body:
            out.print(
                f"{r['contract_id']} year {r['year']}: P(ends below {r['threshold_percent']}%) "
                f"{r['p_miss']:.2%} — {r['resolved_so_far']}/{r['covered_so_far']} resolved so "
                f"far ({r['pending_so_far']} pending), {r['remaining_days']:.0f} days left, "
                f"expect ~{r['expected_covered_at_end']:.0f} covered; expected credit "
                f"{r['expected_credit']} {r['currency']} (of {r['credit_if_missed']})",
                highlight=False, markup=False,
                soft_wrap=True,
            )
    if html is not None:
        _write_html(html, forecast_page(body))


@risk_app.command("launch-figures")
def launch_figures_cmd(
    checkpoint_minutes: Annotated[float, typer.Option(help="Checkpoint interval.")] = 60.0,
    restart_minutes: Annotated[float, typer.Option(help="Restart time of a rollback.")] = 30.0,
    migration_seconds: Annotated[float, typer.Option(help="Stall of a live migration.")] = 60.0,
    gpu_hour_price: Annotated[str, typer.Option(help="H200 GPU-hour price, USD.")] = "2.50",
    as_json: JsonOpt = False,
) -> None:
    """The published launch figures, the assumptions that reproduce them, our results."""
    from billing.risk import LaunchAssumptions, launch_figures

    try:
        a = LaunchAssumptions(
            checkpoint_minutes=checkpoint_minutes,
            restart_minutes=restart_minutes,
            migration_seconds=migration_seconds,
            h200_gpu_hour_price=_decimal("--gpu-hour-price", gpu_hour_price) or Decimal(0),
        )
        rows = launch_figures(a)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        mark = "consistent" if r["consistent"] else "NOT consistent"
        for line in (f"{r['figure']}: {r['ours']} [{mark}]", f"    assuming {r['assumptions']}"):
            out.print(line, highlight=False, markup=False, soft_wrap=True)


@risk_app.command("calibration")
def calibration(
    years: Annotated[int, typer.Option(min=10, help="Simulated contract years.")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the simulation.")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """The forecast's reliability table over simulated years with known rates.

    It simulates and forecasts every year (about 13 ms each): a progress bar on stderr
    (a terminal only) counts them; stdout holds the table alone.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from billing.risk import calibration_table
    from yoco import cli
    from yoco.render import UnitsColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), UnitsColumn(), TimeElapsedColumn(),
        console=cli.err, transient=True, disable=not cli.err.is_terminal,
    ) as bar:
        task = bar.add_task("simulating", total=years, unit="years")
        table = calibration_table(
            years=years, seed=seed,
            progress=lambda done, _total: bar.update(task, completed=done),
        )
    if as_json:
        print(json.dumps(table, indent=2))
        return
    head = "forecast bin   years  mean forecast  observed  ± s.e."
    out.print(head, highlight=False, markup=False)
    for r in table["rows"]:
        if r["years"] == 0:
            continue
        out.print(
            f"{r['from']:.1f}–{r['to']:.1f}      {r['years']:5d}  {r['mean_forecast']:13.3f}  "
            f"{r['observed']:8.3f}  {r['standard_error']:.3f}",
            highlight=False, markup=False,
        )
    out.print(
        f"missed years {table['missed']} vs forecast sum {table['sum_forecast']:.1f} "
        f"± {table['sum_standard_error']:.1f}; Brier score {table['brier']:.4f}",
        highlight=False, markup=False,
    )
