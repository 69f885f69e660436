"""Fixtures of the report tests: a ledger seeded through the real ingest path, signed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from ledger.checkpoints import sign_all
from ledger.contracts import add_contracts
from ledger.ingest import ingest
from ledger.records import parse_contracts, validate_batch
from yoco.app import App
from yoco.database import unit_of_work


@pytest.fixture
def app_ctx(yoco_env: dict[str, str]) -> Any:
    """The composition root on the test database (signer key under the test's data dir)."""
    ctx = App()
    yield ctx
    ctx.close()


@pytest.fixture
def seed(app_ctx: App) -> Callable[..., None]:
    """Record contracts and records (all or nothing), then sign every log that grew."""
    import json

    def _seed(contracts: list[dict[str, Any]], records: list[dict[str, Any]],
              sign: bool = True) -> None:
        specs, errors = parse_contracts(json.dumps(contracts).encode())
        assert not errors, errors
        recs, errors = validate_batch(records)
        assert not errors, errors
        with unit_of_work(app_ctx.engine) as s:
            add_contracts(s, specs)
            ingest(s, recs, None, app_ctx.projectors)
        if sign:
            with unit_of_work(app_ctx.engine) as s:
                sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)

    return _seed


@pytest.fixture
def engine_(app_ctx: App) -> Engine:
    """The application-role engine of the test database."""
    return app_ctx.engine
