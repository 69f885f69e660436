"""Configuring destinations: clear refusals that write nothing, the SSRF guard, the CLI."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from alerts.config import check_webhook_url, unsafe_reason
from alerts.errors import BadDestination, UnsafeAddress
from alerts.services import add_email, add_webhook
from tests.alerts.conftest import SECRET
from tests.billing.conftest import AFTER_Y1, add_contract, failures, ingest_records
from yoco.cli import build_app
from yoco.database import unit_of_work

app = build_app()
runner = CliRunner()


def yoco(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


def _count(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM alert_destinations")).scalar_one()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://hooks.example/x", "scheme must be http or https"),
        ("http://user:pw@127.0.0.1/x", "credentials in the URL"),
        ("http:///nohost", "no host"),
        ("http://127.0.0.1:99999/x", "bad port"),
        ("http://127.0.0.1/x#frag", "fragment"),
        (" http://127.0.0.1/x", "expected an http"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://169.254.10.1/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://no-such-host.invalid/", "cannot resolve"),
    ],
)
def test_bad_webhook_urls_are_refused_naming_the_field(engine, url: str, match: str) -> None:
    with pytest.raises(BadDestination, match=match) as info, unit_of_work(engine) as s:
        add_webhook(s, name="bad", url=url, secret=SECRET)
    assert str(info.value).startswith("url:")
    assert _count(engine) == 0


def test_a_name_resolving_to_a_metadata_address_is_refused() -> None:
    with pytest.raises(UnsafeAddress, match=r"169\.254\.169\.254"):
        check_webhook_url("http://metadata.internal/", resolve=lambda h: ["169.254.169.254"])
    # Loopback and private networks are allowed (receivers on the operator's network).
    for ip in ("127.0.0.1", "10.1.2.3", "192.168.0.9", "::1", "fd12::1"):
        assert unsafe_reason(ip) is None
    assert check_webhook_url("http://x.example/", allow_unsafe=True) == "http://x.example/"


def test_the_unsafe_address_override_is_explicit_and_stored(engine) -> None:
    with unit_of_work(engine) as s:
        dest, _ = add_webhook(s, name="meta", url="http://169.254.169.254/", secret=SECRET,
                              allow_unsafe_address=True)
        assert dest.allow_unsafe_address


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"name": ""}, "name:"),
        ({"name": "has space"}, "name:"),
        ({"secret": "short"}, "secret:"),
        ({"events": ["year_at_risk", "nope"]}, "events: unknown event kind"),
        ({"customer": "nobody"}, "customer: no contract"),
    ],
)
def test_bad_webhook_fields_are_refused(engine, receiver, over, match) -> None:
    args = {"name": "ok", "url": receiver.url, "secret": SECRET, **over}
    with pytest.raises(BadDestination, match=match), unit_of_work(engine) as s:
        add_webhook(s, **args)
    assert _count(engine) == 0


def test_a_duplicate_name_is_refused(engine, receiver) -> None:
    with unit_of_work(engine) as s:
        add_webhook(s, name="ops", url=receiver.url, secret=SECRET)
    with pytest.raises(BadDestination, match="exists already"), unit_of_work(engine) as s:
        add_webhook(s, name="ops", url=receiver.url, secret=SECRET)
    assert _count(engine) == 1


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"host": "bad host!"}, "host:"),
        ({"port": 0}, "port:"),
        ({"port": 70000}, "port:"),
        ({"mail_from": "not-an-address"}, "from:"),
        ({"mail_to": []}, "to: at least one"),
        ({"mail_to": ["ok@x.example", "bad"]}, r"to\[1\]"),
        ({"username": "u"}, "password_env: give both"),
        ({"username": "u", "password_env": "1BAD"}, "password_env: not an environment"),
        ({"host": "169.254.169.254"}, "host: .*metadata"),
    ],
)
def test_bad_email_fields_are_refused(engine, over, match) -> None:
    args = {"name": "mail", "host": "127.0.0.1", "port": 25, "mail_from": "a@b.example",
            "mail_to": ["c@d.example"], **over}
    with pytest.raises(BadDestination, match=match), unit_of_work(engine) as s:
        add_email(s, **args)
    assert _count(engine) == 0


def test_cli_configure_test_list_deliveries_and_replay(yoco_env, engine, receiver) -> None:
    out = yoco("alerts", "add-webhook", "ops", "--url", receiver.url)
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    receiver.secret = secret
    listed = json.loads(yoco("alerts", "destinations", "--json"))
    assert [d["name"] for d in listed] == ["ops"]
    assert secret not in json.dumps(listed)  # never shown again, only a fingerprint
    assert "delivered" in yoco("alerts", "test", "ops")
    [req] = receiver.requests
    assert req.signature_ok and req.json["kind"] == "test"
    # A failing receiver: the test exits 1 and the failure is in the log.
    receiver.fail(100, 500)
    monkey = {"YOCO_ALERTS_MAX_ATTEMPTS": "2", "YOCO_ALERTS_BACKOFF_S": "0.01",
              "YOCO_ALERTS_BACKOFF_CAP_S": "0.01"}
    import os

    from yoco.settings import get_settings

    os.environ.update(monkey)
    get_settings.cache_clear()
    try:
        out = yoco("alerts", "test", "ops", code=1)
        assert "FAILED after 2 attempt(s)" in out and "HTTP 500" in out
        rows = json.loads(yoco("alerts", "deliveries", "--status", "failed", "--json"))
        assert len(rows) == 1 and rows[0]["attempts"] == 2
        failed_id = rows[0]["id"]
        shown = json.loads(yoco("alerts", "deliveries", "--id", str(failed_id), "--json"))
        assert [a["status_code"] for a in shown["attempts"]] == [500, 500]
        receiver.fail(0)
        assert "delivered" in yoco("alerts", "replay", str(failed_id))
        assert receiver.requests[-1].headers["Idempotency-Key"] == \
            receiver.requests[-2].headers["Idempotency-Key"]
        # The replay is audited: who asked, from where; shown with the delivery.
        shown = json.loads(yoco("alerts", "deliveries", "--id", str(failed_id), "--json"))
        [asked] = shown["replays"]
        assert asked["via"] == "cli" and asked["requested_by"]
        assert shown["attempts"][-1]["ok"] and shown["attempts"][-1]["replay"]
        assert "replay asked by" in yoco("alerts", "deliveries", "--id", str(failed_id))
        assert yoco("alerts", "replay", "--failed").strip() == "nothing to replay"
        yoco("alerts", "replay", "999999", code=2)
        yoco("alerts", "replay", code=2)
    finally:
        for k in monkey:
            os.environ.pop(k, None)
        get_settings.cache_clear()
    yoco("alerts", "test", "nobody", code=2)
    events = json.loads(yoco("alerts", "list", "--json"))
    assert [e["kind"] for e in events] == ["test", "test"]


def test_cli_refuses_bad_config_with_exit_2_and_writes_nothing(yoco_env, engine) -> None:
    out = yoco("alerts", "add-webhook", "meta", "--url", "http://169.254.169.254/x", code=2)
    assert "url:" in out and "metadata" in out
    out = yoco("alerts", "add-email", "m", "--host", "127.0.0.1", "--from", "bad",
               "--to", "a@b.example", code=2)
    assert "from:" in out
    assert _count(engine) == 0


def test_cli_help_explains_every_command(yoco_env) -> None:
    top = yoco("alerts", "--help")
    for cmd in ("add-webhook", "add-email", "destinations", "list", "deliveries", "replay",
                "test", "run", "disable", "enable"):
        assert cmd in top
        assert "Usage" in yoco("alerts", cmd, "--help")


def test_close_due_runs_the_alerts_like_the_scheduler(yoco_env, engine, smtp) -> None:
    add_contract(engine, "C-1")
    recs, _ = failures("C-1", resolved=8, unresolved=1)
    ingest_records(engine, recs)
    yoco("alerts", "add-email", "oncall", "--host", smtp.host, "--port", str(smtp.port),
         "--from", "yoco@v.example", "--to", "oncall@v.example", "--event", "year_missed",
         "--event", "credit_issued")
    out = yoco("billing", "close-due", "--now", AFTER_Y1.isoformat())
    assert "alerts: 2 new event(s); 2 delivered, 0 failed" in out
    subjects = sorted(m.content.decode() for m in smtp.messages)
    assert len(subjects) == 2
    assert any("guarantee missed" in s for s in subjects)
    assert any("CN-C-1-Y1" in s for s in subjects)
    out = yoco("alerts", "run", "--now", AFTER_Y1.isoformat())
    assert "alerts: 0 new event(s); 0 delivered, 0 failed" in out
    assert len(smtp.messages) == 2


def test_the_serve_scheduler_runs_the_alerts_after_each_close_due_run(
        yoco_env, engine, receiver) -> None:
    from yoco.app import App
    from yoco.scheduler import CloseDueScheduler

    add_contract(engine, "C-1")  # from 2025-01-01: year 1 has ended by now
    recs, _ = failures("C-1", resolved=8, unresolved=1)
    ingest_records(engine, recs)
    with unit_of_work(engine) as s:
        add_webhook(s, name="ops", url=receiver.url, secret=SECRET,
                    events=["year_missed", "credit_issued"])
    ctx = App()
    try:
        sched = CloseDueScheduler(ctx, 3600)
        assert sched.run_once().credits_issued == 1
        run = sched.alerts_once()
        assert run.detect is not None and run.detect.ran
        kinds = {k.split(":")[0] for k in run.detect.raised}
        assert {"credit_issued", "year_missed"} <= kinds
        assert sorted(r.json["kind"] for r in receiver.requests) == [
            "credit_issued", "year_missed"]
        assert all(r.signature_ok for r in receiver.requests)
        assert sched.alerts_once().sent == []  # once
    finally:
        ctx.close()
