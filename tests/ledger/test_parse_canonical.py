"""parse_canonical: the fast checks (a learned shape's regular expression; the standard
library's C parser and encoder) and the full rule (``data ==
canonical_bytes(json.loads(data))``) give the same verdict, the same value and the same
reason on every input, and the fast checks decide ledger entries."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yoco_records import canonical as c
from yoco_records.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalizationError,
    JsonInputError,
    NotCanonicalError,
    canonical_bytes,
    parse_canonical,
)


def outcome(data: bytes, *, fast: bool) -> tuple[str, ...]:
    """The verdict of one path: the value (its canonical bytes and repr, so 1 and 1.0
    differ) or the error's type and words."""
    try:
        value = parse_canonical(data, fast=fast)
    except (JsonInputError, CanonicalizationError, NotCanonicalError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", canonical_bytes(value).decode("utf-8"), repr(value)


def decided(value: Any, data: bytes) -> bool:
    """Whether a fast check decided; if so, its value must be json.loads's value of
    canonical bytes (never a wrong "canonical")."""
    if value is c._UNDECIDED:
        return False
    assert repr(value) == repr(json.loads(data)) and canonical_bytes(value) == data, data
    return True


def agree(data: bytes) -> tuple[str, ...]:
    """Both paths' verdict, held equal, and each fast check's on its own."""
    shapes = list(c._STATE.tried)  # what the shape check tries, before this parse
    fast, full = outcome(data, fast=True), outcome(data, fast=False)
    assert fast == full, data
    if data.isascii():
        text = data.decode("ascii")
        for shape in shapes:
            if decided(shape.parse(text), data):
                assert full[0] == "ok", data
        if decided(c._fast_parse(text), data):
            assert full[0] == "ok", data
    return full


OK = "ok"
NOT = "NotCanonicalError"
INPUT = "JsonInputError"

EDGE_CASES: list[tuple[bytes, str]] = [
    # Plain canonical entries, objects, arrays, literals.
    (b'{"a":1,"b":"x"}', OK),
    (b"{}", OK),
    (b"[]", OK),
    (b"null", OK),
    (b"true", OK),
    (b'"x"', OK),
    (b'{"a":[1,{"a":true,"b":null}],"b":false}', OK),
    # Key order (also nested), whitespace anywhere.
    (b'{"b":1,"a":2}', NOT),
    (b'{"a":[1,{"b":null,"a":true}]}', NOT),
    (b'{"a": 1}', NOT),
    (b' {"a":1}', NOT),
    (b'{"a":1}\n', NOT),
    (b'{"a":1 }', NOT),
    (b'{"a":[1, 2]}', NOT),
    # A key twice: the fast re-encoding is shorter; the full rule names the key.
    (b'{"a":1,"a":1}', INPUT),
    (b'{"a":1,"a":2}', INPUT),
    (b'{"a":{"k":1,"k":1}}', INPUT),
    (b'{"a":1,"b":2,"a":1}', INPUT),
    # Integers: the range of JSON, -0, leading zeros.
    (b'{"a":0}', OK),
    (b'{"a":-1}', OK),
    (b'{"a":123456789012345}', OK),
    (b'{"a":9007199254740991}', OK),
    (b'{"a":-9007199254740991}', OK),
    (b'{"a":9007199254740992}', INPUT),
    (b'{"a":-9007199254740992}', INPUT),
    (b'{"a":123456789012345678901234567890}', INPUT),
    (b'{"a":' + b"9" * 5000 + b"}", INPUT),
    (b'{"a":-0}', NOT),
    (b'{"a":01}', INPUT),
    # Floats: RFC 8785's layout against Python's repr.
    (b'{"a":1.5}', OK),
    (b'{"a":-0.5}', OK),
    (b'{"a":0.1}', OK),
    (b'{"a":333333333.3333333}', OK),
    (b'{"a":333333333.33333329}', NOT),
    (b'{"a":0.10000000000000001}', NOT),
    (b'{"a":1.50}', NOT),
    (b'{"a":1.0}', NOT),
    (b'{"a":100.0}', NOT),
    (b'{"a":-0.0}', NOT),
    (b'{"a":0.0}', NOT),
    (b'{"a":1e2}', NOT),
    (b'{"a":1E2}', NOT),
    (b'{"a":1e21}', NOT),
    (b'{"a":1E+21}', NOT),
    (b'{"a":1e+21}', OK),
    (b'{"a":-1e+21}', OK),
    (b'{"a":1.5e+300}', OK),
    (b'{"a":1.7976931348623157e+308}', OK),
    (b'{"a":1e+400}', INPUT),
    (b'{"a":1e-7}', OK),
    (b'{"a":1e-07}', NOT),
    (b'{"a":0.000001}', OK),
    (b'{"a":0.0000001}', NOT),
    (b'{"a":5e-324}', OK),
    (b'{"a":1e-400}', NOT),
    (b'{"a":1e+16}', INPUT),
    (b'{"a":10000000000000000}', INPUT),
    (b'{"a":9007199254740992.0}', INPUT),
    (b'{"a":999999999999999.9}', OK),
    (b'{"a":1234567890123456.7}', NOT),
    (b'{"a":NaN}', INPUT),
    (b'{"a":Infinity}', INPUT),
    (b'{"a":-Infinity}', INPUT),
    # Escapes: the canonical form uses JSON's minimal ones, lower-case hex.
    (b'{"a":"\\n\\t\\r\\b\\f\\"\\\\"}', OK),
    (b'{"a":"\\u0001\\u001f"}', OK),
    (b'{"a":"\\u001F"}', NOT),
    (b'{"a":"\\u000a"}', NOT),
    (b'{"a":"\\/"}', NOT),
    (b'{"a":"\\u0041"}', NOT),
    (b'{"a":"\x7f"}', OK),
    (b'{"a":"\x01"}', INPUT),
    (b'{"\\u0061":1}', NOT),
    (b'{"a\\n":1}', OK),
    # Non-ASCII: raw UTF-8 is canonical, its \u escape is not; a lone surrogate has no
    # canonical form; keys sort by UTF-16 code unit (U+1F600 before U+FB33).
    ('{"a":"é"}'.encode(), OK),
    (b'{"a":"\\u00e9"}', NOT),
    (b'{"a":"\\u00E9"}', NOT),
    ('{"é":1}'.encode(), OK),
    (b'{"\\u00e9":1}', NOT),
    ('{"a":"😀"}'.encode(), OK),
    (b'{"a":"\\ud83d\\ude00"}', NOT),
    (b'{"a":"\\ud800"}', INPUT),
    (b'{"\\udfff":1}', INPUT),
    ('{"\U0001f600":2,"\ufb33":1}'.encode(), OK),
    ('{"\ufb33":1,"\U0001f600":2}'.encode(), NOT),
    ('{"a":"\u2028"}'.encode(), OK),
    # Not JSON, not UTF-8, other encodings of the same text.
    (b"", INPUT),
    (b"{", INPUT),
    (b'{"a":1}x', INPUT),
    (b'{"a":1}{}', INPUT),
    (b"\xef\xbb\xbf{}", INPUT),
    ('{"a":1}'.encode("utf-16"), INPUT),
    ('{"a":1}'.encode("utf-16-le"), INPUT),
    (b'{"a":"\xff"}', INPUT),
    (b'{"a":"\xc3"}', INPUT),
    (b"[" * 100_000 + b"]" * 100_000, INPUT),
]


@pytest.mark.parametrize(("data", "verdict"), EDGE_CASES)
def test_fast_check_and_full_rule_agree_on_edge_cases(data: bytes, verdict: str) -> None:
    assert agree(data)[0] == verdict


def test_the_reasons_are_the_full_rules() -> None:
    assert outcome(b'{"a":1,"a":1}', fast=True) == (INPUT, "$.a: duplicate key 'a'")
    assert outcome(b'{"a":9007199254740992}', fast=True) == (
        INPUT, "$.a: integer 9007199254740992 is outside ±(2^53−1), the exact range of JSON")
    assert outcome(b'{"b":1,"a":2}', fast=True) == (
        NOT, "its bytes are not its RFC 8785 canonical form")


def test_ledger_entries_are_decided_by_the_fast_check() -> None:
    """The entries a year's log is made of (progress, failures, outcomes: floats without
    an exponent included) never need the full rule."""
    entries = [
        {"kind": "job_progress", "contract_id": "C-1", "event_id": "e-1", "job_id": "j-7",
         "occurred_at": "2025-03-01T10:00:00+00:00", "step": 1234, "step_seconds": 2.5},
        {"kind": "outcome", "contract_id": "C-1", "event_id": "e-2", "failure_event_id": "f",
         "outcome": "rolled_back", "lost_steps": 12, "recovery_seconds": 431.207,
         "step_seconds": 2, "gpus_affected": 2048, "occurred_at": "2025-03-01T10:07:11+00:00"},
        {"kind": "exclusion", "contract_id": "C-1", "event_id": "e-3", "failure_event_id": "f",
         "reason": 'root cause "outside" the vendor\'s control\n(review)', "approved_by": "a"},
    ]
    for e in entries:
        data = canonical_bytes(e)
        assert c._fast_parse(data.decode()) == e
        assert parse_canonical(data) == e
        # Learned: the next entry of a flat shape of plain strings is read by its
        # expression alone (an escape in a string leaves it to the C check).
        again = canonical_bytes({**e, "event_id": "e-9", "contract_id": "C-2"})
        plain = "\\" not in again.decode()
        assert c._shape_parse(again.decode()) == (json.loads(again) if plain else c._UNDECIDED)


def learned(value: dict[str, Any]) -> c._Shape:
    """The shape parse_canonical learns from ``value``'s canonical bytes."""
    assert parse_canonical(canonical_bytes(value)) == value
    shape = c._STATE.tried[0]
    assert shape.keys == tuple(value)
    return shape


SHAPE = {"a": 1.5, "b": "x", "c": 1, "d": True, "e": None, "f": "y"}

SHAPE_CASES: list[tuple[bytes, str]] = [
    (b'{"a":1.5,"b":"x","c":1,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":-2.25,"b":"","c":-7,"d":false,"e":null,"f":" ~!#[]"}', OK),
    (b'{"a":0.000001,"b":"x","c":0,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":123456789.123456,"b":"x","c":123456789012345,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":0.0000001,"b":"x","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1.50,"b":"x","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1.0,"b":"x","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":-0.0,"b":"x","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":0.10000000000000001,"b":"x","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1234567890.5,"b":"x","c":1,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":1.5e+300,"b":"x","c":1,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":1.5,"b":"x","c":-0,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1.5,"b":"x","c":01,"d":true,"e":null,"f":"y"}', INPUT),
    (b'{"a":1.5,"b":"x","c":9007199254740991,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":1.5,"b":"x","c":9007199254740992,"d":true,"e":null,"f":"y"}', INPUT),
    (b'{"a":1.5,"b":"x\\"","c":1,"d":true,"e":null,"f":"y"}', OK),
    (b'{"a":1.5,"b":"x\\/","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1.5,"b":"\\u0078","c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1.5,"b":"x","c":1,"d":true,"e":null,"f":"y","f":"y"}', INPUT),
    (b'{"a":1.5,"a":1.5,"b":"x","c":1,"d":true,"e":null,"f":"y"}', INPUT),
    (b'{"b":"x","a":1.5,"c":1,"d":true,"e":null,"f":"y"}', NOT),
    (b'{"a":1.5,"b":"x","c":1,"d":true,"e":null,"f":"y" }', NOT),
    (b'{"a":1.5,"b":"x","c":1,"d":true,"e":null}', OK),
    (b'{"a":1.5,"b":1,"c":1,"d":true,"e":null,"f":"y"}', OK),
    ('{"a":1.5,"b":"é","c":1,"d":true,"e":null,"f":"y"}'.encode(), OK),
    (b'{"a":1.5,"b":"x","c":1,"d":tru,"e":null,"f":"y"}', INPUT),
]


@pytest.mark.parametrize(("data", "verdict"), SHAPE_CASES)
def test_a_learned_shape_and_the_full_rule_agree(data: bytes, verdict: str) -> None:
    learned(SHAPE)
    assert agree(data)[0] == verdict


def test_a_shape_reads_what_json_reads() -> None:
    shape = learned(SHAPE)
    data = b'{"a":-0.5,"b":"q","c":42,"d":false,"e":null,"f":"z"}'
    value = shape.parse(data.decode())
    assert value == json.loads(data) and list(value) == list(SHAPE)
    assert repr(value) == repr(json.loads(data))
    # Not flat, or a string the expression does not admit: no shape is learned.
    for other in ({"a": {"b": 1}}, {"a": [1]}, {"a": "é"}, {"a": 'q"'}, {}):
        before = list(c._STATE.tried)
        assert parse_canonical(canonical_bytes(other)) == other
        assert c._STATE.tried == before


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.text(st.characters(max_codepoint=0x7F), max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4), children, max_size=4)
        | st.dictionaries(st.text(st.characters(max_codepoint=0x7F), max_size=3), children,
                          max_size=4)
    ),
    max_leaves=16,
)


def spellings(value: Any) -> list[bytes]:
    """The value in its canonical form (when it has one) and in other spellings."""
    out = []
    with contextlib.suppress(CanonicalizationError):
        out.append(canonical_bytes(value))
    out.append(json.dumps(value).encode())
    out.append(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())
    out.append(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                                  "surrogatepass"))
    out.append(json.dumps(value, separators=(",", ":"), sort_keys=True,
                          ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return out


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_fast_check_and_full_rule_agree_on_any_value(value: Any) -> None:
    for data in spellings(value):
        agree(data)


flat_values = st.dictionaries(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7F), max_size=3),
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**54), max_value=2**54)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.decimals(places=6, min_value=-(10**10), max_value=10**10, allow_nan=False).map(float)
    | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7F), max_size=5),
    min_size=1,
    max_size=5,
)


@settings(max_examples=1000, deadline=None)
@given(json_values | flat_values, st.data())
def test_fast_check_and_full_rule_agree_on_altered_bytes(value: Any, data: Any) -> None:
    """Canonical bytes with one byte changed, inserted or removed (a tampered entry),
    right after their own shape was learned."""
    try:
        raw = canonical_bytes(value)
    except CanonicalizationError:
        return
    agree(raw)
    i = data.draw(st.integers(min_value=0, max_value=len(raw)))
    b = data.draw(st.sampled_from(b' "\\,:{}[]0123456789.eE+-aeunlltr\x00\x7f\xc3\xa9'))
    for altered in (raw[:i] + bytes([b]) + raw[i + 1 :], raw[:i] + bytes([b]) + raw[i:],
                    raw[:i] + raw[i + 1 :]):
        agree(altered)


def one_by_one(entries: list[bytes], fields: tuple[str, ...]) -> list[tuple[Any, ...]] | None:
    out = []
    for e in entries:
        try:
            value = parse_canonical(e, fast=False)
        except ValueError:
            return None
        out.append(tuple(value.get(f, c.ABSENT) for f in fields) if type(value) is dict
                   else (c.ABSENT,) * len(fields))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([
    b'{"a":1.5,"b":"x","c":1}', b'{"a":2.25,"b":"y","c":-3}', b'{"a":7,"b":"x","c":1}',
    b'{"a":1.5,"b":"x","c":1,"d":null}', b'{"a":true,"b":"z"}', b'[1]', b'"s"', b"{}",
    '{"a":1.5,"b":"\u00e9","c":1}'.encode(), b'{"a":1.5,"b":"x\\n","c":1}',
    b'{"a":1.50,"b":"x","c":1}', b'{"a":1.5,"b":"x","c":1}\n', b'{"a":1.5,\n"b":"x","c":1}',
    b'{"a":1.5,"b":"x","c":1,"c":1}', b'{"b":"x","a":1.5}', b"", b'{"a":1e+21,"b":"x","c":1}',
]), max_size=40), st.integers(min_value=1, max_value=9))
def test_canonical_fields_read_as_parse_canonical_one_by_one(entries: list[bytes],
                                                             chunk: int) -> None:
    """Many entries at once, in chunks, shapes changing: the same verdict and values as
    the full rule one entry at a time."""
    fields = ("a", "b", "c", "d", "e")
    old = c._CHUNK
    c._CHUNK = chunk
    try:
        got = c.canonical_fields(entries, fields)
    finally:
        c._CHUNK = old
    want = one_by_one(entries, fields)
    assert repr(got) == repr(want)
