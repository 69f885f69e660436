"""Sending: signed webhooks and e-mail, retried with backoff, every attempt logged.

A webhook is a ``POST`` of the event's JSON (:func:`event_body`, the same bytes on every
attempt and every replay) with these headers (docs/alerts.md has the receiver's recipe):

* ``Yoco-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`` —
  the timestamp is signed with the body, so a captured request cannot be replayed later
  than the receiver's tolerance;
* ``Idempotency-Key: <uuid>`` — the same for every attempt and replay of one event
  (:func:`alerts.events.idempotency_key`): a receiver that saw it already drops it;
* ``Yoco-Event``, ``Yoco-Delivery``, ``Yoco-Attempt``.

An e-mail carries the same key as its ``Message-ID`` and an ``Idempotency-Key`` header.

A 2xx answer (or an accepted e-mail) delivers. A timeout, a connection error, a 5xx, 408
or 429 (an SMTP 4xx) is retried, up to :attr:`RetryPolicy.max_attempts` tries, waiting
:meth:`RetryPolicy.backoff` between them; any other answer (3xx — redirects are never
followed —, 4xx, SMTP 5xx, an unsafe address) fails the delivery at once, since trying
again cannot help. The clock, the sleep and the jitter are parameters, so tests observe
every retry without waiting.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import smtplib
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.orm import Session

from alerts.config import RetryPolicy, check_host, webhook_addresses
from alerts.errors import AlertsError, DeliveryBroken
from alerts.events import idempotency_key, one_line
from alerts.models import AlertAttempt, AlertDelivery, AlertDestination, AlertEvent

__all__ = [
    "SIGNATURE_HEADER",
    "AttemptResult",
    "Delivered",
    "DocumentFiles",
    "File",
    "dead_letter",
    "deliver_next",
    "email_message",
    "event_body",
    "send_email",
    "send_webhook",
    "sign",
    "verify_signature",
]

SIGNATURE_HEADER = "Yoco-Signature"
USER_AGENT = "yoco-alerts/1"

Clock = Callable[[], datetime]
Sleep = Callable[[float], None]
#: A file an e-mail attaches: ``(file name, MIME type, bytes)``.
File = tuple[str, str, bytes]
#: An issued document's files, by ``(session, contract_id, period, document)``.
DocumentFiles = Callable[[Session, str, str, str], Sequence[File]]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def event_body(event: AlertEvent) -> bytes:
    """The JSON body of ``event``'s webhook: sorted keys, no spaces, UTF-8; the same bytes
    for every attempt and replay (nothing in it depends on the delivery)."""
    obj = {
        "id": idempotency_key(event.key),
        "key": event.key,
        "kind": event.kind,
        "contract_id": event.contract_id,
        "customer": event.customer,
        "year": event.year,
        "occurred_at": event.occurred_at.astimezone(UTC).isoformat(),
        "detected_at": event.detected_at.astimezone(UTC).isoformat(),
        "subject": event.subject,
        "data": event.data,
    }
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Yoco-Signature`` header value: ``t=<timestamp>,v1=<hex HMAC-SHA256>`` over
    ``b"<timestamp>." + body`` with the shared ``secret`` (UTF-8)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_signature(secret: str, header: str, body: bytes, *, now: int,
                     tolerance_s: int = 300) -> bool:
    """The receiver's check (docs/alerts.md): the header's ``v1`` matches the HMAC of
    ``"<t>." + body`` and ``t`` is within ``tolerance_s`` of ``now``. Constant-time."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        k, _, v = item.strip().partition("=")
        parts.setdefault(k, []).append(v)
    try:
        t = int(parts["t"][0])
    except (KeyError, ValueError):
        return False
    if abs(now - t) > tolerance_s:
        return False
    expected = sign(secret, t, body).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, v) for v in parts.get("v1", []))


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    """What one try gave: delivered (``ok``), or why not and whether a retry may help."""

    ok: bool
    retryable: bool = False
    status_code: int | None = None
    error: str | None = None


def _short(text_: str, n: int = 300) -> str:
    text_ = " ".join(text_.split())
    return text_ if len(text_) <= n else text_[: n - 1] + "…"


def _pinned(url: str, addresses: list[str]) -> tuple[httpx.URL, dict[str, Any], str | None]:
    """The request target that connects to ``addresses[0]`` (checked just now) instead of
    resolving the host again, the extensions that keep the name for TLS (SNI and the
    certificate check) and the ``Host`` header; the URL as it is when nothing was
    resolved (``--allow-unsafe-address``) or the host is an address already."""
    parsed = httpx.URL(url)
    if not addresses or addresses[0].split("%", 1)[0] == parsed.host:
        return parsed, {}, None
    extensions: dict[str, Any] = {}
    if parsed.scheme == "https":
        extensions["sni_hostname"] = parsed.host
    return parsed.copy_with(host=addresses[0]), extensions, parsed.netloc.decode("ascii")


def send_webhook(dest: AlertDestination, event: AlertEvent, *, delivery_id: int, attempt: int,
                 body: bytes, now: datetime, timeout_s: float,
                 client: httpx.Client | None = None) -> AttemptResult:
    """One signed POST of ``body`` to the destination's URL (redirects not followed)."""
    if dest.url is None or dest.secret is None:
        return AttemptResult(ok=False, error=f"destination {dest.name}: a webhook without "
                             "its URL or secret")
    try:
        # a customer's own destination: public addresses only, checked again at each send
        # (a name may resolve elsewhere since it was added)
        addresses = webhook_addresses(dest.url, allow_unsafe=dest.allow_unsafe_address,
                                      strict=bool(dest.customer_managed))
    except AlertsError as exc:
        return AttemptResult(ok=False, error=str(exc))
    target, extensions, host_header = _pinned(dest.url, addresses)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: sign(dest.secret, int(now.timestamp()), body),
        "Idempotency-Key": idempotency_key(event.key),
        "Yoco-Event": event.kind,
        "Yoco-Delivery": str(delivery_id),
        "Yoco-Attempt": str(attempt),
    }
    own = client is None
    c = client or httpx.Client(follow_redirects=False, trust_env=False)
    try:
        if host_header is not None:
            headers["Host"] = host_header
        r = c.post(target, content=body, headers=headers, timeout=timeout_s,
                   extensions=extensions)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # trying again cannot help
        return AttemptResult(ok=False, error=_short(f"url: {type(exc).__name__}: {exc}"))
    except httpx.TimeoutException as exc:
        return AttemptResult(ok=False, retryable=True,
                             error=f"timed out after {timeout_s:g} s ({type(exc).__name__})")
    except httpx.HTTPError as exc:
        return AttemptResult(ok=False, retryable=True,
                             error=_short(f"{type(exc).__name__}: {exc}"))
    finally:
        if own:
            c.close()
    code = r.status_code
    if 200 <= code < 300:
        return AttemptResult(ok=True, status_code=code)
    retry = code >= 500 or code in (408, 429)
    why = "redirects are not followed" if 300 <= code < 400 else _short(r.text or "", 200)
    return AttemptResult(ok=False, retryable=retry, status_code=code,
                         error=f"HTTP {code}" + (f": {why}" if why else ""))


def email_message(dest: AlertDestination, event: AlertEvent, body: bytes,
                  now: datetime, files: Sequence[File] = ()) -> EmailMessage:
    """The e-mail of ``event`` for ``dest``: a plain-text summary and the webhook's JSON,
    and ``files`` attached as they are (an issued report's PDF and HTML: their bytes are
    the ones whose SHA-256 the ledger records)."""
    key = idempotency_key(event.key)
    msg = EmailMessage()
    msg["Subject"] = one_line(f"[yoco] {event.subject}")[:250]
    msg["From"] = dest.mail_from or ""
    msg["To"] = ", ".join(dest.mail_to)
    msg["Date"] = format_datetime(now.astimezone(UTC))
    msg["Message-ID"] = f"<{key}@alerts.yoco>"
    msg["Idempotency-Key"] = key
    msg["X-Yoco-Event"] = event.kind
    details = json.dumps(json.loads(body), indent=2, ensure_ascii=False, sort_keys=True)
    msg.set_content(
        f"{event.subject}\n\n"
        f"event: {event.kind}\n"
        f"contract: {event.contract_id or '-'}"
        + (f", year {event.year}" if event.year is not None else "")
        + f"\noccurred: {event.occurred_at.astimezone(UTC).isoformat()}\n"
        f"idempotency key: {key}\n\n{details}\n"
    )
    for name, mime, data in files:
        maintype, _, subtype = mime.partition("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return msg


class _PinnedSMTP(smtplib.SMTP):
    """An SMTP client that connects to ``address`` (checked just now) while it speaks to,
    and verifies the certificate of, the host's name (STARTTLS uses ``_host``)."""

    def __init__(self, address: str | None, host: str, *, timeout: float) -> None:
        self._address = address
        super().__init__(timeout=timeout)
        self._host = host  # what STARTTLS sends as SNI and verifies the certificate for

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return socket.create_connection((self._address or host, port), timeout,
                                        self.source_address)


def send_email(dest: AlertDestination, event: AlertEvent, *, body: bytes, now: datetime,
               timeout_s: float, env: Mapping[str, str],
               files: Sequence[File] = ()) -> AttemptResult:
    """One SMTP submission of ``event``'s e-mail (STARTTLS and login when configured),
    with ``files`` attached."""
    if dest.smtp_host is None or dest.smtp_port is None:
        return AttemptResult(ok=False, error=f"destination {dest.name}: an e-mail "
                             "destination without its SMTP host or port")
    try:
        addresses = check_host(dest.smtp_host, field="smtp_host",
                               allow_unsafe=dest.allow_unsafe_address)
    except AlertsError as exc:
        return AttemptResult(ok=False, error=str(exc))
    password = None
    if dest.smtp_username:
        password = env.get(dest.smtp_password_env or "")
        if password is None:
            return AttemptResult(ok=False, error=(
                f"the SMTP password's environment variable {dest.smtp_password_env!r} is not "
                "set in the process that sends alerts"))
    try:
        msg = email_message(dest, event, body, now, files)
    except (ValueError, TypeError) as exc:  # a header value email refuses: never sendable
        return AttemptResult(ok=False, error=_short(f"the message cannot be built: {exc}"))
    try:
        with _PinnedSMTP(addresses[0] if addresses else None, dest.smtp_host,
                         timeout=timeout_s) as smtp:
            smtp.connect(dest.smtp_host, dest.smtp_port)
            smtp.ehlo()
            if dest.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if dest.smtp_username and password is not None:
                smtp.login(dest.smtp_username, password)
            refused = smtp.send_message(msg)
    except smtplib.SMTPNotSupportedError as exc:
        return AttemptResult(ok=False, error=_short(f"SMTP server: {exc}"))
    except smtplib.SMTPRecipientsRefused as exc:
        return AttemptResult(ok=False, error=_short(f"every recipient refused: {exc.recipients}"))
    except smtplib.SMTPResponseException as exc:
        msg_text = exc.smtp_error.decode(errors="replace") if isinstance(
            exc.smtp_error, bytes) else str(exc.smtp_error)
        return AttemptResult(ok=False, retryable=400 <= exc.smtp_code < 500,
                             status_code=exc.smtp_code,
                             error=_short(f"SMTP {exc.smtp_code}: {msg_text}"))
    except (smtplib.SMTPException, OSError) as exc:
        return AttemptResult(ok=False, retryable=True, error=_short(f"{type(exc).__name__}: {exc}"))
    if refused:
        return AttemptResult(ok=False, error=_short(f"recipients refused: {sorted(refused)}"))
    return AttemptResult(ok=True, status_code=250)


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivered:
    """What :func:`deliver_next` did with one delivery."""

    delivery_id: int
    destination: str
    event_key: str
    status: str  # delivered | failed
    attempts: int  # attempts made in this run
    error: str | None


def deliver_next(
    session: Session,
    *,
    policy: RetryPolicy,
    delivery_id: int | None = None,
    replay: bool = False,
    clock: Clock = _utc_now,
    sleep: Sleep = time.sleep,
    jitter: Callable[[], float] = random.random,
    env: Mapping[str, str] | None = None,
    client: httpx.Client | None = None,
    files: DocumentFiles | None = None,
) -> Delivered | None:
    """Claim the oldest pending delivery (or ``delivery_id``) and try it until delivered,
    failed for good, or out of attempts; log every attempt. None when nothing is pending.

    ``files`` gives an issued document's files (``reports.issued.document_files``, passed
    by the composition root: alerts do not import reports): a ``report_issued`` e-mail
    attaches them; without it, such a delivery is dead-lettered (an e-mail never goes
    out without the report it announces).

    The row is claimed with ``FOR UPDATE SKIP LOCKED``, so senders running at once never
    send the same delivery together; a sender that dies mid-way leaves it pending for the
    next (the receiver's idempotency key makes a second send harmless). Whatever goes
    wrong inside the delivery is rolled back to a savepoint and the delivery is
    dead-lettered with the reason (:func:`dead_letter`), so it never holds back the
    others. Never commits: the caller commits one delivery per transaction.
    """
    import os

    env = os.environ if env is None else env
    where = "status = 'pending'" + ("" if delivery_id is None else " AND id = :id")
    row = session.execute(
        text(f"SELECT id FROM alert_deliveries WHERE {where} "
             "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"),
        {"id": delivery_id},
    ).scalar_one_or_none()
    if row is None:
        return None
    delivery = session.get(AlertDelivery, row)
    if delivery is None:  # locked above, so only a concurrent superuser DELETE gets here
        raise DeliveryBroken(f"delivery {row} vanished while claimed")
    # Isolation: whatever goes wrong with this one delivery (a value that cannot become
    # a header or a URL, a bug, a database error of its own rows) is rolled back to here
    # and the delivery is dead-lettered (``failed``, with the reason), so the next run
    # goes on with the others instead of retrying this one first for ever.
    savepoint = session.begin_nested()
    try:
        done = _attempt_all(session, delivery, policy=policy, replay=replay, clock=clock,
                            sleep=sleep, jitter=jitter, env=env, client=client, files=files)
        savepoint.commit()
        return done
    except Exception as exc:  # the isolation boundary of one delivery
        savepoint.rollback()
        return dead_letter(session, row, reason=f"{type(exc).__name__}: {exc}", clock=clock,
                           replay=replay)


def dead_letter(session: Session, delivery_id: int, *, reason: str,
                clock: Clock = _utc_now, replay: bool = False) -> Delivered:
    """Mark delivery ``delivery_id`` ``failed`` for good with ``reason`` (logged as an
    attempt that was never tried again): the dead letter an operator sees in ``yoco alerts
    deliveries --status failed`` and may replay. Never commits."""
    delivery = session.get(AlertDelivery, delivery_id)
    if delivery is None:
        raise DeliveryBroken(f"delivery {delivery_id} does not exist")
    now = clock()
    why = _short(f"dead-lettered: {reason}")
    number = delivery.attempts + 1
    session.add(AlertAttempt(delivery_id=delivery.id, attempt=number, at=now, ok=False,
                             status_code=None, error=why, backoff_s=None, replay=replay))
    delivery.attempts = number
    delivery.last_status = None
    delivery.last_error = why
    delivery.updated_at = now
    delivery.status = "failed"
    session.flush()
    dest = session.get(AlertDestination, delivery.destination_id)
    event = session.get(AlertEvent, delivery.event_id)
    return Delivered(delivery_id=delivery.id, destination=dest.name if dest else "?",
                     event_key=event.key if event else "?", status="failed", attempts=1,
                     error=why)


def _attempt_all(session: Session, delivery: AlertDelivery, *, policy: RetryPolicy,
                 replay: bool, clock: Clock, sleep: Sleep, jitter: Callable[[], float],
                 env: Mapping[str, str], client: httpx.Client | None,
                 files: DocumentFiles | None = None) -> Delivered:
    """Try ``delivery`` until delivered, failed for good or out of attempts."""
    event = session.get(AlertEvent, delivery.event_id)
    dest = session.get(AlertDestination, delivery.destination_id)
    if event is None or dest is None:
        raise DeliveryBroken(f"delivery {delivery.id}: its event or destination is missing")
    body = event_body(event)
    attached: Sequence[File] = ()
    if event.kind == "report_issued" and dest.kind == "email":
        if files is None:
            raise DeliveryBroken("this sender cannot read issued reports to attach")
        d = event.data
        attached = files(session, str(d["contract_id"]), str(d["period"]), str(d["document"]))
    made = 0
    result = AttemptResult(ok=False, error="destination disabled")
    while made < policy.max_attempts and dest.enabled:
        made += 1
        number = delivery.attempts + 1
        now = clock()
        if dest.kind == "webhook":
            result = send_webhook(dest, event, delivery_id=delivery.id, attempt=number,
                                  body=body, now=now, timeout_s=policy.timeout_s, client=client)
        else:
            result = send_email(dest, event, body=body, now=now, timeout_s=policy.timeout_s,
                                env=env, files=attached)
        wait = None
        if not result.ok and result.retryable and made < policy.max_attempts:
            wait = policy.backoff(made, jitter())
        session.add(AlertAttempt(delivery_id=delivery.id, attempt=number, at=now, ok=result.ok,
                                 status_code=result.status_code, error=result.error,
                                 backoff_s=wait, replay=replay))
        delivery.attempts = number
        delivery.last_status = result.status_code
        delivery.last_error = result.error
        delivery.updated_at = now
        session.flush()
        if result.ok or wait is None:
            break
        sleep(wait)
    delivery.status = "delivered" if result.ok else "failed"
    if result.ok:
        delivery.delivered_at = delivery.updated_at
    session.flush()
    return Delivered(delivery_id=delivery.id, destination=dest.name, event_key=event.key,
                     status=delivery.status, attempts=made, error=result.error)


def describe(d: Delivered) -> dict[str, Any]:
    """Plain JSON of a :class:`Delivered`."""
    return {"delivery_id": d.delivery_id, "destination": d.destination,
            "event_key": d.event_key, "status": d.status, "attempts": d.attempts,
            "error": d.error}
