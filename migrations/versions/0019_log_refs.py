"""log references checked once per statement, not once per row

``journal_entries.log_id`` and ``merkle_nodes.log_id`` name a row of ``ledger_logs``.
A foreign key checked that row by row: one index probe and one row lock on the
log's row for every journal entry and every Merkle node (two per entry), about a third
of the database's work at ingest (docs/benchmarks.md, "Ledger"). This migration
keeps the same guarantee with checks done once per statement:

* an ``AFTER INSERT ... FOR EACH STATEMENT`` trigger on each of the two tables
  (``REFERENCING NEW TABLE``) looks up the distinct ``log_id`` values the statement
  inserted (an INSERT or a COPY: one per batch) and refuses the whole statement,
  with SQLSTATE 23503 (``foreign_key_violation``) and the missing log named, if any
  is not in ``ledger_logs``; so a bad reference writes nothing;
* the referenced side can no longer disappear: ``ledger_logs`` refuses DELETE,
  TRUNCATE and an UPDATE that changes a ``log_id``, for every role (a log, once
  created, is part of the ledger; the application role had none of these rights
  already, and the foreign key refused them for the owner on any log with entries).

The two tables are append-only (their UPDATE is refused by ``make_append_only``), so
INSERT is the only way a row gets a ``log_id``. Every trigger here is ``ENABLE
ALWAYS``, so a session in ``session_replication_role = replica`` (which skips foreign
keys) cannot skip it either. ``checkpoints`` keeps its foreign key (one row per
signing, not a hot path).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 11:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables whose ``log_id`` names a ``ledger_logs`` row, and their former foreign keys.
REFERENCING = {
    "journal_entries": "fk_journal_entries_log_id_ledger_logs",
    "merkle_nodes": "fk_merkle_nodes_log_id_ledger_logs",
}

CHECK_FUNCTION = """
CREATE OR REPLACE FUNCTION yoco_check_log_refs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    missing text;
BEGIN
    SELECT n.log_id INTO missing
      FROM (SELECT DISTINCT log_id FROM yoco_inserted) AS n
     WHERE NOT EXISTS (SELECT 1 FROM ledger_logs AS l WHERE l.log_id = n.log_id)
     ORDER BY n.log_id
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'yoco: insert into % refused: log_id % is not a ledger log',
            TG_TABLE_NAME, quote_literal(missing)
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = 'every row of ' || TG_TABLE_NAME
                           || ' must name a row of ledger_logs; nothing was written';
    END IF;
    RETURN NULL;
END
$$
"""

KEEP_FUNCTION = """
CREATE OR REPLACE FUNCTION yoco_keep_ledger_logs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.log_id = OLD.log_id THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'yoco: % on ledger_logs is refused: a log is never deleted or '
        'renamed (its journal entries and Merkle nodes name it)', TG_OP
        USING ERRCODE = 'foreign_key_violation';
END
$$
"""


def upgrade() -> None:
    op.execute(CHECK_FUNCTION)
    op.execute(KEEP_FUNCTION)
    for table, fk in REFERENCING.items():
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {fk}")
        op.execute(
            f"CREATE TRIGGER {table}_log_refs AFTER INSERT ON {table} "
            "REFERENCING NEW TABLE AS yoco_inserted "
            "FOR EACH STATEMENT EXECUTE FUNCTION yoco_check_log_refs()"
        )
        op.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_log_refs")
    op.execute(
        "CREATE TRIGGER ledger_logs_keep BEFORE DELETE OR UPDATE OF log_id ON ledger_logs "
        "FOR EACH ROW EXECUTE FUNCTION yoco_keep_ledger_logs()"
    )
    op.execute(
        "CREATE TRIGGER ledger_logs_no_truncate BEFORE TRUNCATE ON ledger_logs "
        "FOR EACH STATEMENT EXECUTE FUNCTION yoco_keep_ledger_logs()"
    )
    op.execute("ALTER TABLE ledger_logs ENABLE ALWAYS TRIGGER ledger_logs_keep")
    op.execute("ALTER TABLE ledger_logs ENABLE ALWAYS TRIGGER ledger_logs_no_truncate")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS ledger_logs_no_truncate ON ledger_logs")
    op.execute("DROP TRIGGER IF EXISTS ledger_logs_keep ON ledger_logs")
    for table, fk in REFERENCING.items():
        op.execute(f"DROP TRIGGER IF EXISTS {table}_log_refs ON {table}")
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {fk} "
            "FOREIGN KEY (log_id) REFERENCES ledger_logs (log_id)"
        )
    op.execute("DROP FUNCTION IF EXISTS yoco_keep_ledger_logs()")
    op.execute("DROP FUNCTION IF EXISTS yoco_check_log_refs()")
