"""A real local webhook receiver and a real local SMTP server, for the alerts' tests.

The receiver is ``http.server`` in a thread on port 0: it checks every request's
HMAC signature with the shared secret (the recipe of docs/alerts.md), records what it
got, and can be told to answer the next N requests with a failure (or to hang past the
sender's timeout). The SMTP server is aiosmtpd's, on port 0, keeping every message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from alerts.send import verify_signature
from tests.billing.conftest import signer  # noqa: F401  (a throwaway checkpoint signer)

SECRET = "whsec_test-secret-0123456789abcdef"


@dataclass
class Received:
    """One request the receiver got, and whether its signature checked out."""

    path: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Controls and observations of the running receiver."""

    url: str
    secret: str = SECRET
    requests: list[Received] = field(default_factory=list)
    fail_next: int = 0
    fail_status: int = 503
    hang_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, n: int, status: int = 503) -> None:
        """Answer the next ``n`` requests with ``status``."""
        with self.lock:
            self.fail_next, self.fail_status = n, status

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.requests if r.status == 200]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ok = verify_signature(receiver.secret, self.headers.get("Yoco-Signature", ""),
                                  body, now=int(time.time()))
            if receiver.hang_s:
                time.sleep(receiver.hang_s)
            with receiver.lock:
                if not ok:
                    status = 401
                elif receiver.fail_next > 0:
                    receiver.fail_next -= 1
                    status = receiver.fail_status
                else:
                    status = 200
                receiver.requests.append(Received(self.path, dict(self.headers), body, ok,
                                                  status))
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on 127.0.0.1, port 0, checking the HMAC with :data:`SECRET`."""
    rec = Receiver(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


class _Keep:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope)
        return "250 OK"


class _PortZero(Controller):
    def _trigger_server(self) -> None:
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


@dataclass
class Smtp:
    host: str
    port: int
    handler: _Keep

    @property
    def messages(self) -> list[Any]:
        return self.handler.messages


@pytest.fixture
def smtp() -> Iterator[Smtp]:
    """A real SMTP server (aiosmtpd) on 127.0.0.1, port 0, keeping every message."""
    handler = _Keep()
    ctl = _PortZero(handler, hostname="127.0.0.1", port=0)
    ctl.start()
    try:
        yield Smtp("127.0.0.1", ctl.port, handler)
    finally:
        ctl.stop()


class FakeSleep:
    """Records the waits the sender asks for instead of sleeping (tests never time)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def no_sleep() -> FakeSleep:
    return FakeSleep()
