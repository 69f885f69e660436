"""Bulk writes with PostgreSQL COPY: the fast path for journal batches and projections.

``executemany`` costs a round of parameter handling per row; COPY streams rows in
one command, which is what makes ingest reach thousands of records per second.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.errors import InvariantBroken

#: COPY's binary format (PostgreSQL manual, "COPY", "Binary Format"): the signature,
#: a flags word and a header extension length, then rows, then the trailer.
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
_TRAILER = b"\xff\xff"
_NULL = b"\xff\xff\xff\xff"
#: A NULL field (a length of -1), for encoders of whole rows.
NULL_FIELD = _NULL
#: Where PostgreSQL's timestamps count from (microseconds since then, in UTC).
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH = PG_EPOCH
_length = struct.Struct(">i").pack
_int2 = struct.Struct(">ih").pack
_int4 = struct.Struct(">ii").pack
_int8 = struct.Struct(">iq").pack
_UUID_HEAD = _length(16)


def _text(value: str) -> bytes:
    data = value.encode()
    return _length(len(data)) + data


def text_field(value: str) -> bytes:
    """One ``text`` field in COPY's binary format: its UTF-8 length, then its bytes."""
    return _text(value)


def _bytea(value: bytes) -> bytes:
    return _length(len(value)) + value


def _uuid(value: uuid.UUID) -> bytes:
    return _UUID_HEAD + value.bytes


def _timestamptz(value: datetime) -> bytes:
    if value.tzinfo is None:
        raise ValueError(f"a timestamptz needs an aware datetime, got {value!r}")
    delta = value - _PG_EPOCH  # microseconds since 2000-01-01 00:00 UTC, exactly
    return _int8(8, (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)


#: The field encoders of COPY's binary format, by PostgreSQL type (the length word and
#: the value as the type's binary send function writes it).
_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "text": _text,
    "bytea": _bytea,
    "uuid": _uuid,
    "timestamptz": _timestamptz,
    "int2": lambda v: _int2(2, v),
    "int4": lambda v: _int4(4, v),
    "int8": lambda v: _int8(8, v),
}


def binary_copy_data(types: Sequence[str], rows: Iterable[Sequence[Any]]) -> bytes:
    """The rows in COPY's binary format, signature and trailer included.

    ``types`` are the columns' PostgreSQL types, one of ``text``, ``bytea``, ``uuid``
    (a :class:`uuid.UUID`), ``timestamptz`` (an aware :class:`~datetime.datetime`),
    ``int2``, ``int4``, ``int8``; ``None`` is NULL. The same bytes psycopg's
    ``Copy.write_row`` writes after ``set_types``, without its per-value dispatch (held
    equal by ``tests/ledger/test_bulk_db.py``); raises ``KeyError`` for another type.
    """
    encoders = [_ENCODERS[t] for t in types]
    head = struct.pack(">h", len(types))
    parts = [_SIGNATURE]
    append = parts.append
    for row in rows:
        append(head)
        for encode, value in zip(encoders, row, strict=True):
            append(_NULL if value is None else encode(value))
    append(_TRAILER)
    return b"".join(parts)


def copy_rows(
    session: Session,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    types: Sequence[str] | None = None,
) -> None:
    """Append ``rows`` (tuples in ``columns`` order) to ``table`` in the session's transaction.

    With ``types`` (the columns' PostgreSQL types, in order) the rows travel in COPY's
    binary format: the server then parses no text (``bytea`` as hex is twice the bytes
    and costs most of the parsing of a journal row). Types :func:`binary_copy_data`
    knows are encoded by it, in one buffer; others go through psycopg row by row.
    """
    conn = session.connection().connection.driver_connection
    if conn is None:
        raise InvariantBroken("the session's database connection is closed")
    cols = ", ".join(columns)
    binary = " (FORMAT BINARY)" if types is not None else ""
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN{binary}") as copy:
        if types is not None and all(t in _ENCODERS for t in types):
            data = binary_copy_data(types, rows)
            view = memoryview(data)
            for start in range(0, len(data), 1 << 20):
                copy.write(view[start : start + (1 << 20)])
            return
        if types is not None:
            copy.set_types(list(types))
        write = copy.write_row
        for row in rows:
            write(row)


def copy_binary(
    session: Session, table: str, columns: Sequence[str], rows: Iterable[bytes]
) -> None:
    """Append rows already encoded in COPY's binary format to ``table``.

    ``rows`` are pieces of the data between the signature and the trailer (whole rows,
    or parts of rows in order: they are concatenated), as :func:`binary_copy_data` lays
    them out; sent in pieces of about a megabyte.
    """
    conn = session.connection().connection.driver_connection
    if conn is None:
        raise InvariantBroken("the session's database connection is closed")
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    with conn.cursor() as cur, cur.copy(statement) as copy:
        pending = [_SIGNATURE]
        size = len(_SIGNATURE)
        for piece in rows:
            pending.append(piece)
            size += len(piece)
            if size >= 1 << 20:
                copy.write(b"".join(pending))
                pending = []
                size = 0
        pending.append(_TRAILER)
        copy.write(b"".join(pending))


def copy_dicts(session: Session, table: str, rows: Sequence[dict[str, Any]]) -> None:
    """Append ``rows`` (dicts sharing the same keys) to ``table`` with COPY."""
    if not rows:
        return
    columns = list(rows[0])
    copy_rows(session, table, columns, ([r[c] for c in columns] for r in rows))


#: Planner settings under which a lookup by a list of ids runs (:func:`index_probes`):
#: with sequential scans, hash joins and merge joins priced out, the one plan left is a
#: nested loop of unique-index probes, one per id, whatever the table's statistics say.
INDEX_PROBE_SETTINGS = (
    ("enable_seqscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
)


@contextmanager
def index_probes(cursor: Any) -> Iterator[None]:
    """Run the statements of the block with :data:`INDEX_PROBE_SETTINGS`, then restore.

    For lookups of many ids joined against ``unnest(%s::uuid[])``: the planner's choice
    otherwise follows the statistics, and once they say the id list is a sizeable part of
    the table it flips to a sequential scan (docs/benchmarks.md, "Figures behind the code":
    a scan of minutes). ``cursor`` is a psycopg cursor inside the caller's transaction; the
    settings are transaction-local (``set_config(..., true)``) and put back as they were
    when the block ends; if it raises, the caller's transaction is rolled back, which
    drops them too.
    """
    names = [name for name, _ in INDEX_PROBE_SETTINGS]
    cursor.execute("SELECT " + ", ".join(f"current_setting('{n}')" for n in names))
    before = cursor.fetchone()
    cursor.execute(
        "SELECT " + ", ".join(f"set_config('{n}', '{v}', true)" for n, v in INDEX_PROBE_SETTINGS)
    )
    yield
    cursor.execute(
        "SELECT " + ", ".join(f"set_config('{n}', %s, true)" for n in names), tuple(before)
    )


#: Ids a :func:`probe` sends in one statement: bounds its parameter (~37 bytes an id).
PROBE_CHUNK = 50000


def uuid_array(ids: Iterable[str | uuid.UUID]) -> str:
    """The ``uuid[]`` literal of ``ids`` (one parameter, parsed once by the server).

    An ``IN`` list of 10,000 bound parameters, or a list the driver adapts item by item,
    costs more to build and parse than the index probes themselves.
    """
    return "{" + ",".join(map(str, ids)) + "}"


def probe(
    session: Session, sql: str, ids: Sequence[str | uuid.UUID], chunk: int = PROBE_CHUNK
) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` for ``ids``, ``chunk`` ids a statement, under :func:`index_probes`.

    ``sql`` takes the ids as its one parameter, a ``uuid[]`` (``unnest(%s::uuid[])``
    joined on a unique index): one index probe an id, whatever the statistics. Rows come
    from a binary cursor (``uuid`` as :class:`uuid.UUID`, ``bytea`` as ``bytes``).
    """
    if not ids:
        return []
    conn = session.connection().connection.driver_connection
    if conn is None:
        raise RuntimeError("the session's connection is closed")
    rows: list[tuple[Any, ...]] = []
    with conn.cursor(binary=True) as cur, index_probes(cur):
        for start in range(0, len(ids), chunk):
            cur.execute(sql, (uuid_array(ids[start : start + chunk]),))
            rows.extend(cur.fetchall())
    return rows
