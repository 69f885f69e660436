"""the journal's (contract, kind, time) index leaves job_progress entries out

``ix_journal_entries_contract_id_kind_occurred_at`` serves the lookups of entries of the
rare kinds by contract and kind: monthly reports by digest or month
(``reports/monthly.py``), the projections' replay of the projected kinds
(``ledger.projections.replay``, which ``yoco ledger verify`` runs). No query looks
``job_progress`` entries up through it: they are read only in ``seq`` order, by the
journal's primary key (verification, export). Yet they are ~98% of the journal, and
keeping them in this index cost about a quarter of the server's work of appending a
journal row (docs/benchmarks.md, "Ledger"). The index becomes partial, ``WHERE kind <>
'job_progress'``: every query above implies the predicate (``kind = 'monthly_report'``,
``kind IN (...)`` without ``job_progress``), so the planner still uses it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_journal_entries_contract_id_kind_occurred_at"
COLUMNS = ["contract_id", "kind", "occurred_at"]
#: The one kind left out (the ledger's high-volume kind, read in seq order only).
PREDICATE = "kind <> 'job_progress'"


def upgrade() -> None:
    op.drop_index(INDEX, table_name="journal_entries")
    op.create_index(
        INDEX, "journal_entries", COLUMNS, unique=False, postgresql_where=sa.text(PREDICATE)
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="journal_entries")
    op.create_index(INDEX, "journal_entries", COLUMNS, unique=False)
