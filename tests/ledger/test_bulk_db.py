"""ledger.bulk's own COPY binary encoder against psycopg's, on a real PostgreSQL.

The journal and the Merkle nodes are written with :func:`ledger.bulk.binary_copy_data`
instead of psycopg's ``write_row``; the server must read exactly the values psycopg
would have sent, for every type the encoder knows, NULLs and edge values included.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.bulk import binary_copy_data, copy_rows

TYPES = ("text", "int8", "uuid", "int2", "int4", "timestamptz", "bytea")
COLUMNS = ("t", "i8", "u", "i2", "i4", "ts", "b")
DDL = "(t text, i8 int8, u uuid, i2 int2, i4 int4, ts timestamptz, b bytea, n serial)"

_zones = st.sampled_from(
    [
        UTC,
        timezone(timedelta(hours=-12)),
        timezone(timedelta(hours=5, minutes=30)),
        timezone(timedelta(hours=14)),
    ]
)
_times = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2200, 12, 31), timezones=_zones
)
_rows = st.lists(
    st.tuples(
        st.none() | st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0")),
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.uuids(),
        st.none() | st.integers(-(2**15), 2**15 - 1),
        st.none() | st.integers(-(2**31), 2**31 - 1),
        st.none() | _times,
        st.none() | st.binary(max_size=64),
    ),
    max_size=20,
)


def _psycopg_copy(session: Session, table: str, rows: list[tuple[object, ...]]) -> None:
    conn = session.connection().connection.driver_connection
    with (
        conn.cursor() as cur,
        cur.copy(f"COPY {table} ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(list(TYPES))
        for row in rows:
            copy.write_row(row)


def _read(session: Session, table: str) -> list[tuple[object, ...]]:
    return [
        tuple(r)
        for r in session.execute(text(f"SELECT {', '.join(COLUMNS)} FROM {table} ORDER BY n"))
    ]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_rows)
def test_the_encoder_writes_what_psycopg_writes(engine, rows) -> None:
    with Session(engine) as s:
        s.execute(text(f"CREATE TEMP TABLE ours {DDL} ON COMMIT DROP"))
        s.execute(text(f"CREATE TEMP TABLE theirs {DDL} ON COMMIT DROP"))
        copy_rows(s, "ours", COLUMNS, rows, TYPES)
        _psycopg_copy(s, "theirs", rows)
        ours, theirs = _read(s, "ours"), _read(s, "theirs")
        s.rollback()
    assert ours == theirs
    assert len(ours) == len(rows)
    for row, back in zip(rows, ours, strict=True):
        assert back == row  # aware datetimes compare as instants


def test_the_encoder_refuses_a_naive_timestamp_and_an_unknown_type() -> None:
    with pytest.raises(ValueError, match="aware"):
        binary_copy_data(("timestamptz",), [(datetime(2025, 1, 1),)])
    with pytest.raises(KeyError):
        binary_copy_data(("numeric",), [(1,)])
    assert binary_copy_data(("uuid",), []).startswith(b"PGCOPY\n\xff\r\n\x00")
    assert binary_copy_data(("uuid",), [(uuid.UUID(int=1),)]).endswith(
        b"\x00\x00\x00\x10" + uuid.UUID(int=1).bytes + b"\xff\xff"
    )
