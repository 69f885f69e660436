"""Readable terminal output of the figures (the CLI's tables)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def sla_table(report: Any) -> Table:
    """A two-column table of one period's figures, with the verdict in words."""
    j = report.to_json()
    if report.month:
        title = f"{j['contract_id']} ({j['customer']}) — month {j['month']}"
    else:
        title = f"{j['contract_id']} ({j['customer']}) — contract year {j['year']}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("figure", style="bold")
    table.add_column("value")
    rate = j["resolution_rate"]
    rate_text = (
        "no covered failures"
        if rate is None
        else f"{float(rate) * 100:.2f}% ({j['resolved_failures']} of {j['covered_failures']})"
    )
    met = j["guarantee_met"]
    verdict = "[green]met[/]" if met else "[red]not met[/]"
    rows = [
        (
            "period",
            f"{j['period_start']} → {j['period_end']} (UTC; contract time zone {j['timezone']})",
        ),
        ("covered failures", str(j["covered_failures"])),
        ("resolved (live-migrated, no lost progress)", str(j["resolved_failures"])),
        (
            "rolled back / failed / pending",
            f"{j['rolled_back_failures']} / {j['failed_failures']} / {j['pending_failures']}",
        ),
        ("excluded / not covered", f"{j['excluded_failures']} / {j['not_covered_failures']}"),
        ("resolution rate", rate_text),
        (f"guarantee (≥ {j['threshold_percent']}%)", verdict),
        ("allocated GPU-hours", j["allocated_gpu_hours"]),
        ("lost GPU-hours", j["lost_gpu_hours"]),
        ("goodput", j["goodput"]),
    ]
    credit = j.get("credit")
    if credit:
        rows.append(
            ("credit", f"{credit.get('amount')} {credit.get('currency')} ({credit.get('status')})")
        )
    else:
        rows.append(("credit", "none"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_sla(console: Console, report: Any) -> None:
    """Print one period's figures as a table."""
    console.print(sla_table(report))
