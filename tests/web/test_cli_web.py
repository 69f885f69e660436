"""`yoco users add`, `yoco tokens create|revoke`, `yoco serve --help`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests import factories as fx


def _yoco(args, input=None):
    from yoco.cli import build_app

    return CliRunner().invoke(build_app(), args, input=input)


def test_users_and_tokens_from_the_command_line(yoco_env, tmp_path) -> None:
    contracts = tmp_path / "c.json"
    contracts.write_text(json.dumps([fx.contract("C-9", customer="Nine Inc")]))
    assert _yoco(["contracts", "import", str(contracts)]).exit_code == 0

    r = _yoco(["users", "add", "--email", "Ann@Nine.example", "--customer", "Nine Inc",
               "--password-stdin"], input="a long enough password\n")
    assert r.exit_code == 0, r.output
    assert "created customer user ann@nine.example" in r.output
    r = _yoco(["users", "add", "--email", "ann@nine.example", "--customer", "Nine Inc",
               "--password-stdin"], input="a long enough password\n")
    assert r.exit_code == 2 and "already exists" in r.output
    r = _yoco(["users", "add", "--email", "op@v.example", "--role", "operator",
               "--password-stdin"], input="short\n")
    assert r.exit_code == 2 and "at least" in r.output
    r = _yoco(["users", "list"])
    assert "ann@nine.example" in r.output
    # a customer's admin manages its API tokens in the portal (/account/tokens)
    r = _yoco(["users", "add", "--email", "it@nine.example", "--customer", "Nine Inc",
               "--customer-admin", "--password-stdin"], input="a long enough password\n")
    assert r.exit_code == 0 and "(manages its API tokens)" in r.output, r.output
    r = _yoco(["users", "add", "--email", "op2@v.example", "--role", "operator",
               "--customer-admin"])
    assert r.exit_code == 2 and "only a customer user" in r.output
    assert "Password" not in r.output

    r = _yoco(["tokens", "create", "--name", "rt", "--contract", "C-9"])
    assert r.exit_code == 0, r.output
    token = r.stdout.strip().splitlines()[-1]
    assert token.startswith("yoco_") and len(token) > 50
    r = _yoco(["tokens", "create", "--name", "rt", "--contract", "C-NOPE"])
    assert r.exit_code == 2 and "unknown contract" in r.output
    r = _yoco(["tokens", "create", "--name", "prom", "--scope", "metrics"])
    assert r.exit_code == 0 and "scrape /metrics" in r.output, r.output
    metrics_token = r.stdout.strip().splitlines()[-1]
    r = _yoco(["tokens", "create", "--name", "x", "--scope", "admin"])
    assert r.exit_code == 2 and "unknown scope" in r.output

    from fastapi.testclient import TestClient

    from yoco.webapp import portal_app

    with TestClient(portal_app()) as c:
        rec = fx.rec("job_started", "C-9", fx.T0, job_id="j", gpus=8)
        r = c.post("/api/v1/records", json=[rec], headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["appended"] == 1
        r = c.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert r.status_code == 200 and "yoco_ledger_entries" in r.text
        prefix = "_".join(token.split("_")[:2])
        assert _yoco(["tokens", "revoke", prefix]).exit_code == 0
        r = c.post("/api/v1/records", json=[rec], headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401


def test_serve_help() -> None:
    r = _yoco(["serve", "--help"])
    assert r.exit_code == 0 and "--port" in r.output and "127.0.0.1" in r.output
    assert "--workers" in r.output


@pytest.mark.slow
def test_serve_workers_each_accept_their_share_and_stop_on_sigterm(yoco_env) -> None:
    """``yoco serve --workers 2``: each worker listens on its own SO_REUSEPORT socket, so
    keep-alive connections opened together are spread over both (uvicorn's one shared
    socket let the first worker take most of them), and SIGTERM stops them all."""
    import http.client
    import signal
    import socket
    import subprocess
    import sys
    import time

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "yoco.cli", "serve", "--port", str(port), "--workers", "2",
         "--close-due-every", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    def listening() -> int:
        n = 0
        for child in psutil.Process(proc.pid).children():
            try:
                n += any(k.status == psutil.CONN_LISTEN and k.laddr.port == port
                         for k in child.net_connections("tcp"))
            except psutil.Error:
                continue
        return n

    conns: list[http.client.HTTPConnection] = []
    try:
        for _ in range(1200):  # until both workers listen (each on its own socket)
            if listening() == 2:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        assert listening() == 2
        for _ in range(24):  # opened together, kept alive, one request each
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.connect()
            conns.append(c)
        for c in conns:
            c.request("GET", "/login")
        for c in conns:
            r = c.getresponse()
            assert r.status == 200
            r.read()
        ours = {c.sock.getsockname() for c in conns}
        per_worker = {}
        for child in psutil.Process(proc.pid).children():
            try:
                peers = {k.raddr for k in child.net_connections("tcp")
                         if k.status == psutil.CONN_ESTABLISHED and k.laddr.port == port}
            except psutil.Error:
                continue
            if peers & ours:
                per_worker[child.pid] = len(peers & ours)
        # Both workers hold some (all 24 on one: a chance of 2 in 2^24 with the kernel's hash).
        assert len(per_worker) == 2 and sum(per_worker.values()) == 24, per_worker
    finally:
        for c in conns:
            c.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0


def test_users_add_checks_its_flags_before_asking_for_a_password(yoco_env) -> None:
    # A wrong flag is named at once; no password prompt comes first.
    r = _yoco(["users", "add", "--email", "op@v.example", "--role", "admin"])
    assert r.exit_code == 2 and "role must be one of" in r.output
    assert "Password" not in r.output
    r = _yoco(["users", "add", "--email", "not-an-address"])
    assert r.exit_code == 2 and "is not an e-mail address" in r.output
    assert "Password" not in r.output
    # With no terminal to ask on (a script, CI) it says how to give one; no GetPassWarning.
    r = _yoco(["users", "add", "--email", "op@v.example", "--role", "operator"], input="")
    assert r.exit_code == 2 and "--password-stdin" in r.output
    assert "Aborted" not in r.output and "Password" not in r.output
    assert "op@v.example" not in _yoco(["users", "list"]).output


def test_serve_announces_its_address_once_it_accepts_connections(yoco_env) -> None:
    """'portal ready on …' is printed only once the address takes connections: a user
    (or a script) that connects on that line is answered, never refused."""
    import http.client
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "yoco.cli", "serve", "--port", str(port),
         "--close-due-every", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "portal ready on" in line:
                break
        assert any("starting the portal on" in ln for ln in seen), seen
        assert f"portal ready on http://127.0.0.1:{port}/" in seen[-1], seen
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/login")  # at once: no retry, no wait
        assert c.getresponse().status == 200
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
