"""Large JSONL files in bounded memory: a compact index first, records re-read in chunks.

`yoco ledger ingest` used to hold the whole file, every parsed object and every
canonical encoding at once (memory many times the file's size: docs/benchmarks.md,
"Figures behind the code"). Here a first streaming pass
validates every line and keeps only a compact index entry per record (what
:func:`ledger.records.causal_order` needs, the line's offset and the leaf hash of the
canonical bytes); :func:`read_records` then re-reads the lines of one chunk at a time,
in the order they are appended (see :func:`ledger.ingest.ingest_file`).

With a spool (``index_file(..., spool=fh)``, what ``yoco ledger ingest`` does) the first
pass also writes each record's journal row, in COPY's binary format but for its sequence
number, and the parsed body of the records the projectors read, to that temporary file;
the second pass then reads those bytes back (:func:`read_spooled`) instead of parsing and
validating every line a second time (the second validation was a third of the CLI's
time: docs/benchmarks.md, "Figures behind the code"). What is appended is then exactly
what was validated, even if the file changes meanwhile.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import tempfile
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from ledger import journal
from ledger.canonical import JsonInputError, parse_json_strict
from ledger.errors import InvariantBroken
from ledger.merkle import leaf_hash
from ledger.records import OrderKey, Record, RecordError, order_key
from yoco_records.schema import _line_error, validate_record

__all__ = [
    "FileIndex",
    "Spooled",
    "collector_paused",
    "index_file",
    "read_records",
    "read_spooled",
]

#: At most this many errors are kept (the rest are counted): a wholly wrong file must
#: not cost more memory than a right one.
MAX_ERRORS = 1000
#: Records encoded together before their rows go to the spool (bounds the buffer).
SPOOL_BATCH = 2000


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
    #: With a spool: where each record's bytes start in it, the length of its journal row
    #: and of its pickled body (0: a kind no projector reads, no body kept).
    spool: BinaryIO | None = None
    spool_at: array[int] = field(default_factory=lambda: array("q"))
    row_len: array[int] = field(default_factory=lambda: array("I"))
    body_len: array[int] = field(default_factory=lambda: array("I"))
    #: ``keys`` as plain tuples while the index crosses a worker's pipe (see
    #: :func:`index_range`); None everywhere else.
    plain_keys: list[tuple[Any, ...]] | None = None

    def error(self, e: RecordError) -> None:
        """Keep ``e`` (up to :data:`MAX_ERRORS`) and count it."""
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(e)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector off; put it back as it was.

    A file's index is millions of small acyclic objects (keys, leaf hashes, offsets)
    built at once, and each pass of the collector walked every one of them, finding
    nothing to free. Objects are still freed by reference counting meanwhile; any
    reference cycle made in the block is collected once the collector is back on.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _intern(table: dict[str, str], value: str | None) -> str | None:
    # Contract and job ids repeat on every line: keep one string object each.
    if value is None:
        return None
    return table.setdefault(value, value)


#: Files smaller than this are validated in this process: a worker's start costs more.
PARALLEL_MIN_BYTES = 16 << 20
#: Ranges a parallel validation cuts a file into, per worker (progress comes per range).
RANGES_PER_WORKER = 4


def default_workers() -> int:
    """Worker processes a large file's validation uses: one a core, at most 4."""
    return max(1, min(os.cpu_count() or 1, 4))


def index_file(
    path: Path,
    *,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
    spool: BinaryIO | None = None,
    projected_kinds: Collection[str] | None = None,
    workers: int = 0,
    make_worker: Callable[[], Any] | None = None,
) -> FileIndex:
    """Validate every line of the JSONL file ``path``, keeping a compact index.

    Promises: the same rules and errors as :func:`ledger.records.parse_jsonl` (lines
    numbered from 1, blank lines skipped, every bad line reported, an event id repeated
    with identical content collapsed to its first line and with different content
    refused at the later line), in memory proportional to the number of records, not
    to the file. ``progress`` is called with the bytes read so far, now and then.

    With ``spool`` (an empty binary file open for writing and reading), every record's
    journal row and, for the kinds in ``projected_kinds`` (None: every kind), its body
    are written there for :func:`read_spooled`. With ``workers`` > 0 and a spool, a file
    of at least :data:`PARALLEL_MIN_BYTES` is cut into ranges of whole lines validated by
    that many worker processes at once, each made by ``make_worker`` (a
    :class:`ledger.workers.PrepareWorker`: given by the caller, as :mod:`ledger.workers`
    runs this module's :func:`index_range` in its children); the index, the errors and
    their order are the same as in one process.
    """
    when = now or datetime.now(UTC)
    kinds = None if projected_kinds is None else frozenset(projected_kinds)
    size = path.stat().st_size
    if workers > 0 and make_worker is None:
        raise ValueError("index_file: workers > 0 needs make_worker (ledger.workers.PrepareWorker)")
    if spool is None or workers <= 0 or make_worker is None or size < PARALLEL_MIN_BYTES:
        with path.open("rb") as fh:
            part = _scan(path, fh, 0, size, 1, when, spool, kinds, progress)
        index = _merge(path, when, [(part, None)], spool)
    else:
        index = _index_parallel(path, when, size, spool, kinds, workers, make_worker, progress)
    index.size = size
    if progress is not None:
        progress(size)
    return index


def index_range(
    path: str,
    start: int,
    end: int,
    first_line: int,
    now: datetime,
    spool_path: str,
    projected_kinds: frozenset[str] | None,
) -> FileIndex:
    """Validate the lines of ``path`` that start in ``[start, end)`` (a worker's share).

    ``first_line`` is the number of the line at ``start``. Every valid line is kept, even
    a repeated event id (the caller's merge decides, in file order); rows and bodies go to
    a new file at ``spool_path``. The returned index holds no open file, and its keys as
    ``plain_keys`` (plain tuples, cheap to send back; the parent makes them OrderKeys).
    """
    with collector_paused(), open(path, "rb") as fh, open(spool_path, "wb+") as spool:
        part = _scan(Path(path), fh, start, end, first_line, now, spool, projected_kinds, None)
    part.spool = None
    # A named tuple is pickled and unpickled through Python code, one call a key; a plain
    # tuple is not: the keys travel plain and become OrderKeys again in the parent.
    part.plain_keys = list(map(tuple, part.keys))
    part.keys = []
    return part


#: Builds an :class:`OrderKey` from a plain tuple of its fields without Python code a key.
_order_key_of = partial(tuple.__new__, OrderKey)


def _restore_keys(part: FileIndex) -> FileIndex:
    """``part`` with the keys :func:`index_range` sent as plain tuples made OrderKeys again."""
    if part.plain_keys is not None:
        part.keys = list(map(_order_key_of, part.plain_keys))
        part.plain_keys = None
    return part


def _scan(
    path: Path,
    fh: BinaryIO,
    start: int,
    end: int,
    first_line: int,
    now: datetime,
    spool: BinaryIO | None,
    kinds: frozenset[str] | None,
    progress: Callable[[int], None] | None,
) -> FileIndex:
    """Every valid line starting in ``[start, end)``, repeats included, in file order."""
    index = FileIndex(path=path, now=now, spool=spool)
    pending: list[Record] = []
    names: dict[str, str] = {}
    offset = start
    reported = start
    fh.seek(start)
    for number, raw in enumerate(fh, start=first_line):
        if offset >= end:
            break
        line_start = offset
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
        index.offsets.append(line_start)
        if spool is None:
            index.leaves.append(leaf_hash(record.canonical))
        else:
            # Its leaf hash comes with its encoded row (_spool): one hash a record.
            pending.append(record)
            if len(pending) >= SPOOL_BATCH:
                _spool(index, pending, kinds)
                pending = []
    if spool is not None:
        _spool(index, pending, kinds)
        spool.flush()
    return index


def _merge(
    path: Path,
    now: datetime,
    parts: Sequence[tuple[FileIndex, BinaryIO | None]],
    spool: BinaryIO | None,
) -> FileIndex:
    """One index of ``parts`` (in file order): repeats collapsed or refused, errors by line.

    A part's spool, when it is not ``spool`` itself, is appended to ``spool`` and its
    records' positions moved by as much.
    """
    index = FileIndex(path=path, now=now, spool=spool)
    first: dict[str, tuple[bytes, int]] = {}
    repeated: list[RecordError] = []
    errors: list[RecordError] = []
    count = 0
    for part, part_spool in parts:
        base = 0
        if part_spool is not None and spool is not None:
            spool.seek(0, os.SEEK_END)
            base = spool.tell()
            part_spool.seek(0)
            shutil.copyfileobj(part_spool, spool, 1 << 20)
        errors.extend(part.errors)
        count += part.error_count
        keys, leaves = part.keys, part.leaves
        for i, key in enumerate(keys):
            digest = leaves[i]
            seen = first.get(key.event_id)
            if seen is not None:
                if seen[0] != digest:
                    repeated.append(
                        RecordError(
                            f"event_id {key.event_id} already used at line {seen[1]} "
                            "with different content",
                            field="event_id",
                            line=key.line,
                        )
                    )
                continue
            first[key.event_id] = (digest, key.line or 0)
            index.keys.append(key)
            index.offsets.append(part.offsets[i])
            index.leaves.append(digest)
            if part.spool_at:
                index.spool_at.append(part.spool_at[i] + base)
                index.row_len.append(part.row_len[i])
                index.body_len.append(part.body_len[i])
    if spool is not None:
        spool.flush()
    if repeated:
        # Stable: the errors of one line keep their order.
        errors = sorted(errors + repeated, key=lambda e: e.line or 0)
    index.errors = errors[:MAX_ERRORS]
    index.error_count = count + len(repeated)
    return index


def _ranges(path: Path, size: int, count: int) -> list[tuple[int, int, int]]:
    """``count`` ranges of whole lines of ``path``: ``(start, end, number of the first line)``."""
    cuts = [0]
    with path.open("rb") as fh:
        for k in range(1, count):
            fh.seek(size * k // count)
            fh.readline()
            at = fh.tell()
            if cuts[-1] < at < size:
                cuts.append(at)
        cuts.append(size)
        # Line numbers: the newlines before each cut.
        numbers = [1]
        fh.seek(0)
        seen = 0
        at = 0
        for cut in cuts[1:-1]:
            while at < cut:
                block = fh.read(min(1 << 20, cut - at))
                seen += block.count(b"\n")
                at += len(block)
            numbers.append(seen + 1)
    return [(cuts[i], cuts[i + 1], numbers[i]) for i in range(len(cuts) - 1)]


def _index_parallel(
    path: Path,
    now: datetime,
    size: int,
    spool: BinaryIO,
    kinds: frozenset[str] | None,
    workers: int,
    make_worker: Callable[[], Any],
    progress: Callable[[int], None] | None,
) -> FileIndex:
    ranges = _ranges(path, size, workers * RANGES_PER_WORKER)
    pool = [make_worker() for _ in range(min(workers, len(ranges)))]
    parts: list[tuple[FileIndex, BinaryIO | None]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="yoco-ingest-") as tmp:
            names = [str(Path(tmp) / f"part-{i}") for i in range(len(ranges))]
            sent = 0

            def submit() -> None:
                nonlocal sent
                if sent < len(ranges):
                    start, end, line = ranges[sent]
                    pool[sent % len(pool)].submit_index(
                        str(path), start, end, line, now, names[sent], kinds
                    )
                    sent += 1

            for _ in range(2 * len(pool)):
                submit()
            done_bytes = 0
            for i, (start, end, _) in enumerate(ranges):
                part = _restore_keys(pool[i % len(pool)].result())
                submit()
                parts.append((part, open(names[i], "rb")))  # noqa: SIM115 (closed below)
                done_bytes += end - start
                if progress is not None:
                    progress(done_bytes)
            try:
                return _merge(path, now, parts, spool)
            finally:
                for _, fh in parts:
                    if fh is not None:
                        fh.close()
    finally:
        for worker in pool:
            worker.close()


def _spool(index: FileIndex, records: list[Record], kinds: frozenset[str] | None) -> None:
    spool = index.spool
    if spool is None:
        raise InvariantBroken("a spooled index has no spool file")
    encoded = journal.encode_entries(
        (r.kind, r.event_id, r.contract_id, r.occurred_at, r.canonical) for r in records
    )
    index.leaves.extend(encoded.leaves)
    at = spool.tell()
    pieces: list[bytes] = []
    dumps = pickle.dumps
    for r, row in zip(records, encoded.tails, strict=True):
        index.spool_at.append(at)
        index.row_len.append(len(row))
        pieces.append(row)
        at += len(row)
        if kinds is None or r.kind in kinds:
            body = dumps(r.body, pickle.HIGHEST_PROTOCOL)
            index.body_len.append(len(body))
            pieces.append(body)
            at += len(body)
        else:
            index.body_len.append(0)
    spool.write(b"".join(pieces))


@dataclass(slots=True)
class Spooled:
    """Records read back from the spool: journal rows and the bodies kept."""

    entries: journal.EncodedEntries
    #: ``(record's position in the chunk, occurred_at, body)`` of the records with a body.
    projected: list[tuple[int, datetime | None, dict[str, Any]]]


def read_spooled(index: FileIndex, positions: Sequence[int]) -> Spooled:
    """The spooled rows (and kept bodies) of the records at ``positions``, in that order.

    Runs of consecutive positions (causal order is mostly file order) are read with one
    read each.
    """
    spool = index.spool
    if spool is None:
        raise ValueError("the file was indexed without a spool")
    keys = index.keys
    spool_at, row_len, body_len = index.spool_at, index.row_len, index.body_len
    leaves = index.leaves
    log_ids: list[str] = []
    kinds: list[str] = []
    event_ids: list[str] = []
    tails: list[bytes] = []
    chosen: list[bytes] = []
    projected: list[tuple[int, datetime | None, dict[str, Any]]] = []
    loads = pickle.loads
    n = len(positions)
    j = 0
    while j < n:
        # The run positions[j:k] is consecutive in the spool.
        k = j + 1
        while k < n and positions[k] == positions[k - 1] + 1:
            k += 1
        first = positions[j]
        last = positions[k - 1]
        spool.seek(spool_at[first])
        block = spool.read(spool_at[last] + row_len[last] + body_len[last] - spool_at[first])
        base = spool_at[first]
        for at in range(j, k):
            p = positions[at]
            start = spool_at[p] - base
            end = start + row_len[p]
            tails.append(block[start:end])
            if body_len[p]:
                key = keys[p]
                projected.append((at, key.occurred_at, loads(block[end : end + body_len[p]])))
        j = k
    for p in positions:
        key = keys[p]
        log_ids.append(key.contract_id)
        kinds.append(key.kind)
        event_ids.append(key.event_id)
        chosen.append(leaves[p])
    return Spooled(journal.EncodedEntries(log_ids, kinds, event_ids, tails, chosen), projected)


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
