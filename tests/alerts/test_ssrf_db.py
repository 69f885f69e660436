"""The SSRF guard: every IPv6 form that carries an IPv4 is judged by
that IPv4, and a delivery connects to the very address it checked (no second lookup)."""

from __future__ import annotations

import email
import email.policy
import ipaddress
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from alerts import config
from alerts.config import AlertsConfig, RetryPolicy, embedded_ipv4, unsafe_reason
from alerts.errors import UnsafeAddress
from alerts.events import NewEvent, raise_event
from alerts.services import add_email, add_webhook
from tests.alerts.conftest import SECRET
from yoco.alerting import deliver_pending
from yoco.database import unit_of_work

CONFIG = AlertsConfig(retry=RetryPolicy(max_attempts=1, timeout_s=5.0))

# 169.254.169.254 (the metadata service) carried in every IPv6 form that embeds an IPv4.
CARRIERS = [
    ("2002:a9fe:a9fe::1", "6to4"),
    ("2001:0:4136:e378:8000:63bf:5601:5601", "Teredo client"),  # stored inverted
    ("2001:0:a9fe:a9fe::1", "Teredo server"),
    ("::ffff:169.254.169.254", "IPv4-mapped"),
    ("::ffff:0:a9fe:a9fe", "IPv4-translated"),
    ("::a9fe:a9fe", "IPv4-compatible"),
    ("64:ff9b::a9fe:a9fe", "NAT64"),
    ("64:ff9b:1:a9fe:a9:fe00::", "NAT64"),
    ("fe80::5efe:a9fe:a9fe", "ISATAP"),
    ("2001:db8::200:5efe:a9fe:a9fe", "ISATAP"),
]


@pytest.mark.parametrize(("address", "form"), CARRIERS)
def test_every_ipv6_form_carrying_the_metadata_ipv4_is_refused(address: str, form: str) -> None:
    carried = embedded_ipv4(ipaddress.IPv6Address(address))
    assert ("169.254.169.254", form) in [(str(v4), f) for v4, f in carried]
    why = unsafe_reason(address)
    assert why is not None and "169.254.169.254" in why and form in why


@pytest.mark.parametrize("address", ["2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:5601:5601",
                                     "64:ff9b:1:a9fe:a9:fe00::"])
def test_a_webhook_url_or_a_name_resolving_to_such_an_address_is_refused(
        engine, address: str) -> None:
    """The issue's 6to4 and Teredo forms, as a literal and behind a name; nothing written."""
    with pytest.raises(UnsafeAddress, match=r"url: .*169\.254\.169\.254"), \
            unit_of_work(engine) as s:
        add_webhook(s, name="x", url=f"http://[{address}]/hook", secret=SECRET)
    with pytest.raises(UnsafeAddress, match=r"169\.254\.169\.254"):
        config.check_webhook_url("http://hooks.example/", resolve=lambda h: [address])
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM alert_destinations")).scalar_one() == 0


def test_ordinary_global_and_private_ipv6_are_still_allowed() -> None:
    for address in ("2606:4700::1111", "2002:c0a8:101::1", "::1", "fd12:3456::1",
                    "::ffff:127.0.0.1", "2002:7f00:1::1"):
        assert unsafe_reason(address) is None, address


def _raise(engine) -> None:
    with unit_of_work(engine) as s:
        raise_event(s, NewEvent(kind="test", key="test:pin", occurred_at=datetime.now(UTC),
                                subject="pinned", data={}))


def test_a_webhook_connects_to_the_address_it_checked(engine, receiver, no_sleep,
                                                      monkeypatch) -> None:
    """The host is resolved once per attempt, checked, and connected to at that address
    (here a name only the guard's resolver knows, pointing at the local receiver): no
    second lookup that a rebinding DNS could answer differently. The name is kept in
    the Host header."""
    port = receiver.url.split(":")[2].split("/")[0]
    lookups: list[str] = []

    def resolve(host: str) -> list[str]:
        lookups.append(host)
        if host == "hooks.invalid":
            return ["127.0.0.1"]
        raise OSError("no such host")

    monkeypatch.setattr(config, "_resolve", resolve)
    with unit_of_work(engine) as s:
        add_webhook(s, name="pin", url=f"http://hooks.invalid:{port}/hook", secret=SECRET)
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert d.status == "delivered", d.error
    [req] = receiver.requests
    assert req.headers["Host"] == f"hooks.invalid:{port}" and req.signature_ok
    assert lookups == ["hooks.invalid", "hooks.invalid"]  # configuring, then the attempt


def test_an_email_connects_to_the_address_it_checked(engine, smtp, no_sleep,
                                                     monkeypatch) -> None:
    def resolve(host: str) -> list[str]:
        if host == "mail.invalid":
            return ["127.0.0.1"]
        raise OSError("no such host")

    monkeypatch.setattr(config, "_resolve", resolve)
    with unit_of_work(engine) as s:
        add_email(s, name="pin", host="mail.invalid", port=smtp.port,
                  mail_from="yoco@vendor.example", mail_to=["oncall@vendor.example"])
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert d.status == "delivered", d.error
    msg = email.message_from_bytes(smtp.messages[0].content, policy=email.policy.default)
    assert msg["Subject"] == "[yoco] pinned"


def test_a_name_that_rebinds_to_the_metadata_address_fails_the_attempt(
        engine, receiver, no_sleep, monkeypatch) -> None:
    """Safe when configured, the metadata service at the attempt: the attempt is
    refused, nothing is sent."""
    port = receiver.url.split(":")[2].split("/")[0]
    answers = iter([["127.0.0.1"], ["169.254.169.254"]])
    monkeypatch.setattr(config, "_resolve", lambda host: next(answers))
    with unit_of_work(engine) as s:
        add_webhook(s, name="rebind", url=f"http://hooks.invalid:{port}/hook", secret=SECRET)
    _raise(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=no_sleep)
    assert d.status == "failed" and "metadata" in (d.error or "")
    assert receiver.requests == []
