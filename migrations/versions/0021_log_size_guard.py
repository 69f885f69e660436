"""a log's size only ever follows its journal: ``ledger_logs.size`` is checked at commit

``yoco_app`` keeps ``UPDATE (size)`` on ``ledger_logs``: every append advances it, under
the log's row lock (``ledger.journal.append_encoded``). But any value it wrote was
trusted by the proofs: a size past the journal made checkpoint signing look for Merkle
nodes that do not exist and stopped every later log's checkpoint.
Now a deferred constraint trigger checks, when the transaction commits, that every log
whose row was inserted or whose size was updated has exactly the size its journal
gives (the next ``seq``: ``max(seq) + 1``, 0 when empty). Any other value — from
``yoco_app``, the owner or a superuser — makes the whole transaction fail, naming the
log, the size written and the size of the journal; nothing is written.

The check is deferred because an append writes the new size before the journal rows
(one COPY after), and it reads the row's size at commit (not the trigger's ``NEW``),
so several appends to one log in one transaction are checked against their sum.
It costs one primary-key lookup per log per appending transaction.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 13:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGER = "ledger_logs_size_follows_journal"

FUNCTION = """
CREATE OR REPLACE FUNCTION yoco_check_log_size() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    stored bigint;
    held bigint;
BEGIN
    SELECT l.size INTO stored FROM ledger_logs AS l WHERE l.log_id = NEW.log_id;
    SELECT coalesce(max(j.seq) + 1, 0) INTO held
      FROM journal_entries AS j WHERE j.log_id = NEW.log_id;
    IF stored IS DISTINCT FROM held THEN
        RAISE EXCEPTION 'yoco: ledger_logs.size of log % would be %, but its journal holds % '
            'entries: a log''s size only ever follows its journal', quote_literal(NEW.log_id),
            stored, held
            USING ERRCODE = 'check_violation',
                  DETAIL = 'the size is what proofs and checkpoints are computed to; '
                           'nothing was written';
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(FUNCTION)
    op.execute(
        f"CREATE CONSTRAINT TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OF size ON ledger_logs "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION yoco_check_log_size()"
    )
    op.execute(f"ALTER TABLE ledger_logs ENABLE ALWAYS TRIGGER {TRIGGER}")


def downgrade() -> None:
    op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON ledger_logs")
    op.execute("DROP FUNCTION IF EXISTS yoco_check_log_size()")
