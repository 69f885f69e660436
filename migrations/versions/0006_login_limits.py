"""web: login limits counted atomically per account at a client, per client, per account

Replaces ``login_attempts`` (one row per failure, counted with a SELECT before the
password check: concurrent attempts all saw the same count) by one row per key whose
counter is claimed with a row lock before the password is checked.  The old rows are
only rate-limit state (at most a window old): dropping them forgets recent failures.

Revision ID: 0006
Revises: 0003
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.helpers import grant_read_write, grant_sequences, revoke_all

revision: str = "0006"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "login_limits",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_limits")),
    )
    op.create_index(op.f("ix_login_limits_last_at"), "login_limits", ["last_at"], unique=False)
    grant_read_write("login_limits")
    revoke_all("login_attempts")
    op.drop_index(op.f("ix_login_attempts_key_at"), table_name="login_attempts")
    op.drop_table("login_attempts")


def downgrade() -> None:
    op.create_table(
        "login_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_attempts")),
    )
    op.create_index(
        op.f("ix_login_attempts_key_at"), "login_attempts", ["key", "at"], unique=False
    )
    grant_read_write("login_attempts")
    grant_sequences("login_attempts_id_seq")
    revoke_all("login_limits")
    op.drop_index(op.f("ix_login_limits_last_at"), table_name="login_limits")
    op.drop_table("login_limits")
