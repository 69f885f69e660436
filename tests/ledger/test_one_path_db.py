"""One validate → ingest → commit path: the CLI, the API and the runtime's sink all go
through :func:`ledger.ingest.ingest_batch`, so the same bad record gets the same words
whichever way it came, and nothing is written."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

import ledger.ingest
from ledger.contracts import add_contracts
from ledger.errors import IngestRefused
from ledger.records import parse_contracts
from tests import factories as f
from yoco.cli import build_app
from yoco.database import unit_of_work

CLI = build_app()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the one ingest path, by the kind of batch it was given."""
    seen: list[str] = []
    real = ledger.ingest.ingest_batch

    def spy(unit: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(type(batch).__name__)
        return real(unit, batch, *args, **kwargs)

    monkeypatch.setattr(ledger.ingest, "ingest_batch", spy)
    return seen


@pytest.fixture
def entry_points(
    yoco_env: dict[str, str], engine: Engine, sink_url: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """Deliver a refused batch by the CLI, the API or the sink; each returns what it said
    of each refused record as (place in the batch from 0, field, message)."""
    from web.accounts import create_token
    from web.security import password_hasher
    from web.settings import WebSettings
    from yoco.app import App
    from yoco.sink import ledger_sink
    from yoco.webapp import portal_app

    specs, errors = parse_contracts(f.jsonl([f.contract("C-1")]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
        token = create_token(s, name="rt", contract_ids=["C-1"]).text
    ctx = App()
    client = TestClient(portal_app(ctx, WebSettings(secret_key="t"),
                                   hasher=password_hasher(cheap=True)))
    sink = ledger_sink(sink_url)

    def journal() -> int:
        with engine.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())

    def by_cli(batch: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
        path = tmp_path / "batch.jsonl"
        path.write_bytes(f.jsonl(batch))
        r = CliRunner().invoke(CLI, ["ledger", "ingest", str(path)])
        assert r.exit_code == 2, r.output
        assert "record(s) refused, nothing written" in r.output
        said = []
        for ln in r.output.splitlines():
            # "  line 2: field 'gpus': must be …" (RecordError's str)
            m = re.fullmatch(r"  line (\d+): field '([^']*)': (.*)", ln)
            if m:
                said.append((int(m[1]) - 1, m[2], m[3]))
        return said

    def by_api(batch: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
        r = client.post("/api/v1/records", json=batch,
                        headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 422, r.text
        return [(e["index"], e["field"], e["message"]) for e in r.json()["errors"]]

    def by_sink(batch: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
        with pytest.raises(IngestRefused) as exc:
            sink.deliver(batch)
        assert sink.is_permanent(exc.value)
        return [(e.index, e.field, e.message) for e in exc.value.errors]

    with client:
        yield {"cli": by_cli, "api": by_api, "sink": by_sink, "journal": journal,
               "sink_object": sink}
    sink.close()


def test_the_same_bad_record_is_refused_with_the_same_words_everywhere(
    entry_points: dict[str, Any], calls: list[str]
) -> None:
    journal = entry_points["journal"]
    before = journal()
    bad = [f.job_started(), f.job_started(job="j2", gpus=0)]
    said = {name: entry_points[name](bad) for name in ("cli", "api", "sink")}
    assert said["cli"] == said["api"] == said["sink"], said
    assert said["cli"] and said["cli"][0][:2] == (1, "gpus")
    assert journal() == before  # the good record of each refused batch was not written
    assert calls == ["FileBatch", "RecordBatch", "RecordBatch"]


def test_a_refusal_that_needs_the_ledger_has_the_same_words_everywhere(
    entry_points: dict[str, Any], calls: list[str]
) -> None:
    # Valid on its own; refused only once the ledger is asked (no such failure).
    journal = entry_points["journal"]
    before = journal()
    batch = [f.job_started(), f.outcome("00000000-0000-4000-8000-000000000001")]
    said = {name: entry_points[name](batch) for name in ("cli", "api", "sink")}
    assert said["cli"] == said["api"] == said["sink"], said
    assert said["cli"] and said["cli"][0][:2] == (1, "failure_event_id")
    assert journal() == before
    assert calls == ["FileBatch", "RecordBatch", "RecordBatch"]


def test_the_sink_names_the_element_of_its_batch_when_repeats_collapse(
    entry_points: dict[str, Any],
) -> None:
    # An identical repeat is collapsed before the ledger's checks: the refusal still names
    # the bad record's place in the batch the runtime sent (index 2), as the API does.
    start = f.job_started()
    bad = f.outcome("00000000-0000-4000-8000-000000000001")
    with pytest.raises(IngestRefused) as exc:
        entry_points["sink_object"].deliver([start, start, bad])
    assert [(e.index, e.field) for e in exc.value.errors] == [(2, "failure_event_id")]
