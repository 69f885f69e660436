"""Issued reports e-mailed to the contract's subscribers: with
``YOCO_ALERTS_REPORT_EMAILS`` on, every issued report raises one ``report_issued`` event,
delivered through the alerts' e-mail sender to the destinations that name the kind and may
see the contract, with the issued PDF and HTML attached as stored (their SHA-256 are the
ledger's). Off by default. One subscriber's broken SMTP server stops no other delivery.
Real PostgreSQL, a real SMTP server (aiosmtpd), the real renderer."""

from __future__ import annotations

import email
import email.policy
import hashlib
import socket
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from typer.testing import CliRunner

from alerts.config import AlertsConfig
from alerts.services import add_email
from reports import issued as ri
from tests.alerts.conftest import FakeSleep, Smtp, no_sleep, smtp
from tests.reports import scenarios as sc
from tests.reports.conftest import app_ctx, seed
from yoco.alerting import run_alerts
from yoco.database import unit_of_work

__all__ = ["app_ctx", "no_sleep", "seed", "smtp"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reports_sent(smtp: Smtp) -> list[Any]:
    """The report_issued e-mails the server received (other alerts go out too)."""
    return [env for env in smtp.messages
            if email.message_from_bytes(env.content)["X-Yoco-Event"] == "report_issued"]


def _events(engine: Any) -> list[tuple[str, str]]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT kind, key FROM alert_events WHERE kind = 'report_issued' ORDER BY id"))]


def test_an_issued_report_is_emailed_to_the_contracts_subscribers_with_its_files(
    seed: Callable[..., None], app_ctx: Any, smtp: Smtp, no_sleep: FakeSleep
) -> None:
    quiet, recs = sc.quiet()  # customer "Quiet Labs GmbH"
    other, more = sc.closed_year()  # customer "Closed Year Ltd"
    seed([quiet, other], recs + more)
    with unit_of_work(app_ctx.engine) as s:
        issued = ri.issue_month(s, "C-QUIET", 2026, 3)
        for name, customer, events, port in [
            ("quiet-reports", "Quiet Labs GmbH", ["report_issued"], smtp.port),  # subscriber
            ("quiet-broken", "Quiet Labs GmbH", ["report_issued"], _closed_port()),
            ("quiet-alerts", "Quiet Labs GmbH", None, smtp.port),  # every kind but opt-in
            ("closed-reports", "Closed Year Ltd", ["report_issued"], smtp.port),  # other tenant
            ("operator-all", None, None, smtp.port),
        ]:
            add_email(s, name=name, host=smtp.host, port=port, mail_from="yoco@vendor.example",
                      mail_to=[f"{name}@example.com"], customer=customer, events=events)
    report = issued

    # Off (the default): no event, nothing sent.
    run_alerts(app_ctx.engine, AlertsConfig(), sleep=no_sleep)
    assert _events(app_ctx.engine) == [] and _reports_sent(smtp) == []

    # On: one event, delivered to the subscriber with both files; the broken subscriber's
    # delivery fails on its own.
    run = run_alerts(app_ctx.engine, AlertsConfig(report_emails=True), sleep=no_sleep)
    assert [k for k, _ in _events(app_ctx.engine)] == ["report_issued"]
    by_dest = {d.destination: d.status for d in run.sent}
    assert by_dest == {"quiet-reports": "delivered", "quiet-broken": "failed"}, run.sent
    [env] = _reports_sent(smtp)
    assert env.rcpt_tos == ["quiet-reports@example.com"]
    msg = email.message_from_bytes(env.content, policy=email.policy.default)
    assert msg["Subject"] == ("[yoco] C-QUIET: monthly SLA report 2026-03 issued over "
                              f"checkpoint {report.checkpoint_size}")
    files = {part.get_filename(): part.get_payload(decode=True)
             for part in msg.iter_attachments()}
    assert set(files) == {"yoco-sla-C-QUIET-2026-03.pdf", "yoco-sla-C-QUIET-2026-03.html"}
    pdf, html = files["yoco-sla-C-QUIET-2026-03.pdf"], files["yoco-sla-C-QUIET-2026-03.html"]
    assert pdf.startswith(b"%PDF-") and html.startswith(b"<!DOCTYPE html>")
    # exactly the issued bytes: their digests are the report entry's
    assert hashlib.sha256(pdf).hexdigest() == report.pdf_sha256
    assert hashlib.sha256(html).hexdigest() == report.html_sha256
    body = next(p for p in msg.walk() if p.get_content_type() == "text/plain")
    assert f'"pdf_sha256": "{report.pdf_sha256}"' in body.get_payload(decode=True).decode()

    # Raised and sent once: a second run has nothing new.
    again = run_alerts(app_ctx.engine, AlertsConfig(report_emails=True), sleep=no_sleep)
    assert again.sent == [] and len(_reports_sent(smtp)) == 1
    assert len(_events(app_ctx.engine)) == 1


def test_the_setting_turns_report_emails_on_for_yoco_alerts_run(
    seed: Callable[..., None], app_ctx: Any, smtp: Smtp, monkeypatch: Any
) -> None:
    """``YOCO_ALERTS_REPORT_EMAILS=1`` is what `yoco alerts run` (and `yoco serve`'s
    scheduler) reads."""
    from yoco.cli import build_app
    from yoco.settings import get_settings

    quiet, recs = sc.quiet()
    seed([quiet], recs)
    with unit_of_work(app_ctx.engine) as s:
        ri.issue_month(s, "C-QUIET", 2026, 3)
        add_email(s, name="quiet-reports", host=smtp.host, port=smtp.port,
                  mail_from="yoco@vendor.example", mail_to=["reports@quiet.example"],
                  customer="Quiet Labs GmbH", events=["report_issued"])
    cli = build_app()
    out = CliRunner().invoke(cli, ["alerts", "run"])
    assert out.exit_code == 0, out.output
    assert _reports_sent(smtp) == []
    monkeypatch.setenv("YOCO_ALERTS_REPORT_EMAILS", "1")
    get_settings.cache_clear()
    out = CliRunner().invoke(cli, ["alerts", "run"])
    assert out.exit_code == 0, out.output
    assert "1 delivered, 0 failed" in out.output, out.output
    [env] = _reports_sent(smtp)
    assert env.rcpt_tos == ["reports@quiet.example"]
