"""the alert kind ``report_issued``: an issued report e-mailed to the contract's subscribers

A ``report`` entry (a monthly report or a year-end statement issued over a signed
checkpoint) raises one ``report_issued`` event when ``YOCO_ALERTS_REPORT_EMAILS`` is on;
the kind is opt-in (only destinations that name it receive it) and an e-mail carries the
issued PDF and HTML. Added to the check constraints of ``alert_events.kind`` and
``alert_destinations.event_kinds``.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = (
    "year_at_risk", "year_below", "year_missed", "credit_issued", "checkpoint_stale",
    "record_refused", "test", "witness_down", "witness_refused", "checkpoint_cosigned",
)
NEW_KINDS = (*OLD_KINDS, "report_issued")


def _kinds(kinds: tuple[str, ...]) -> str:
    return ", ".join(repr(k) for k in kinds)


def _alert_checks(kinds: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_alert_events_kind_known"), "alert_events", type_="check")
    op.create_check_constraint(
        op.f("ck_alert_events_kind_known"), "alert_events", f"kind IN ({_kinds(kinds)})"
    )
    op.drop_constraint(
        op.f("ck_alert_destinations_event_kinds_known"), "alert_destinations", type_="check"
    )
    op.create_check_constraint(
        op.f("ck_alert_destinations_event_kinds_known"), "alert_destinations",
        f"event_kinds <@ ARRAY[{_kinds(kinds)}]::text[]",
    )


def upgrade() -> None:
    _alert_checks(NEW_KINDS)


def downgrade() -> None:
    # Refused (by the check constraint) while report_issued events are stored: the alerts
    # log is the operator's record and is never deleted.
    _alert_checks(OLD_KINDS)
