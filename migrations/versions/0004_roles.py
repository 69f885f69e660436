"""roles: projections insert-only for the application role; updates only as a journal entry says

The application role ``yoco_app`` (which the CLI's, the portal's and the sink's login
roles switch to) loses UPDATE, DELETE and TRUNCATE on every projection table.  Four
projections change state as later entries arrive (a job span is closed, a year is
adjusted or marked pending, a credit is applied or voided, a dispute is decided): on
those it may UPDATE only the state columns (never a key, never who or what the row
is), and a row trigger refuses the update unless a journal entry justifies that very
step (the entry named by the update is in the journal, in the same log, of the right
kind, about this row, and the row is in the state the step starts from).  The exact
values are then what ``yoco ledger verify`` checks against a replay of the journal.

Only the owner role (``yoco_owner``, the rebuild path: ``yoco ledger rebuild``) and
superusers may change projections freely.  ``ledger_logs`` keeps only UPDATE of
``size`` (checked by verify against the entries).

Revision ID: 0004
Revises: 0006
Create Date: 2026-11-30 23:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations.helpers import APP_ROLE, OWNER_ROLE

revision: str = "0004"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PROJECTIONS = (
    "contracts",
    "job_spans",
    "failures",
    "outcomes",
    "exclusions",
    "billing_years",
    "billing_closes",
    "billing_credits",
    "billing_credit_applications",
    "billing_disputes",
    "billing_reclassifications",
    "billing_amendments",
    "billing_exports",
)

#: The state columns the application role may update, per projection that has state.
STATE_COLUMNS: dict[str, tuple[str, ...]] = {
    "job_spans": ("finished_at", "finish_event_id"),
    "billing_years": (
        "last_event_id",
        "last_seq",
        "guarantee_met",
        "adjustments",
        "pending_seq",
        "pending_event_id",
    ),
    "billing_credits": ("applied_minor", "status", "void_event_id", "voided_at"),
    "billing_disputes": (
        "status",
        "resolution",
        "decision_event_id",
        "decided_at",
        "decided_by",
        "note",
    ),
}

# Each guard: the step the update makes must be one a journal entry of the row's log
# justifies.  The owner (the rebuild path) is let through: it owns the tables and could
# drop the trigger anyway.
_ENTRY = (
    "EXISTS (SELECT 1 FROM journal_entries j WHERE j.log_id = NEW.contract_id "
    "AND j.event_id = {eid} AND j.kind IN ({kinds}) AND {more})"
)
GUARDS: dict[str, str] = {
    "job_spans": "OLD.finish_event_id IS NULL AND "
    + _ENTRY.format(
        eid="NEW.finish_event_id",
        kinds="'job_finished'",
        more="j.body ->> 'job_id' = NEW.job_id AND j.seq > NEW.start_seq "
        "AND j.occurred_at = NEW.finished_at",
    ),
    "billing_disputes": "OLD.status = 'open' AND NEW.status <> 'open' AND "
    + _ENTRY.format(
        eid="NEW.decision_event_id",
        kinds="'dispute_resolved', 'dispute_rejected'",
        more="j.body ->> 'dispute_id' = NEW.dispute_id::text "
        "AND NEW.status = CASE j.kind WHEN 'dispute_resolved' THEN 'resolved' "
        "ELSE 'rejected' END",
    ),
    # A credit is voided by a credit_void entry, or applied (its balance is then the sum of
    # its applications, which are rows of their own, inserted first).
    "billing_credits": "OLD.status <> 'void' AND CASE WHEN NEW.status = 'void' THEN "
    + _ENTRY.format(
        eid="NEW.void_event_id",
        kinds="'credit_void'",
        more="j.body ->> 'credit_id' = NEW.credit_id::text",
    )
    + " AND NEW.applied_minor = OLD.applied_minor ELSE NEW.void_event_id IS NULL "
    "AND NEW.applied_minor > OLD.applied_minor "
    "AND NEW.applied_minor = (SELECT coalesce(sum(a.amount_minor), 0) "
    "FROM billing_credit_applications a WHERE a.credit_id = NEW.credit_id) END",
    # A closed year is either marked pending by a late entry, or adjusted by an
    # adjustment entry (which clears the mark and counts one more adjustment).
    "billing_years": "(NEW.last_event_id = OLD.last_event_id AND NEW.last_seq = OLD.last_seq "
    "AND NEW.guarantee_met = OLD.guarantee_met AND NEW.adjustments = OLD.adjustments "
    "AND OLD.pending_event_id IS NULL AND NEW.pending_event_id IS NOT NULL AND "
    + _ENTRY.format(
        eid="NEW.pending_event_id",
        kinds="'failure', 'outcome', 'exclusion', 'reclassification'",
        more="j.seq = NEW.pending_seq AND j.seq > NEW.last_seq",
    )
    + ") OR (NEW.last_seq > OLD.last_seq AND NEW.adjustments = OLD.adjustments + 1 "
    "AND NEW.pending_event_id IS NULL AND NEW.pending_seq IS NULL AND "
    + _ENTRY.format(
        eid="NEW.last_event_id",
        kinds="'adjustment'",
        more="j.seq = NEW.last_seq AND (j.body ->> 'year')::int = NEW.year",
    )
    + ")",
}


def _guard_function(table: str, condition: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION yoco_guard_{table}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, '{OWNER_ROLE}', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF ({condition}) IS NOT TRUE THEN
        RAISE EXCEPTION 'yoco: this UPDATE of {table} is refused: a projection changes only '
            'as a journal entry appended to its log says (or by yoco ledger rebuild)'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$
"""


def upgrade() -> None:
    for table in PROJECTIONS:
        op.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON {table} FROM {APP_ROLE}")
        op.execute(f"GRANT SELECT, INSERT ON {table} TO {APP_ROLE}")
    for table, columns in STATE_COLUMNS.items():
        op.execute(f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {APP_ROLE}")
        op.execute(_guard_function(table, GUARDS[table]))
        op.execute(
            f"CREATE TRIGGER {table}_guard BEFORE UPDATE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION yoco_guard_{table}()"
        )
        op.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_guard")
    op.execute(f"REVOKE UPDATE, DELETE, TRUNCATE ON ledger_logs FROM {APP_ROLE}")
    op.execute(f"GRANT UPDATE (size) ON ledger_logs TO {APP_ROLE}")
    # Every login role reads the schema version (``require_schema``) without switching role.
    op.execute("GRANT SELECT ON alembic_version TO PUBLIC")


def downgrade() -> None:
    # alembic_version stays readable: a login role must be able to see the schema is old.
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ledger_logs TO {APP_ROLE}")
    for table in STATE_COLUMNS:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_guard ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS yoco_guard_{table}()")
    for table in PROJECTIONS:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}")
