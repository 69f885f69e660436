"""An adapter delivering through the portal's ingestion API (``yoco serve``, a real HTTP
server on the test database) with an ingest token scoped to its contract: records land
once; refusals become dead letters naming the field; a server that is down or a bad token
is an outage, retried, never a refusal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from adapters.api_sink import ApiSink
from adapters.common import AdapterConfig
from adapters.torchrun import TorchrunReporter
from runtime import records as R
from runtime.errors import ConfigError, SinkError
from runtime.outbox import Deliverer, DeliveryConfig, Outbox
from runtime.sink import SinkSpec, is_permanent_refusal
from tests.adapters.conftest import by_kind

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(yoco_env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **yoco_env, "YOCO_WEB_SECRET_KEY": "adapters-test",
            "PYTHONPATH": str(ROOT)}


@pytest.fixture
def token(yoco_env, ledger_contract) -> str:
    """An ingest token that may post records for the test contract only."""
    made = subprocess.run([sys.executable, "-m", "yoco.cli", "tokens", "create", "--name",
                           "torchrun-eu", "--contract", ledger_contract], env=_env(yoco_env),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture
def port() -> int:
    """A free port for the server."""
    return _free_port()


def _serve(yoco_env: dict[str, str], port: int) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "yoco.cli", "serve", "--port", str(port)],
                            env=_env(yoco_env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(base + "/login", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode() if proc.stdout else "died")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_records_go_through_the_api_once_and_refusals_are_dead_letters(
        tmp_path, yoco_env, ledger_contract, token, port, journal) -> None:
    base = f"http://127.0.0.1:{port}"
    # The server is not up yet: an outage, retried, never a dead letter.
    box = Outbox(tmp_path / "outbox")
    sink = ApiSink(base, token, timeout_s=5)
    good = [R.job_started(contract_id=ledger_contract, job_id="api-1", gpus=2)]
    fail = R.failure(contract_id=ledger_contract, job_id="api-1", failure_class="unplanned",
                     cause="process_killed", step=3)
    # reported once the 2 s recovery is over (the plausibility rule, docs/definitions.md)
    over = datetime.fromisoformat(fail["occurred_at"].replace("Z", "+00:00")) + timedelta(
        seconds=2.5)
    good += [fail, R.outcome(contract_id=ledger_contract, failure_event_id=fail["event_id"],
                             outcome="rolled_back", lost_steps=1, recovery_seconds=2.0,
                             step_seconds=0.5, gpus_affected=2,
                             occurred_at=over.isoformat().replace("+00:00", "Z"))]
    unknown = R.outcome(contract_id=ledger_contract, failure_event_id=R.new_event_id(),
                        outcome="failed", lost_steps=0, recovery_seconds=1.0, step_seconds=0.5,
                        gpus_affected=2)
    foreign = R.job_started(contract_id="C-SOMEONE-ELSE", job_id="api-1", gpus=2)
    for rec in [*good, unknown, foreign]:
        box.append(rec)
    deliverer = Deliverer(box, sink, DeliveryConfig())
    with pytest.raises(SinkError) as down:
        deliverer.deliver_once()
    assert not is_permanent_refusal(sink, down.value)
    assert box.pending_count() == 5 and not box.dead_letters()

    serving = _serve(yoco_env, port)
    next(serving)
    try:
        while box.pending_count():
            deliverer.deliver_once()
        stored = journal()
        assert sorted(r["event_id"] for r in stored) == sorted(r["event_id"] for r in good)
        dead = {d.event_id: d.reason for d in box.dead_letters()}
        assert set(dead) == {unknown["event_id"], foreign["event_id"]}
        assert "HTTP 422" in dead[unknown["event_id"]]
        assert "failure_event_id" in dead[unknown["event_id"]]
        assert "HTTP 403" in dead[foreign["event_id"]]
        assert "contract_id" in dead[foreign["event_id"]]
        # A redelivery (an acknowledgement lost on the way back) stores nothing new.
        sink.deliver(good)
        assert journal() == stored and sink.duplicates == 3
        # A wrong token is an outage (an operator fixes it), not a refusal.
        wrong = ApiSink(base, "yoco_nope_not_a_token", timeout_s=5)
        with pytest.raises(SinkError, match="HTTP 401") as bad:
            wrong.deliver(good)
        assert not is_permanent_refusal(wrong, bad.value)

        # An adapter configured with the API sink: a torchrun restart lands once.
        cfg = AdapterConfig(contract_id=ledger_contract, job_id="api-2",
                            state_dir=tmp_path / "state", deliver_timeout_s=60,
                            sink=SinkSpec(target="adapters.api_sink:ApiSink",
                                          kwargs={"url": base, "token": token}))
        env0 = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"}
        first = TorchrunReporter(cfg, env0)
        first.resumed(0)
        for s in range(1, 8):
            first.step_done(s)
        first.close(60)
        second = TorchrunReporter(cfg, {**env0, "TORCHELASTIC_RESTART_COUNT": "1"})
        second.resumed(5)
        second.step_done(6)
        assert second.finished(6)
        kinds = by_kind(journal())
        (failure,) = [f for f in kinds["failure"] if f["job_id"] == "api-2"]
        assert failure["step"] == 7
        out = [o for o in kinds["outcome"] if o["failure_event_id"] == failure["event_id"]]
        assert [(o["outcome"], o["lost_steps"]) for o in out] == [("rolled_back", 2)]
    finally:
        serving.close()


def test_the_api_sink_needs_a_token_and_a_url(monkeypatch) -> None:
    monkeypatch.delenv("YOCO_INGEST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="YOCO_INGEST_TOKEN"):
        ApiSink("http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="http"):
        ApiSink("ftp://x", "t")
    monkeypatch.setenv("YOCO_INGEST_TOKEN", "yoco_from_env")
    assert ApiSink("http://127.0.0.1:1/")._headers["Authorization"] == "Bearer yoco_from_env"
