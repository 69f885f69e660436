"""Readable terminal output of the figures (the CLI's tables)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.progress import ProgressColumn, Task
from rich.table import Table
from rich.text import Text

from billing.verdict import Verdict, verdict_of_json
from yoco_records.textsafe import safe_text


def grouped(value: Any, places: int | None = None) -> str:
    """A decimal number with thousands separators: ``13,625,026.57`` (``places`` rounds,
    half-even; None keeps the digits given). Money keeps its currency's digits."""
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if places is not None:
        d = d.quantize(Decimal(1).scaleb(-places))
    return f"{d:,}"


def progress_units(completed: float, total: float | None, unit: str) -> str:
    """How far a progress bar is, in its unit: bytes as ``12.3 MB of 45.6 MB`` (decimal
    units, as ``ls -h --si``), anything else counted: ``1,234 of 5,000 records``."""
    from rich.filesize import decimal

    if unit == "bytes":
        done = decimal(int(completed))
        return f"{done} of {decimal(int(total))}" if total is not None else done
    done_n = f"{int(completed):,}"
    return (f"{done_n} of {int(total):,} {unit}" if total is not None else f"{done_n} {unit}")


class UnitsColumn(ProgressColumn):
    """A rich progress column that says what the bar counts (:func:`progress_units`): the
    task's ``unit`` field (``bytes``, ``records``, …; default ``items``)."""

    def render(self, task: Task) -> Text:
        """The task's progress in its unit."""
        return Text(progress_units(task.completed, task.total,
                                   str(task.fields.get("unit", "items"))))


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` whole: never cut to 80 columns when the output is not a terminal
    (a pipe or a file gets the table's natural width), and on a terminal long ids fold
    rather than end in an ellipsis.  Every cell that is plain text (a stored reason, job
    or destination) and the title go through the one neutraliser of control and bidi
    characters (:func:`yoco_records.textsafe.safe_text`) first."""
    if isinstance(table.title, str):
        table.title = safe_text(table.title)
    for column in table.columns:
        column.overflow = "fold"
        cells = column._cells  # rich keeps a column's cells here (no public setter)
        column._cells = [safe_text(c) if isinstance(c, str) else c for c in cells]
    width = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if console.is_terminal or width <= console.width:
        console.print(table)
    else:  # rich caps a print's width at the console's: print through a wide one
        Console(file=console.file, width=width, color_system=None).print(table)


def sla_table(report: Any) -> Table:
    """A two-column table of one period's figures, with the verdict in words."""
    return sla_table_json(report.to_json(), report.verdict())


def sla_table_json(j: Mapping[str, Any], v: Verdict | None = None) -> Table:
    """:func:`sla_table` of a ``yoco sla --json`` object (local, or from the API): the
    one layout of both modes.  ``v``: its verdict (default: judged again from ``j``)."""
    if v is None:
        v = verdict_of_json(j)
    if j.get("month"):
        title = f"{j['contract_id']} ({j['customer']}) — month {j['month']}"
    elif j.get("as_of") is not None:
        title = (
            f"{j['contract_id']} ({j['customer']}) — contract year {j['year']} to date, "
            f"as of {j['as_of']}"
        )
    else:
        title = f"{j['contract_id']} ({j['customer']}) — contract year {j['year']}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("figure", style="bold")
    table.add_column("value")
    colour = {"ok": "green", "warn": "yellow", "bad": "red", "none": "default"}[v.tone]
    verdict = f"[{colour}]{v.word}[/]"
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
        ("resolution rate", v.rate_with_counts),
        (f"guarantee (≥ {j['threshold_percent']} %)", verdict),
        # Six decimals as the report writes them (billing.display.hours_text), grouped.
        ("allocated GPU-hours", grouped(j["allocated_gpu_hours"])),
        ("lost GPU-hours", grouped(j["lost_gpu_hours"])),
        ("goodput", j["goodput"]),
    ]
    credit = j.get("credit")
    if credit:
        rows.append(
            ("credit", f"{_money(credit)} ({credit.get('status')})")
        )
    else:
        rows.append(("credit", "none"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _money(credit: dict[str, Any]) -> str:
    from billing.money import format_money

    if credit.get("minor_units") is not None:
        return format_money(int(credit["minor_units"]), credit["currency"], minor=True)
    return f"{credit.get('amount')} {credit.get('currency')}"


def print_sla(console: Console, report: Any) -> None:
    """Print one period's figures as a table (a report, or a ``--json`` object)."""
    if isinstance(report, Mapping):
        print_table(console, sla_table_json(report))
    else:
        print_table(console, sla_table(report))
