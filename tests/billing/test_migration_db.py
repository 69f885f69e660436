"""Migration 0002 (billing) on a real PostgreSQL: no drift, and down/up again."""

from __future__ import annotations

from sqlalchemy import create_engine, text

import migrations


def test_billing_migration_matches_the_models_and_downgrades_cleanly(empty_db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    migrations.upgrade(empty_db_url, "0002")
    eng = create_engine(empty_db_url)
    try:
        with eng.connect() as c:
            diff = compare_metadata(MigrationContext.configure(c), migrations.target_metadata())
            diff = [d for d in diff if "billing_" in repr(d)]
        assert diff == [], f"billing models and migration 0002 disagree: {diff}"
        migrations.downgrade(empty_db_url, "0001")
        with eng.connect() as c:
            left = c.execute(
                text("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'billing_%'")
            ).scalar_one()
        assert left == 0
        migrations.upgrade(empty_db_url, "0002")
    finally:
        eng.dispose()
