"""The journal's and the Merkle tree's row encoders write what the generic encoder writes.

``ledger.journal.encode_entries`` / ``numbered_rows`` and ``ledger.tree.node_rows`` build
whole COPY rows with a few ``struct`` calls; ``ledger.bulk.binary_copy_data`` (held equal
to psycopg's own encoding on a real PostgreSQL by ``test_bulk_db.py``) is the reference.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import merkle
from ledger.bulk import binary_copy_data
from ledger.journal import JOURNAL_TYPES, EncodedEntries, encode_entries, numbered_rows
from ledger.tree import NODE_TYPES, node_rows

_SIGNATURE_LEN = 19

_zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=-12)), timezone(timedelta(hours=5, minutes=30))]
)
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=30)
_entries = st.lists(
    st.tuples(
        st.sampled_from(["job_progress", "failure", "contract", "año"]) | _text,
        st.uuids(),
        st.booleans(),  # the id as text (a validated record) or as a UUID (system entries)
        st.sampled_from(["C-1", "C-2", "Ünï"]) | _text,
        st.none()
        | st.datetimes(
            min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=_zones
        ),
        st.binary(max_size=300),
    ),
    max_size=12,
)


def _body(data: bytes) -> bytes:
    """The rows of a COPY payload, without its signature and trailer."""
    return data[_SIGNATURE_LEN:-2]


@settings(max_examples=80, deadline=None)
@given(entries=_entries, base=st.integers(0, 2**62))
def test_journal_rows_equal_the_generic_encoder(entries, base) -> None:
    given_ = [
        (kind, str(eid) if as_text else eid, cid, when, canonical)
        for kind, eid, as_text, cid, when, canonical in entries
    ]
    encoded = encode_entries(given_)
    seqs = [base + i for i in range(len(entries))]
    ours = b"".join(numbered_rows(encoded, seqs))
    reference = binary_copy_data(
        JOURNAL_TYPES,
        [
            (seq, eid, cid, kind, cid, when, canonical, merkle.leaf_hash(canonical))
            for seq, (kind, eid, _, cid, when, canonical) in zip(seqs, entries, strict=True)
        ],
    )
    assert ours == _body(reference)
    assert encoded.leaves == [merkle.leaf_hash(e[5]) for e in entries]
    assert encoded.event_ids == [str(e[1]) for e in entries]
    assert encoded.log_ids == [e[3] for e in entries]
    assert encoded.kinds == [e[0] for e in entries]


@settings(max_examples=30, deadline=None)
@given(entries=_entries, picks=st.lists(st.integers(0, 11), max_size=12))
def test_select_keeps_every_column_of_the_entries_picked(entries, picks) -> None:
    encoded = encode_entries([(k, e, c, w, b) for k, e, _, c, w, b in entries])
    positions = [p for p in picks if p < len(entries)]
    chosen = encoded.select(positions)
    for column in ("log_ids", "kinds", "event_ids", "tails", "leaves"):
        assert getattr(chosen, column) == [getattr(encoded, column)[p] for p in positions]
    assert encoded.select(list(range(len(entries)))) is encoded


def test_a_naive_time_or_a_malformed_id_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        encode_entries([("k", uuid.uuid4(), "C", datetime(2025, 1, 1), b"{}")])
    with pytest.raises(ValueError, match="not a UUID"):
        encode_entries([("k", "abcd", "C", None, b"{}")])
    assert len(encode_entries([])) == 0 and isinstance(encode_entries([]), EncodedEntries)


@settings(max_examples=40, deadline=None)
@given(
    log_id=_text.filter(bool),
    nodes=st.lists(
        st.tuples(st.integers(0, 62), st.integers(0, 2**62), st.binary(min_size=32, max_size=32)),
        max_size=20,
    ),
)
def test_node_rows_equal_the_generic_encoder(log_id, nodes) -> None:
    ours = b"".join(node_rows(log_id, nodes))
    reference = binary_copy_data(NODE_TYPES, [(log_id, lv, ix, h) for lv, ix, h in nodes])
    assert ours == _body(reference)
