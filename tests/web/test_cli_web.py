"""`yoco users add`, `yoco tokens create|revoke`, `yoco serve --help`."""

from __future__ import annotations

import json

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
