"""``yoco alerts …``: destinations, the event and delivery logs, replay, test, one run.

Configuration writes run in one unit of work and are refused whole (exit 2, nothing
written) when a field is bad. Sending exits 1 when a delivery failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from yoco.cli import application, err, fail, out, parse_now, print_json, shown

if TYPE_CHECKING:
    from alerts.send import Delivered

alerts_app = typer.Typer(
    help="Alerts: webhooks (HMAC-signed) and e-mail when a contract year turns at risk or "
    "is missed, a credit is issued, a checkpoint is overdue or the ledger refuses a "
    "record. See docs/alerts.md.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
CustomerOpt = Annotated[
    str | None,
    typer.Option(help="Only events of this customer's contracts go there (a tenant's own "
                 "endpoint). Default: every event (the operator's)."),
]
EventsOpt = Annotated[
    list[str] | None,
    typer.Option("--event", help="Only this event kind (repeat): year_at_risk, year_below, "
                 "year_missed, credit_issued, checkpoint_stale, record_refused, test. "
                 "Default: all."),
]
UnsafeOpt = Annotated[
    bool,
    typer.Option("--allow-unsafe-address",
                 help="Allow a host that resolves to a link-local, cloud-metadata, "
                 "multicast or reserved address (refused by default: SSRF)."),
]


def register(app: typer.Typer) -> None:
    """Add the ``alerts`` command group to the ``yoco`` application."""
    app.add_typer(alerts_app, name="alerts")


def _print_json(obj: Any) -> None:
    print_json(obj)


def _unit(ctx: Any) -> Any:
    from yoco.database import unit_of_work

    return unit_of_work(ctx.engine)


@alerts_app.command("add-webhook")
def add_webhook_cmd(
    name: Annotated[str, typer.Argument(help="A name for the destination (letters, digits, "
                                        "'.', '_', '-').")],
    url: Annotated[str, typer.Option(help="The receiver's http(s) URL (POSTed JSON).")],
    secret: Annotated[
        str | None,
        typer.Option(help="The shared signing secret (16+ characters). Default: a new "
                     "random one, printed once."),
    ] = None,
    customer: CustomerOpt = None,
    event: EventsOpt = None,
    allow_unsafe_address: UnsafeOpt = False,
) -> None:
    """Add a webhook destination; prints its signing secret once.

    Events are POSTed as JSON, signed with HMAC-SHA256 (header Yoco-Signature:
    t=…,v1=…, see docs/alerts.md for the receiver's check) and carry an Idempotency-Key.
    A bad field is refused (exit 2) and nothing is written.
    """
    from alerts.services import add_webhook

    with application() as ctx, _unit(ctx) as s:
        dest, used = add_webhook(s, name=name, url=url, secret=secret, customer=customer,
                                 events=event, allow_unsafe_address=allow_unsafe_address)
        dest_name = dest.name
    err.print(f"webhook {dest_name} added: {url}", highlight=False)
    if secret is None:
        err.print("Its signing secret is shown once, now; give it to the receiver:",
                  highlight=False)
        print(used)


@alerts_app.command("add-email")
def add_email_cmd(
    name: Annotated[str, typer.Argument(help="A name for the destination.")],
    host: Annotated[str, typer.Option(help="The SMTP server (submission).")],
    mail_from: Annotated[str, typer.Option("--from", help="The sender address.")],
    to: Annotated[list[str], typer.Option("--to", help="A recipient (repeat).")],
    port: Annotated[int, typer.Option(help="The SMTP port.")] = 587,
    starttls: Annotated[
        bool, typer.Option("--starttls/--no-starttls", help="Upgrade to TLS with STARTTLS "
                           "(the server's certificate is verified).")
    ] = False,
    username: Annotated[str | None, typer.Option(help="SMTP login user, if any.")] = None,
    password_env: Annotated[
        str | None,
        typer.Option(help="The environment variable holding the SMTP password in the "
                     "process that sends (yoco serve, cron). The password is never stored."),
    ] = None,
    customer: CustomerOpt = None,
    event: EventsOpt = None,
    allow_unsafe_address: UnsafeOpt = False,
) -> None:
    """Add an e-mail destination: one message per event over SMTP.

    A bad field is refused (exit 2) and nothing is written.
    """
    from alerts.services import add_email

    with application() as ctx, _unit(ctx) as s:
        dest = add_email(s, name=name, host=host, port=port, mail_from=mail_from, mail_to=to,
                         starttls=starttls, username=username, password_env=password_env,
                         customer=customer, events=event,
                         allow_unsafe_address=allow_unsafe_address)
        dest_name = dest.name
    err.print(f"e-mail destination {dest_name} added: {host}:{port} → {', '.join(to)}",
              highlight=False)


@alerts_app.command("destinations")
def destinations_cmd(as_json: JsonOpt = False) -> None:
    """List the destinations (secrets are never shown, only a fingerprint)."""
    from alerts.services import destination_json, list_destinations

    with application() as ctx, _unit(ctx) as s:
        rows = [destination_json(d) for d in list_destinations(s)]
    if as_json:
        _print_json(rows)
        return
    if not rows:
        out.print("no alert destinations (add one with `yoco alerts add-webhook` or "
                  "`yoco alerts add-email`)")
        return
    from yoco.render import print_table

    table = Table("name", "kind", "where", "customer", "events", "enabled")
    for r in rows:
        where = r["url"] if r["kind"] == "webhook" else f"{r['host']}:{r['port']} → " + \
            ", ".join(r["mail_to"])
        events = r["events"] if isinstance(r["events"], str) else ", ".join(r["events"])
        table.add_row(r["name"], r["kind"], where, r["customer"] or "(all)", events,
                      "yes" if r["enabled"] else "no")
    print_table(out, table)


def _set_enabled(name: str, enabled: bool) -> None:
    from alerts.services import set_enabled

    with application() as ctx, _unit(ctx) as s:
        set_enabled(s, name, enabled)
    out.print(f"{name} {'enabled' if enabled else 'disabled'}", highlight=False)


@alerts_app.command("disable")
def disable_cmd(name: Annotated[str, typer.Argument(help="The destination.")]) -> None:
    """Stop sending to a destination (its delivery log is kept; pending ones fail)."""
    _set_enabled(name, False)


@alerts_app.command("enable")
def enable_cmd(name: Annotated[str, typer.Argument(help="The destination.")]) -> None:
    """Send to a destination again (events from now on; replay older failed ones)."""
    _set_enabled(name, True)


@alerts_app.command("list")
def list_cmd(
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    customer: Annotated[
        str | None, typer.Option(help="Only this customer's events (default: all).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, help="At most this many.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The events raised, newest first (each once, by its idempotency key)."""
    from alerts.events import idempotency_key
    from alerts.services import events

    with application() as ctx, _unit(ctx) as s:
        rows: list[dict[str, Any]] = [
            {"id": e.id, "kind": e.kind, "key": e.key,
             "idempotency_key": idempotency_key(e.key), "contract_id": e.contract_id,
             "customer": e.customer, "year": e.year,
             "occurred_at": e.occurred_at.isoformat(), "detected_at": e.detected_at.isoformat(),
             "subject": e.subject, "data": e.data}
            for e in events(s, customer=customer, all_tenants=customer is None, kind=kind,
                            limit=limit)
        ]
    if as_json:
        _print_json(rows)
        return
    if not rows:
        out.print("no alert events")
        return
    from yoco.render import print_table

    table = Table("id", "kind", "contract", "detected", "subject")
    for r in rows:
        table.add_row(str(r["id"]), r["kind"], r["contract_id"] or "—",
                      r["detected_at"][:19], r["subject"])
    print_table(out, table)


@alerts_app.command("deliveries")
def deliveries_cmd(
    status: Annotated[
        str | None, typer.Option(help="Only pending, delivered or failed deliveries.")
    ] = None,
    destination: Annotated[str | None, typer.Option(help="Only this destination.")] = None,
    delivery: Annotated[
        int | None, typer.Option("--id", help="Show one delivery with every attempt.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, help="At most this many.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The delivery log, newest first: status, attempts, the last answer or error."""
    from alerts.services import attempts_of, deliveries, replays

    with application() as ctx, _unit(ctx) as s:
        rows = [d.to_json() for d in deliveries(s, status=status, destination=destination,
                                                 limit=10_000 if delivery else limit)]
        attempts = []
        asked: list[dict[str, Any]] = []
        if delivery is not None:
            asked = [{"requested_by": r.requested_by, "via": r.via,
                      "requested_at": r.requested_at.isoformat()}
                     for r in reversed(replays(s, delivery_id=delivery, limit=10_000))]
            rows = [r for r in rows if r["id"] == delivery]
            attempts = [
                {"attempt": a.attempt, "at": a.at.isoformat(), "ok": a.ok,
                 "status_code": a.status_code, "error": a.error, "backoff_s": a.backoff_s,
                 "replay": a.replay}
                for a in attempts_of(s, delivery)
            ]
    if delivery is not None:
        if as_json:
            _print_json({**rows[0], "attempts": attempts, "replays": asked} if rows else {})
            return
        for k, v in (rows[0] if rows else {}).items():
            out.print(shown(f"{k}: {v}"), highlight=False)
        for r in asked:
            out.print(shown(f"  replay asked by {r['requested_by']} ({r['via']}) at "
                            f"{r['requested_at']}"), highlight=False)
        for a in attempts:
            outcome = "ok" if a["ok"] else "failed"
            wait = f", next try in {a['backoff_s']:.2f} s" if a["backoff_s"] else ""
            out.print(shown(f"  attempt {a['attempt']} {a['at']}"
                            f"{' (replay)' if a['replay'] else ''}"
                            f": {outcome} {a['status_code'] or ''} {a['error'] or ''}{wait}"),
                      highlight=False)
        return
    if as_json:
        _print_json(rows)
        return
    if not rows:
        out.print("no deliveries")
        return
    from yoco.render import print_table

    table = Table("id", "status", "tries", "destination", "event", "last error")
    for r in rows:
        table.add_row(str(r["id"]), r["status"], str(r["attempts"]), r["destination"],
                      r["event_kind"], r["last_error"] or "")
    print_table(out, table)


def _report(sent: list[Delivered]) -> None:
    for d in sent:
        if d.status == "delivered":
            out.print(shown(f"delivery {d.delivery_id} to {d.destination}: delivered "
                            f"({d.attempts} attempt(s))"), highlight=False)
        else:
            err.print(shown(f"delivery {d.delivery_id} to {d.destination}: FAILED after "
                            f"{d.attempts} attempt(s): {d.error}"), highlight=False)


def _os_user() -> str:
    """Who runs this command, for the replay audit trail (the OS account)."""
    import getpass
    import os

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (containers)
        return f"uid {os.getuid()}"


def _send(ctx: Any, ids: list[int], replay: bool) -> list[Delivered]:
    from yoco.alerting import alerts_config, deliver_pending

    return deliver_pending(ctx.engine, alerts_config(ctx.settings), delivery_ids=ids,
                           replay=replay)


@alerts_app.command("replay")
def replay_cmd(
    ids: Annotated[
        list[int] | None, typer.Argument(help="Delivery ids (see 'yoco alerts deliveries').")
    ] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Every failed delivery.")] = False,
) -> None:
    """Send deliveries again now, with the same body and Idempotency-Key.

    A receiver that already has the event drops it. Exit 1 if one still fails.
    """
    from alerts.services import queue_replay

    if not ids and not failed:
        fail("give delivery ids or --failed")
    with application() as ctx:
        with _unit(ctx) as s:
            # Audited (alert_replays): who ran it, from the command line.
            queued = queue_replay(s, ids or [], failed=failed, requested_by=_os_user(),
                                  via="cli")
        if not queued:
            out.print("nothing to replay")
            return
        sent = _send(ctx, queued, replay=True)
    _report(sent)
    if any(d.status == "failed" for d in sent):
        raise typer.Exit(1)


@alerts_app.command("test")
def test_cmd(name: Annotated[str, typer.Argument(help="The destination.")]) -> None:
    """Send a test event to one destination now; exit 1 if it did not arrive.

    It is logged like any delivery ('yoco alerts deliveries').
    """
    from alerts.services import queue_test

    with application() as ctx:
        with _unit(ctx) as s:
            delivery_id = queue_test(s, name)
        sent = _send(ctx, [delivery_id], replay=False)
    _report(sent)
    if any(d.status == "failed" for d in sent):
        raise typer.Exit(1)


@alerts_app.command("run")
def run_cmd(
    now: Annotated[
        str | None, typer.Option(help="As of, ISO 8601 with offset (default: now).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for a detector run in progress, then run.")
    ] = False,
    deliver: Annotated[
        bool, typer.Option("--deliver/--no-deliver", help="Send what is pending.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Detect new events, then send pending deliveries (the cron command).

    'yoco serve' does this after each close-due run, and 'yoco billing close-due' does
    it too. Safe from several places at once: each event is raised and sent once.
    Exit 1 if a delivery failed.
    """
    from yoco.alerting import alerts_config, run_alerts

    at = parse_now(now)
    with application() as ctx:
        run = run_alerts(ctx.engine, alerts_config(ctx.settings), now=at, wait=wait,
                         deliver=deliver)
    if as_json:
        _print_json(run.to_json())
    else:
        for key in run.detect.raised if run.detect else []:
            out.print(f"raised {key}", highlight=False)
        _report(run.sent)
        err.print(run.summary(), highlight=False)
    if run.failed:
        raise typer.Exit(1)
