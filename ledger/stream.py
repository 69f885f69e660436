"""Large JSONL files in bounded memory: a compact index first, records re-read in chunks.

`yoco ledger ingest` used to hold the whole file, every parsed object and every
canonical encoding at once (a 50 MB file peaked at 854 MB). Here a first streaming pass
validates every line and keeps only a compact index entry per record (what
:func:`ledger.records.causal_order` needs, the line's offset and the leaf hash of the
canonical bytes); :func:`read_records` then re-reads the lines of one chunk at a time,
in the order they are appended (see :func:`ledger.ingest.ingest_file`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ledger.canonical import JsonInputError, parse_json_strict
from ledger.merkle import leaf_hash
from ledger.records import OrderKey, Record, RecordError, order_key
from yoco_records.schema import _line_error, validate_record

__all__ = ["FileIndex", "index_file", "read_records"]

#: At most this many errors are kept (the rest are counted): a wholly wrong file must
#: not cost more memory than a right one.
MAX_ERRORS = 1000


@dataclass(slots=True)
class FileIndex:
    """Every valid record of a file, compactly: order keys, line offsets, leaf hashes.

    ``now`` is the clock the lines were validated against (re-reads use the same), and
    ``errors`` the refusals (at most :data:`MAX_ERRORS`; ``error_count`` counts all).
    """

    path: Path
    now: datetime
    keys: list[OrderKey] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    #: RFC 9162 leaf hashes of the records' canonical bytes (what the journal stores).
    leaves: list[bytes] = field(default_factory=list)
    errors: list[RecordError] = field(default_factory=list)
    error_count: int = 0
    size: int = 0

    def error(self, e: RecordError) -> None:
        """Keep ``e`` (up to :data:`MAX_ERRORS`) and count it."""
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(e)


def _intern(table: dict[str, str], value: str | None) -> str | None:
    # Contract and job ids repeat on every line: keep one string object each.
    if value is None:
        return None
    return table.setdefault(value, value)


def index_file(
    path: Path,
    *,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> FileIndex:
    """Validate every line of the JSONL file ``path``, keeping a compact index.

    Promises: the same rules and errors as :func:`ledger.records.parse_jsonl` (lines
    numbered from 1, blank lines skipped, every bad line reported, an event id repeated
    with identical content collapsed to its first line and with different content
    refused at the later line), in memory proportional to the number of records, not
    to the file. ``progress`` is called with the bytes read so far, now and then.
    """
    index = FileIndex(path=path, now=now or datetime.now(UTC))
    names: dict[str, str] = {}
    first: dict[str, tuple[bytes, int]] = {}
    offset = 0
    reported = 0
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            start = offset
            offset += len(raw)
            if progress is not None and offset - reported >= 1 << 20:
                progress(offset)
                reported = offset
            line = raw.rstrip(b"\n")
            if not line.strip(b" \t\r"):
                continue
            record = _parse(line, number, index)
            if record is None:
                continue
            digest = leaf_hash(record.canonical)
            seen = first.get(record.event_id)
            if seen is not None:
                if seen[0] != digest:
                    index.error(
                        RecordError(
                            f"event_id {record.event_id} already used at line {seen[1]} "
                            "with different content",
                            field="event_id",
                            line=number,
                        )
                    )
                continue
            first[record.event_id] = (digest, number)
            key = order_key(record)
            index.keys.append(
                OrderKey(
                    key.kind,
                    key.event_id,
                    _intern(names, key.contract_id) or key.contract_id,
                    key.occurred_at,
                    _intern(names, key.job_id),
                    key.failure_ref,
                    number,
                    None,
                )
            )
            index.offsets.append(start)
            index.leaves.append(digest)
    index.size = offset
    if progress is not None:
        progress(offset)
    return index


def _parse(line: bytes, number: int, index: FileIndex) -> Record | None:
    try:
        obj = parse_json_strict(line)
    except JsonInputError as exc:
        index.error(_line_error(exc, number))
        return None
    record, errs = validate_record(obj, line=number, now=index.now)
    for e in errs:
        index.error(e)
    return record


def read_records(index: FileIndex, positions: Sequence[int], fh: BinaryIO) -> list[Record]:
    """The records at ``positions`` of ``index``, re-read from the open file ``fh``.

    The file must not have changed since it was indexed: a line that no longer
    validates to the same bytes raises ``RuntimeError`` (and the caller's transaction
    rolls back).
    """
    out: list[Record] = []
    pos = fh.tell()
    for p in positions:
        # Causal order is mostly file order: seek only when the next line is elsewhere
        # (a seek drops the read buffer).
        if pos != index.offsets[p]:
            fh.seek(index.offsets[p])
        raw = fh.readline()
        pos = index.offsets[p] + len(raw)
        line = raw.rstrip(b"\n")
        key = index.keys[p]
        record, _ = validate_record(parse_json_strict(line), line=key.line, now=index.now)
        if record is None or leaf_hash(record.canonical) != index.leaves[p]:
            raise RuntimeError(f"{index.path} changed while it was being ingested")
        out.append(record)
    return out
