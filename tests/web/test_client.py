"""``yoco.client`` and the CLI's remote mode against a real uvicorn server (port 0) on the
real PostgreSQL test database: typed answers, paging, revalidation, clear errors, and
``yoco --server URL …`` printing exactly what the local command prints."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from yoco.cli import build_app

runner = CliRunner()


@pytest.fixture
def server(seeded, serve) -> str:
    """The portal on the seeded database, served by uvicorn; its base URL."""
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, _ = seeded
    app = create_app(ctx, WebSettings(secret_key="client-test", figures_ttl_seconds=60),
                     hasher=password_hasher(cheap=True))
    host, port = serve(app)
    return f"http://{host}:{port}"


def _token(seeded: Any, customer: str | None = None, contracts: list[str] | None = None
           ) -> str:
    from web.accounts import create_token
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        return create_token(s, name="client", customer=customer, contract_ids=contracts).text


def test_the_client_reads_every_endpoint(server, seeded, seed) -> None:
    from yoco.client import Checkpoint, Client, Contract, Failure, SlaFigures

    with Client(server, _token(seeded, "Acme AI")) as api:
        contracts = api.contracts()
        assert [c.contract_id for c in contracts] == ["C-A", "C-A2"]
        assert isinstance(contracts[0], Contract) and contracts[0].customer == "Acme AI"
        assert api.contract("C-A2").timezone == "America/New_York"
        sla = api.sla("C-A", year=1)
        assert isinstance(sla, SlaFigures)
        assert (sla.covered_failures, sla.resolved_failures, sla.pending_failures) == (4, 2, 1)
        assert sla.data["contract_id"] == "C-A" and sla.period_start.tzinfo is not None
        assert api.sla("C-A", month="2026-04").month == "2026-04"
        year = api.year("C-A", 1)
        assert year["figures"]["covered_failures"] == 4
        failures = list(api.failures("C-A", per_page=2))  # three pages, followed
        assert len(failures) == 6 and all(isinstance(f, Failure) for f in failures)
        assert [f.event_id for f in failures] == list(reversed(seed.failures["C-A"]))
        assert [f.status for f in api.failures("C-A", status="rolled_back")] == ["rolled_back"]
        detail = api.failure("C-A", seed.failures["C-A"][1])
        assert detail["cause"] == "ecc_uncorrectable"
        heads = api.checkpoints("C-A")
        assert isinstance(heads[0], Checkpoint) and heads[0].tree_size == seed.sizes["C-A"]
        assert api.credits("C-A") == []
        proof = api.proof("C-A", seed.outcomes["C-A"][0])
        assert proof["format"].startswith("yoco-inclusion-proof")
        assert api.public_key() == seeded[0].signer.verifier_text()
        # A second read of the same address is revalidated: 304, the copy reused.
        before = api.revalidated
        assert api.sla("C-A", year=1) == sla
        assert api.revalidated == before + 1


def test_the_client_raises_clear_errors(server, seeded, seed) -> None:
    from yoco.client import (
        AuthError,
        Client,
        ConnectionFailed,
        NotFoundError,
        RequestRefused,
    )

    with Client(server, _token(seeded, "Acme AI")) as api:
        with pytest.raises(NotFoundError) as nf:
            api.sla("C-B")  # another customer's: not found, like an unknown one
        assert nf.value.status == 404 and "nothing at this address" in str(nf.value)
        with pytest.raises(RequestRefused) as bad:
            api.sla("C-A", month="2026-13")
        assert bad.value.status == 422
        with pytest.raises(NotFoundError):
            api.sla("C-A", year=7)
    with Client(server, "yoco_not_a_token") as api, pytest.raises(AuthError) as auth:
        api.contracts()
    assert auth.value.status == 401
    with Client(server, _token(seeded, contracts=["C-A"])) as api, \
            pytest.raises(AuthError) as ingest_only:
        api.contracts()
    assert ingest_only.value.status == 403 and "only post records" in ingest_only.value.detail
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{closed}") as api, pytest.raises(ConnectionFailed) as c:
        api.contracts()
    assert "cannot reach the yoco server" in str(c.value)
    with pytest.raises(ValueError, match="http:// or https://"):
        Client("ftp://example.com")


def _cli(*args: str, code: int = 0) -> str:
    result = runner.invoke(build_app(), list(args), catch_exceptions=False)
    assert result.exit_code == code, (args, result.exit_code, result.output)
    return result.output


def test_remote_mode_prints_what_local_mode_prints(
    server, seeded, seed, monkeypatch, tmp_path: Path
) -> None:
    from yoco.settings import get_settings

    ctx, _ = seeded
    # The local commands read the same database and the same signer key as the server.
    monkeypatch.setenv("YOCO_DATA_DIR", str(ctx.settings.data_dir))
    get_settings.cache_clear()
    remote = ["--server", server, "--token", _token(seeded, "Acme AI")]
    # A month that has ended: its figures no longer depend on the time.
    for args in (["sla", "C-A", "--month", "2026-04"], ["sla", "C-A2", "--month", "2026-03"]):
        local = _cli(*args)
        assert "C-A" in local and "resolution rate" in local
        assert _cli(*remote, *args) == local, args
        lj = json.loads(_cli(*args, "--json"))
        rj = json.loads(_cli(*remote, *args, "--json"))
        assert list(rj) == list(lj)  # the same fields, in the same order
        lj.pop("computed_at"), rj.pop("computed_at")
        assert rj == lj, args
    # The current year: the same, but for what grows with the time (running jobs).
    local = json.loads(_cli("sla", "C-A", "--year", "1", "--json"))
    got = json.loads(_cli(*remote, "sla", "C-A", "--year", "1", "--json"))
    for k in ("computed_at", "allocated_gpu_hours", "goodput"):
        local.pop(k), got.pop(k)
    assert got == local
    # contracts list: the customer's own, in the same table and JSON as locally.
    local_rows = [r for r in json.loads(_cli("contracts", "list", "--json"))
                  if r["customer"] == "Acme AI"]
    assert json.loads(_cli(*remote, "contracts", "list", "--json")) == local_rows
    table = _cli(*remote, "contracts", "list")
    assert "C-A2" in table and "C-B" not in table
    assert _cli(*remote, "ledger", "public-key") == _cli("ledger", "public-key")
    # YOCO_SERVER / YOCO_TOKEN work like the options.
    monkeypatch.setenv("YOCO_SERVER", server)
    monkeypatch.setenv("YOCO_TOKEN", remote[3])
    assert json.loads(_cli("contracts", "list", "--json")) == local_rows


def test_remote_mode_errors_are_clear(server, seeded, monkeypatch) -> None:
    remote = ["--server", server, "--token", _token(seeded, "Acme AI")]
    out = _cli(*remote, "sla", "C-B", code=2)
    assert "nothing at this address" in out and "404" in out
    out = _cli(*remote, "sla", "C-A", "--as-of", "2026-04-01", code=2)
    assert "--as-of works on the database only" in out
    out = _cli(*remote, "ledger", "verify", code=2)
    assert "yoco ledger verify works on the database only" in out and "yoco sla" in out
    out = _cli("--server", server, "--token", "yoco_bad", "sla", "C-A", code=2)
    assert "401" in out
    # it sent a token: it is told the token was refused, not asked to send one
    assert "did not accept this token" in out and "send a session cookie" not in out
    out = _cli("--server", "not-a-url", "sla", "C-A", code=2)
    assert "http:// or https://" in out
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    out = _cli("--server", f"http://127.0.0.1:{closed}", "sla", "C-A", code=1)
    assert "cannot reach the yoco server" in out
    assert "HTTP 0" not in out  # nothing answered: no HTTP status to quote
    assert "--server" in _cli("--help")
