"""Stored text in the monthly report and the year-end statement is bidi-isolated: a U+202E (RIGHT-TO-LEFT OVERRIDE), a U+2066 (LEFT-TO-RIGHT ISOLATE) left open or
an invisible U+200F (RIGHT-TO-LEFT MARK) in a customer name, a contract id, a job, a node
or an exclusion's reason cannot reorder the words the report writes around it, in the
HTML or in the PDF (read back with pdftotext, as a reader's viewer lays it out).

Real PostgreSQL, the real ingest path, the real renderer."""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ledger.checkpoints import latest
from reports import monthly as rm
from reports.render import isolated
from tests import factories as fx
from tests.reports import scenarios as sc
from tests.reports.pdfcheck import pdf_text
from yoco.database import unit_of_work
from yoco_records.textsafe import isolate

RLO, LRI, RLM, ZWSP, FSI, PDI = "\u202e", "\u2066", "\u200f", "\u200b", "\u2068", "\u2069"
#: An override that would reverse everything after the name, a mark, a zero-width space.
CUSTOMER = f"Acme{ZWSP} {RLM}{RLO}Labs"
#: An isolate opened and never closed, and an override.
CID = f"C-{LRI}{RLO}evil{ZWSP}"
#: The controls whose reach the report must bound.
_CONTROLS = (RLO, LRI)
_OPENERS = ("\u2066", "\u2067", FSI)


def _every_control_is_isolated(html: str) -> int:
    """How many bidi controls the page shows; fails on one outside an isolate the page
    itself opened (FSI ... PDI) and on an isolate left open."""
    depth = 0
    seen = 0
    for ch in html:
        if ch in _CONTROLS:
            seen += 1
            assert depth > 0, "a bidi control outside any isolate"
        if ch in _OPENERS:
            depth += 1
        elif ch == PDI:
            assert depth > 0, "a PDI closing nothing"
            depth -= 1
    assert depth == 0, "an isolate left open"
    return seen


def _visible(html: str) -> str:
    """The page without its figures block (machine-read JSON, never shown) and without
    the signed note's <pre> (shown exactly as signed: its lines are bidi paragraphs of
    their own)."""
    html = re.sub(r'<script type="application/json".*?</script>', "", html, flags=re.S)
    return re.sub(r'<pre class="note"[^>]*>.*?</pre>', "", html, flags=re.S)


def _records() -> list[dict[str, Any]]:
    t = fx.T0  # 2026-03-02 12:00 UTC
    job = f"j{RLO}1"
    failure = fx.rec("failure", CID, t + timedelta(days=1), job_id=job,
                     failure_class="unplanned", cause="gpu_lost", node=f"node-{RLO}7", gpu=3)
    excluded = fx.rec("failure", CID, t + timedelta(days=2), job_id=job,
                      failure_class="unplanned", cause="gpu_lost", node="node-2", gpu=1)
    return [
        fx.rec("job_started", CID, t, job_id=job, gpus=8),
        failure,
        fx.rec("outcome", CID, t + timedelta(days=1, seconds=30),
               failure_event_id=failure["event_id"], outcome="live_migrated", lost_steps=0,
               recovery_seconds=4.5, step_seconds=2.0, gpus_affected=8),
        excluded,
        fx.rec("exclusion", CID, t + timedelta(days=3), failure_event_id=excluded["event_id"],
               reason=f"maintenance {RLO}wodniw", approved_by=f"ops{RLO}1"),
    ]


def test_monthly_report_isolates_every_stored_string_in_html_and_pdf(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    seed([fx.contract(CID, customer=CUSTOMER)], _records())
    with unit_of_work(app_ctx.engine) as s:
        cp = latest(s, CID)
        assert cp is not None
        report = rm.build_monthly_report(s, CID, 2026, 3, cp.tree_size)
    html = report.html
    # Every override and isolate opener of the stored text sits inside an isolate.
    assert _every_control_is_isolated(_visible(html)) >= 8
    assert (f"<title>Monthly SLA report — {isolate(CUSTOMER)} — March 2026</title>"
            in html)
    # in the body, a <bdi> around the isolate: WeasyPrint loses the FSI of a line broken
    # inside it, the element still bounds the override
    assert f'<span class="s-customer"><bdi>{isolate(CUSTOMER)}</bdi></span>' in html
    assert f'<span class="s-contract">{isolated(CID)}</span>' in html
    # an isolate left open in the id is closed before the wrapper's own PDI
    assert isolate(CID) == f"{FSI}C-{LRI}{RLO}evil{ZWSP}{PDI}{PDI}"
    # the exclusion's reason and approver each in their own isolate, the words between
    # them the report's own
    assert (f"excluded: {isolated(f'maintenance {RLO}wodniw')} (approved by "
            f"{isolated(f'ops{RLO}1')})") in html
    # The signed note is shown exactly as signed (a copy of it verifies) ...
    note = re.search(r'<pre class="note"[^>]*>(.*?)</pre>', html, re.S)
    assert note is not None and htmllib.unescape(note.group(1)) == report.checkpoint_note
    # ... and the invisible characters that cannot reorder anything are kept as written.
    assert ZWSP in html and RLM in html

    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(report.pdf)
    text = pdf_text(pdf)
    # The header line: an override in the name reversed everything after it
    # ("6202 hcraM · ... tcartnoc ·") before the isolation; inside the isolate the name
    # is shown as its own override says ("sbaL").
    assert "Acme sbaL · contract C-live · March 2026" in text, text
    assert "hcraM" not in text and "tcartnoc" not in text
    # The exclusion's line wraps inside the reason: still "(approved by ...); outcome".
    assert "(approved by ops1); outcome: pending" in text, text
    assert "yb devorppa" not in text and "6202" not in text


def test_year_statement_isolates_the_customer_and_contract(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path
) -> None:
    from billing.closing import close_year
    from reports.statement import build_year_statement

    contract, records = sc.closed_year(CID)
    contract["customer"] = CUSTOMER
    seed([contract], records)
    with unit_of_work(app_ctx.engine) as s:
        close_year(s, CID, 1, signer=app_ctx.signer, origin_prefix=app_ctx.settings.log_origin)
    with unit_of_work(app_ctx.engine) as s:
        st = build_year_statement(s, CID, 1)
    html = st.html_bytes.decode()
    assert _every_control_is_isolated(_visible(html)) >= 4
    assert (f"<title>Year-end statement — {isolate(CUSTOMER)} — contract year 1</title>"
            in html)
    # the credit note number holds the contract id: isolated too
    assert f"<strong>{isolated(f'CN-{CID}-Y1')}</strong>" in html
    pdf = tmp_path / "statement.pdf"
    pdf.write_bytes(st.pdf)
    text = pdf_text(pdf)
    assert "Acme sbaL · contract C-live · contract year 1" in text, text
    assert "tcartnoc" not in text
