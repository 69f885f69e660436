"""E-mail over STARTTLS with a login, against a real SMTP server that requires both."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from alerts.config import AlertsConfig, RetryPolicy
from alerts.events import NewEvent, raise_event
from alerts.services import add_email
from tests.alerts.conftest import _Keep, _PortZero
from yoco.alerting import deliver_pending
from yoco.database import unit_of_work

CONFIG = AlertsConfig(retry=RetryPolicy(max_attempts=3, base_s=1.0, cap_s=1.0, timeout_s=10))


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _auth(server, session, envelope, mechanism, data) -> AuthResult:  # type: ignore[no-untyped-def]
    ok = isinstance(data, LoginPassword) and data.login == b"yoco" and data.password == b"s3cret"
    return AuthResult(success=ok)


@pytest.fixture
def tls_smtp(tmp_path, monkeypatch):
    cert, key = _self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    # The sender verifies the server's certificate against the default CAs; this test's
    # CA is the self-signed certificate (OpenSSL reads SSL_CERT_FILE).
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    handler = _Keep()
    ctl = _PortZero(handler, hostname="127.0.0.1", port=0, tls_context=ctx,
                    require_starttls=True, authenticator=_auth, auth_required=True)
    ctl.start()
    try:
        yield ctl.port, handler
    finally:
        ctl.stop()


def _event(engine) -> None:
    with unit_of_work(engine) as s:
        raise_event(s, NewEvent(kind="record_refused", key="record_refused:tls",
                                occurred_at=dt.datetime(2026, 5, 1, tzinfo=dt.UTC),
                                subject="refused", data={}))


def test_starttls_and_login_deliver(engine, tls_smtp) -> None:
    port, handler = tls_smtp
    with unit_of_work(engine) as s:
        add_email(s, name="tls", host="127.0.0.1", port=port, mail_from="a@b.example",
                  mail_to=["c@d.example"], starttls=True, username="yoco",
                  password_env="YOCO_TEST_SMTP_PASSWORD")
    _event(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=lambda s: None,
                          env={"YOCO_TEST_SMTP_PASSWORD": "s3cret"})
    assert (d.status, d.attempts) == ("delivered", 1), d.error
    assert len(handler.messages) == 1


def test_a_server_that_requires_starttls_refuses_a_plain_session_without_retries(
        engine, tls_smtp) -> None:
    port, handler = tls_smtp
    with unit_of_work(engine) as s:
        add_email(s, name="plain", host="127.0.0.1", port=port, mail_from="a@b.example",
                  mail_to=["c@d.example"])
    _event(engine)
    [d] = deliver_pending(engine, CONFIG, sleep=lambda s: None)
    assert (d.status, d.attempts) == ("failed", 1)
    assert "SMTP 530" in (d.error or "") and handler.messages == []

