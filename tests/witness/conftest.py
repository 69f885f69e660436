"""Fixtures of the witness tests: the report tests' composition root and seeding."""

from __future__ import annotations

from tests.reports.conftest import app_ctx, engine_, seed

__all__ = ["app_ctx", "engine_", "seed"]
