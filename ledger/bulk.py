"""Bulk writes with PostgreSQL COPY: the fast path for journal batches and projections.

``executemany`` costs a round of parameter handling per row; COPY streams rows in
one command, which is what makes ingest reach thousands of records per second.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.orm import Session


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
    and costs most of the parsing of a journal row).
    """
    conn = session.connection().connection.driver_connection
    assert conn is not None
    cols = ", ".join(columns)
    binary = " (FORMAT BINARY)" if types is not None else ""
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN{binary}") as copy:
        if types is not None:
            copy.set_types(list(types))
        write = copy.write_row
        for row in rows:
            write(row)


def copy_dicts(session: Session, table: str, rows: Sequence[dict[str, Any]]) -> None:
    """Append ``rows`` (dicts sharing the same keys) to ``table`` with COPY."""
    if not rows:
        return
    columns = list(rows[0])
    copy_rows(session, table, columns, ([r[c] for c in columns] for r in rows))
