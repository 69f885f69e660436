"""Fixtures of the audit-kit tests: the report tests' seeded, signed ledger."""

from tests.reports.conftest import app_ctx, engine_, seed

__all__ = ["app_ctx", "engine_", "seed"]
