"""Issued documents as stored (:mod:`reports.models`): read them, and add one.

The lowest layer of issued reports: no rendering, no ledger.  :mod:`reports.monthly`
issues a rendered report through :func:`insert_issued` (after recording its entry) and
:mod:`reports.issued` builds the schedule on top.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from reports.models import MONTHLY, STATEMENT, IssuedDocument

#: The periods each kind of document is issued for (the database checks the same).
_PERIODS = (
    (MONTHLY, re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])")),
    (STATEMENT, re.compile(r"year-[1-9][0-9]{0,2}")),
)


def document_of(period: str) -> str | None:
    """The kind of document ``period`` names: ``monthly-sla`` for ``YYYY-MM``,
    ``year-statement`` for ``year-K``; None for anything else."""
    for kind, pattern in _PERIODS:
        if pattern.fullmatch(period):
            return kind
    return None

__all__ = [
    "IssuedReport",
    "document_of",
    "insert_issued",
    "issued_document",
    "list_issued",
]

@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedReport:
    """An issued report as stored: its bytes (absent when listed without them), digests,
    the checkpoint it was computed over and its ``report`` ledger entry (``seq`` is the
    entry's index in the contract's log).  ``created``: issued by this call."""

    contract_id: str
    document: str
    period: str
    event_id: uuid.UUID
    seq: int
    checkpoint_size: int
    checkpoint_root: str
    html_sha256: str
    pdf_sha256: str
    issued_at: datetime
    html_bytes: bytes = b""
    pdf: bytes = b""
    created: bool = False

    @property
    def month_label(self) -> str:
        """The month, ``YYYY-MM`` (the period of a monthly report)."""
        return self.period

    @property
    def html(self) -> str:
        """The HTML as text (the stored bytes are its UTF-8)."""
        return self.html_bytes.decode("utf-8")

    def entry(self) -> dict[str, Any]:
        """The fields of its ``report`` ledger entry that name it (for lists and APIs)."""
        return {
            "contract_id": self.contract_id,
            "report": self.document,
            "month": self.period,
            "checkpoint_tree_size": self.checkpoint_size,
            "checkpoint_root_hash": self.checkpoint_root,
            "event_id": str(self.event_id),
            "seq": self.seq,
            "html_sha256": self.html_sha256,
            "pdf_sha256": self.pdf_sha256,
            "issued_at": self.issued_at.astimezone(UTC).isoformat(),
        }


def _of(row: IssuedDocument, *, with_bytes: bool, created: bool = False) -> IssuedReport:
    return IssuedReport(
        contract_id=row.contract_id,
        document=row.document,
        period=row.period,
        event_id=row.event_id,
        seq=row.seq,
        checkpoint_size=row.checkpoint_tree_size,
        checkpoint_root=row.checkpoint_root_hash,
        html_sha256=row.html_sha256,
        pdf_sha256=row.pdf_sha256,
        issued_at=row.issued_at,
        html_bytes=bytes(row.html) if with_bytes else b"",
        pdf=bytes(row.pdf) if with_bytes else b"",
        created=created,
    )


def issued_document(
    session: Session,
    contract_id: str,
    period: str,
    document: str = MONTHLY,
    *,
    with_bytes: bool = True,
) -> IssuedReport | None:
    """The issued document of ``contract_id`` for ``period`` (``YYYY-MM``), with its
    stored bytes unless ``with_bytes`` is False; None when it was not issued.  Under the
    portal role, row-level security hides other tenants' documents (None)."""
    q = select(IssuedDocument).where(
        IssuedDocument.contract_id == contract_id,
        IssuedDocument.document == document,
        IssuedDocument.period == period,
    )
    if not with_bytes:
        q = q.options(defer(IssuedDocument.html), defer(IssuedDocument.pdf))
    row = session.execute(q).scalar_one_or_none()
    return None if row is None else _of(row, with_bytes=with_bytes)


def list_issued(
    session: Session, contract_id: str, document: str | None = MONTHLY
) -> list[IssuedReport]:
    """Every issued document of ``contract_id`` of kind ``document`` (None: every kind),
    without bytes, by kind and period."""
    q = select(IssuedDocument).where(IssuedDocument.contract_id == contract_id)
    if document is not None:
        q = q.where(IssuedDocument.document == document)
    rows = session.execute(
        q
        .options(defer(IssuedDocument.html), defer(IssuedDocument.pdf))
        .order_by(IssuedDocument.document, IssuedDocument.period)
    ).scalars()
    return [_of(r, with_bytes=False) for r in rows]


def insert_issued(
    session: Session,
    *,
    contract_id: str,
    period: str,
    event_id: uuid.UUID,
    seq: int,
    checkpoint_size: int,
    checkpoint_root: str,
    html: bytes,
    pdf: bytes,
    html_sha256: str,
    pdf_sha256: str,
    document: str = MONTHLY,
) -> IssuedReport:
    """Store an issued document (its ``report`` entry ``seq`` already appended); the
    database refuses a second one for the same contract and period, and digests that
    are not the bytes'.  Never commits."""
    row = IssuedDocument(
        contract_id=contract_id,
        document=document,
        period=period,
        event_id=event_id,
        seq=seq,
        checkpoint_tree_size=checkpoint_size,
        checkpoint_root_hash=checkpoint_root,
        html=html,
        pdf=pdf,
        html_sha256=html_sha256,
        pdf_sha256=pdf_sha256,
    )
    session.add(row)
    session.flush()
    return _of(row, with_bytes=True, created=True)
