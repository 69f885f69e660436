"""An evidence pack: everything a customer needs to check an issued document alone.

One ZIP file per contract and issued document -- a month's report (period ``YYYY-MM``)
or a contract year's year-end statement (period ``year-K``) -- built from what is stored
(nothing is rendered again), the same way for both:

* the issued document, HTML and PDF, the exact stored bytes (:mod:`reports.documents`);
* ``SHA256SUMS`` (``sha256sum -c`` reads it): the report's two digests are those its
  ``report`` ledger entry records;
* ``report-entry.json``: that entry's exact bytes (the Merkle leaf), and
  ``report-entry-proof.json``: its inclusion proof (:func:`ledger.services.inclusion_bundle`)
  against the checkpoint of the log archive beside it;
* ``checkpoint-<N>``: the signed checkpoint the report was issued over, with the
  witnesses' cosignatures (:func:`ledger.witnessing.cosigned_note`);
* ``<contract>-log-<M>.tar.gz``: the contract's whole log up to a signed checkpoint that
  holds the report entry (and meets the contract's witness policy), the archive of
  :func:`ledger.export.export_tar` that ``yoco-verify`` reads as it is;
* ``README.txt``: what each file is, and the ``yoco-verify`` command that checks them all.

Only an issued document has a pack (:class:`~reports.errors.NotIssued` otherwise), and
only once a signed checkpoint holds its ``report`` entry (:class:`EvidenceNotReady`; the
scheduler signs one right after issuing).  For a contract with a witness policy
(``terms.witnesses``) the log is cut at the newest checkpoint that meets it: a newer
checkpoint with too few cosignatures is passed over, and when none that meets it holds
the entry yet the pack is refused (:class:`EvidenceNotReady`, saying why).  The same
checkpoint and cosignatures give the same bytes: every member is dated with the log
checkpoint's signing time.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.witness_policy import latest_witnessed, policy_at
from ledger.checkpoints import at_size
from ledger.contracts import get_contract
from ledger.export import export_tar, find_checkpoint
from ledger.models import Checkpoint
from ledger.services import inclusion_bundle
from ledger.witnessing import cosigned_note
from reports.documents import document_of, issued_document
from reports.errors import BadMonth, NotIssued, ReportError
from reports.models import MONTHLY, STATEMENT
from reports.monthly import file_stem, parse_month, safe_name
from reports.statement import statement_period, statement_stem
from yoco_records.textsafe import safe_text

__all__ = [
    "STAGES",
    "EvidenceNotReady",
    "EvidencePack",
    "build_evidence_pack",
    "evidence_period",
    "pack_name",
]

#: The stages :func:`build_evidence_pack` reports to its ``progress`` callback, in order.
STAGES = ("report", "proof", "log", "pack")


class EvidenceNotReady(ReportError):
    """The document was issued, but no signed checkpoint (meeting the contract's witness
    policy) holds its ``report`` entry yet: the pack's log could not show it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidencePack:
    """A built evidence pack: its file name and bytes, and what it rests on."""

    contract_id: str
    #: ``YYYY-MM`` (a month's report) or ``year-K`` (a year-end statement).
    period: str
    document: str
    file_name: str
    data: bytes
    issued_checkpoint: int
    report_seq: int
    log_tree_size: int
    files: tuple[str, ...]


def pack_name(contract_id: str, period: str) -> str:
    """The file name of the evidence pack of ``contract_id`` for ``period`` (``YYYY-MM``
    or ``year-K``), safe on every file system."""
    return f"yoco-evidence-{safe_name(contract_id)}-{period}.zip"


def evidence_period(contract_id: str, period: str) -> tuple[str, str, str]:
    """``period`` (``YYYY-MM``, or ``year-K`` for a year-end statement) as the document
    kind, the period as stored and the stem of its files (the issued downloads' names).
    Raises :class:`~reports.errors.BadMonth` for anything else."""
    if document_of(period) == STATEMENT:
        k = int(period.removeprefix("year-"))
        return STATEMENT, statement_period(k), statement_stem(contract_id, k)
    if period.startswith("year-"):
        raise BadMonth(f"expected year-K with K from 1 to 999 (a contract year), got {period!r}")
    year, mon = parse_month(period)
    return MONTHLY, f"{year:04d}-{mon:02d}", file_stem(contract_id, year, mon)


def _log_checkpoint(
    session: Session, contract_id: str, seq: int, tree_size: int | None
) -> Checkpoint:
    """The signed checkpoint the pack's log is exported at: ``tree_size``, or the newest
    that meets the contract's witness policy; it must hold entry ``seq``."""
    if tree_size is not None:
        cp = find_checkpoint(session, contract_id, tree_size)
    else:
        found, _ = latest_witnessed(session, contract_id)
        if found is None:
            raise EvidenceNotReady(
                f"no signed checkpoint of contract {contract_id!r} meets its witness policy "
                "yet: the pack's log must rest on one (try again once the witnesses have "
                "cosigned)"
            )
        cp = found
    if cp.tree_size <= seq:
        raise EvidenceNotReady(
            f"the report's ledger entry {seq} of contract {contract_id!r} is not under a "
            f"signed checkpoint{' meeting its witness policy' if tree_size is None else ''} "
            f"yet (checkpoint {cp.tree_size} holds entries 0 to {cp.tree_size - 1}): try "
            "again after the next checkpoint"
        )
    return cp


def build_evidence_pack(
    session: Session,
    contract_id: str,
    period: str,
    *,
    tree_size: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> EvidencePack:
    """The evidence pack of ``contract_id``'s issued document for ``period``: a month's
    report (``YYYY-MM``) or contract year K's year-end statement (``year-K``), the same
    contents for both.

    The log is exported at the signed checkpoint of ``tree_size`` (default: the newest
    that meets the contract's witness policy), which must hold the document's ``report``
    entry.  Reads only.  Raises :class:`~reports.errors.BadMonth`,
    :class:`~ledger.errors.UnknownContract`, :class:`~reports.errors.NotIssued` (a
    document not issued has no pack), :class:`EvidenceNotReady`, and the errors of
    :func:`ledger.export.export_tar` (a log that does not hash to its signed root is
    never packed).  ``progress(stage)`` is called as each of :data:`STAGES` begins.
    """
    say = progress or (lambda _stage: None)
    document, label, stem = evidence_period(contract_id, period)
    spec = get_contract(session, contract_id)
    say("report")
    doc = issued_document(session, contract_id, label, document)
    if doc is None:
        if document == STATEMENT:
            raise NotIssued(
                f"the year-end statement of contract year {label.removeprefix('year-')} of "
                f"{contract_id!r} has not been issued (yet): only an issued statement has an "
                "evidence pack (a statement is issued after billing's year close, over a "
                "checkpoint that covers it)"
            )
        raise NotIssued(
            f"the report of contract {contract_id!r} for {label} has not been issued (yet): "
            "only an issued month has an evidence pack (a month is issued after it ends, "
            "over a checkpoint signed after its end)"
        )
    log_cp = _log_checkpoint(session, contract_id, doc.seq, tree_size)
    issued_cp = at_size(session, contract_id, doc.checkpoint_size)
    if issued_cp is None:  # pragma: no cover - checkpoints are append-only
        raise EvidenceNotReady(f"checkpoint {doc.checkpoint_size} is not stored")
    say("proof")
    proof = inclusion_bundle(session, str(doc.event_id), log_cp.tree_size)
    entry_bytes = base64.b64decode(proof["entry"])
    say("log")
    info, archive = export_tar(session, contract_id, log_cp.tree_size)
    say("pack")
    log_name = f"{safe_name(contract_id)}-log-{info.tree_size}.tar.gz"
    checkpoint_name = f"checkpoint-{doc.checkpoint_size}"
    members: dict[str, bytes] = {
        f"{stem}.pdf": doc.pdf,
        f"{stem}.html": doc.html_bytes,
        "report-entry.json": entry_bytes,
        "report-entry-proof.json": (json.dumps(proof, indent=2) + "\n").encode("utf-8"),
        checkpoint_name: cosigned_note(session, issued_cp).encode("utf-8"),
        log_name: archive,
    }
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n"
                   for name, data in members.items())
    members["SHA256SUMS"] = sums.encode("ascii")
    readme = _readme(
        contract_id=contract_id,
        customer=spec.customer,
        document=document,
        period=label,
        stem=stem,
        log_name=log_name,
        checkpoint_name=checkpoint_name,
        doc_fields=doc.entry(),
        log_size=info.tree_size,
        log_root=info.root_hash,
        witnessed=policy_at(session, contract_id, info.tree_size) is not None,
    )
    files = ("README.txt", *members)
    top = pack_name(contract_id, label).removesuffix(".zip")
    data = _zip(top, {"README.txt": readme.encode("utf-8"), **members}, log_cp.signed_at)
    return EvidencePack(
        contract_id=contract_id,
        period=label,
        document=document,
        file_name=pack_name(contract_id, label),
        data=data,
        issued_checkpoint=doc.checkpoint_size,
        report_seq=doc.seq,
        log_tree_size=info.tree_size,
        files=files,
    )


def _zip(top: str, members: dict[str, bytes], stamp: datetime) -> bytes:
    """A ZIP of ``members`` under folder ``top``, every member dated ``stamp`` (UTC), so
    the same content gives the same bytes."""
    when = stamp.astimezone(UTC).timetuple()[:6]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(f"{top}/{name}", date_time=when)
            info.external_attr = 0o644 << 16
            # The log archive is gzip already: stored as it is.
            info.compress_type = (zipfile.ZIP_STORED if name.endswith(".tar.gz")
                                  else zipfile.ZIP_DEFLATED)
            zf.writestr(info, data)
    return buf.getvalue()


def _readme(
    *,
    contract_id: str,
    customer: str,
    document: str,
    period: str,
    stem: str,
    log_name: str,
    checkpoint_name: str,
    doc_fields: dict[str, Any],
    log_size: int,
    log_root: bytes,
    witnessed: bool,
) -> str:
    """The pack's README: what each file is and how to check them (docs/audit.md)."""
    issued_at = datetime.fromisoformat(doc_fields["issued_at"]).astimezone(UTC)
    size = doc_fields["checkpoint_tree_size"]
    seq = doc_fields["seq"]
    terms = (
        "\n   Your contract names witnesses (terms.witnesses): add --terms YOUR-CONTRACT.json\n"
        "   (your own copy, as signed) to hold the log to the policy you agreed.\n"
        if witnessed else ""
    )
    if document == STATEMENT:
        k = period.removeprefix("year-")
        what = f"year-end statement of contract year {k}"
        thing, things = "statement", "year-end statement"
        figures = (
            f"the year close the statement states (contract year {k}'s figures,\n"
            "   recomputed from the entries before the close) and its credit, held to the\n"
            "   contract's credit rule"
        )
    else:
        what = f"monthly SLA report {period}"
        thing, things = "report", "report"
        figures = "every figure of the report, recomputed from the entries alone"
    # Stored text goes through the one neutraliser: `cat README.txt` prints it.
    title = safe_text(f"Evidence pack: {what} of contract {contract_id} ({customer})")
    log_root_b64 = base64.b64encode(log_root).decode()
    event_id = doc_fields["event_id"]
    command = (f"yoco-verify {log_name} --public-key operator.key --report {stem}.pdf "
               f"--report {stem}.html --since {checkpoint_name}")
    return f"""{title}
{"=" * len(title)}

The {thing} was issued at {issued_at.isoformat(timespec="seconds")} over signed checkpoint
{size} of the contract's log (root {doc_fields["checkpoint_root_hash"]}),
and its SHA-256 digests were recorded in ledger entry {seq} (event id {event_id}).
The log archive here runs to signed checkpoint {log_size} (root {log_root_b64}),
which holds that entry.

Files
-----
{stem}.pdf
    The issued {things} (PDF), byte for byte as issued. SHA-256 {doc_fields["pdf_sha256"]}
{stem}.html
    The same {thing} (HTML), byte for byte as issued. SHA-256 {doc_fields["html_sha256"]}
SHA256SUMS
    The SHA-256 of every file here but this README and itself (check with:
    sha256sum -c SHA256SUMS).
    The {thing}'s two digests are the html_sha256 and pdf_sha256 of its ledger entry.
report-entry.json
    Ledger entry {seq}, the `report` entry, its exact bytes (RFC 8785 canonical JSON,
    the Merkle leaf).
report-entry-proof.json
    The inclusion proof of that entry (format yoco-inclusion-proof/v1) against signed
    checkpoint {log_size}, the one the log archive is exported at.
{checkpoint_name}
    The signed checkpoint the {thing} was issued over (size {size}), as a C2SP
    signed note, with the witnesses' cosignatures it has.
{log_name}
    The contract's whole log up to signed checkpoint {log_size}, in the C2SP
    tlog-tiles layout. Do not unpack it: yoco-verify reads the archive as it is.

How to check it
---------------
1. Pin the operator's public key through a channel you trust (the contract annex, a
   signed e-mail) and save it as operator.key. Do not take it from this pack or from
   the site you downloaded it from: everything below is only as good as that key.

2. Install the verifier once (the verifier/ folder of the yoco repository, which your
   operator provides; it needs no database and no network):

   pip install ./verifier

3. In this folder, run:

   {command}
{terms}
   It checks every entry of the log against the signed checkpoint and your key; that
   each {thing} file is the issued one, byte for byte (its SHA-256 is recorded by a
   `report` entry of the log); that the {thing}'s checkpoint is the root of the log's
   first {size} entries; {figures}; and that the log extends the checkpoint the
   {thing} was issued over (a consistency proof), listing every correction recorded
   since.
   It exits 0 and prints "OK: every check passed and every figure matches" only
   when all of that holds; otherwise it names each problem and exits 1.

4. The inclusion proof stands alone as well, for a check without the whole log:
   the operator's `yoco verify-proof report-entry-proof.json --public-key operator.key`,
   or by hand with any RFC 9162 tooling (docs/proofs.md in the yoco repository). Step 3
   already checks the entry as part of the whole log.

The procedure in full, and what the verifier does not check: the portal's guide "Check
the figures yourself" (/verify), and docs/audit.md in the yoco repository.
"""
