"""web: API tokens may carry scopes (``metrics``: scrape ``/metrics``, nothing else)

A token now needs a customer (read), contracts (post records) or a scope.

Revision ID: 0016
Revises: 0004
Create Date: 2026-12-01 00:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_tokens",
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
    )
    op.drop_constraint(op.f("ck_api_tokens_has_scope"), "api_tokens", type_="check")
    op.create_check_constraint(
        op.f("ck_api_tokens_has_scope"),
        "api_tokens",
        "customer IS NOT NULL OR cardinality(contract_ids) > 0 OR cardinality(scopes) > 0",
    )
    op.create_check_constraint(
        op.f("ck_api_tokens_scopes_known"), "api_tokens", "scopes <@ ARRAY['metrics']::text[]"
    )


def downgrade() -> None:
    op.execute("DELETE FROM api_tokens WHERE customer IS NULL AND cardinality(contract_ids) = 0")
    op.drop_constraint(op.f("ck_api_tokens_scopes_known"), "api_tokens", type_="check")
    op.drop_constraint(op.f("ck_api_tokens_has_scope"), "api_tokens", type_="check")
    op.create_check_constraint(
        op.f("ck_api_tokens_has_scope"),
        "api_tokens",
        "customer IS NOT NULL OR cardinality(contract_ids) > 0",
    )
    op.drop_column("api_tokens", "scopes")
