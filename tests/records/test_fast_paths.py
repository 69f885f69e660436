"""The validator's shortcuts say what the slow, obvious readings say.

``is_producer_event_id`` reads the version and variant digits of a hyphenated id
directly instead of building a :class:`uuid.UUID`; it must agree with ``uuid`` on every
id, whatever its version, variant or letter case. ``job_progress`` records (almost all
of a ledger) are validated by a shortcut that must accept exactly what the general
path accepts, as the same record and the same canonical bytes, and leave everything
else to it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from yoco_records.schema import (
    PRODUCER_UUID_VERSION,
    Record,
    _valid_progress,
    _validate_general,
    is_producer_event_id,
    validate_record,
)


def _by_uuid_module(text: str) -> bool:
    try:
        u = uuid.UUID(text)
    except ValueError:
        return False
    return u.variant == uuid.RFC_4122 and u.version == PRODUCER_UUID_VERSION


@settings(max_examples=1000, deadline=None)
@given(st.integers(min_value=0, max_value=2**128 - 1), st.booleans())
def test_the_v4_shortcut_agrees_with_the_uuid_module(value: int, upper: bool) -> None:
    text = str(uuid.UUID(int=value))
    if upper:
        text = text.upper()
    assert is_producer_event_id(text) == _by_uuid_module(text)


@settings(max_examples=300, deadline=None)
@given(st.uuids(version=4), st.integers(min_value=0, max_value=15), st.integers(0, 15))
def test_every_version_and_variant_digit(base: uuid.UUID, version: int, variant: int) -> None:
    text = str(base)
    text = text[:14] + format(version, "x") + text[15:19] + format(variant, "x") + text[20:]
    assert is_producer_event_id(text) == _by_uuid_module(text)
    assert is_producer_event_id(text) == (version == 4 and variant in (8, 9, 10, 11))


def test_other_forms_still_go_through_the_uuid_module() -> None:
    u = uuid.uuid4()
    assert is_producer_event_id(u)
    assert is_producer_event_id(u.hex)  # no hyphens: not the shortcut's form
    assert not is_producer_event_id("not-a-uuid")
    assert not is_producer_event_id(str(uuid.uuid1()))


# ----------------------------------------------------- job_progress records' shortcut

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # 24 h ahead of it is the last time taken
_ID = "093a3edf-3dbb-4a87-8c8e-3878e92f16a4"


def _bent_times(text: str) -> list[object]:
    """A good timestamp bent at one rule: layout, offset, fraction."""
    plain = text.replace("Z", "").replace("+05:30", "")
    return [
        text.replace("T", "t"),
        text.replace("T", " "),
        text.replace("Z", "z"),
        plain,
        *(plain + z for z in ("+14:00", "+14:01", "-14:00", "-14:01", "+13:59", "+05:60",
                              "-00:00", "+00:00", "+0530", "+5:30", "Z ")),
        plain[:19] + ".1234567Z",
        plain[:19] + ".5Z",
        plain[:19] + ".Z",
    ]


_EDGE_VALUES: dict[str, list[object]] = {
    "kind": ["job_started", "Job_progress", "job_progress ", None],
    "event_id": [
        _ID.upper(),
        *(_ID[:14] + d + _ID[15:] for d in "0123456789abcdef"),
        *(_ID[:19] + d + _ID[20:] for d in "0123456789abcdefABCDEF"),
        _ID.replace("-", ""),
        "{" + _ID + "}",
        _ID[:-1],
        _ID + "0",
        "00000000-0000-4000-8000-000000000000",
        "00000000-0000-0000-0000-000000000000",
        uuid.UUID(_ID),
        None,
    ],
    "contract_id": [],  # the names below
    "occurred_at": [
        "1969-12-31T23:59:59.999999Z",
        "1970-01-01T00:00:00Z",
        "1970-01-01T01:00:00+01:00",
        "1970-01-01T00:59:59+01:00",
        "2026-03-02T12:00:00Z",
        "2026-03-02T12:00:00.000001Z",
        "2026-03-02T12:00:00-00:01",
        "2026-03-02T13:00:00+01:00",
        "2025-02-29T10:00:00Z",
        "2024-02-29T10:00:00Z",
        "2025-01-01T24:00:00Z",
        "2025-06-30T23:59:60Z",
        "2025-13-01T10:00:00Z",
        "2025-00-01T10:00:00Z",
        "0000-01-01T00:00:00Z",
        "2025-01-01",
        "",
        7,
        None,
        *_bent_times("2025-06-01T10:20:30Z"),
        *_bent_times("2025-06-01T10:20:30.25+05:30"),
    ],
    "job_id": [
        " ", "", "\t", "x" * 200, "x" * 201, "a\x00b", "a\x1fb", "a\x7fb", "a\x85b", "a\x9fb",
        "a\xa0b", "\ud800", "año", "\u2028", "\"q\\", 7, None, ["C-1"],
    ],
    "step": [-1, 0, 2**53 - 1, 2**53, True, False, 1.0, "1", None],
    "step_seconds": [
        0, 0.0, -0.0, -1, -0.5, 1, 10**9, 10**9 + 1, 1e9, 1000000000.0000001,
        999999999.9999999, float("nan"), float("inf"), -float("inf"), 5e-324, 1e-320, 1e-7,
        1e16, 2.0**53, 0.1, 2.5, True, False, "1", None, [1],
    ],
}
_EDGE_VALUES["contract_id"] = _EDGE_VALUES["job_id"]


def _base(time: str, seconds: object) -> dict[str, object]:
    return {
        "kind": "job_progress",
        "event_id": _ID,
        "contract_id": "BENCH-1",
        "occurred_at": time,
        "job_id": "job-3-0",
        "step": 2963,
        "step_seconds": seconds,
    }


_BASES = [_base("2025-06-01T10:20:30.123456Z", 7.006), _base("2025-06-01T10:20:30+05:30", 2)]


def _bent_objects() -> list[dict[str, object]]:
    """Each valid base with each field set to each of its edge values, one at a time; with
    a field removed; with one added."""
    out = []
    for base in _BASES:
        out += [{**base, name: v} for name, values in _EDGE_VALUES.items() for v in values]
        out += [{k: v for k, v in base.items() if k != name} for name in base]
        out += [{**base, "gpus": 8}, {**base, "Step": 1}]
    return out


def _same_record(fast: Record, general: Record) -> None:
    assert fast == general
    assert fast.canonical == general.canonical
    assert fast.occurred_at.utcoffset() == general.occurred_at.utcoffset()
    fast_s = fast.data.step_seconds  # type: ignore[union-attr]
    general_s = general.data.step_seconds  # type: ignore[union-attr]
    assert type(fast_s) is type(general_s) and str(fast_s) == str(general_s)
    assert fast.body is general.body
    assert (fast.line, fast.index) == (general.line, general.index)


def _agree(obj: dict[str, object], index: int = 3) -> Record | None:
    """The shortcut's record (or None), after holding it to the general path's."""
    fast = _valid_progress(obj, None, index, NOW)
    general, errors = _validate_general(obj, None, index, NOW)
    if fast is not None:
        assert general is not None and not errors, obj
        _same_record(fast, general)
    record, errs = validate_record(obj, index=index, now=NOW)
    assert record == general and [str(e) for e in errs] == [str(e) for e in errors]
    return fast


def test_the_progress_shortcut_accepts_only_what_the_general_path_accepts() -> None:
    objects = _bent_objects()
    taken = [obj for obj in objects if _agree(obj) is not None]
    # It is used: the bases, and the edges every rule accepts in the shortcut's layout.
    assert all(_agree(base) is not None for base in _BASES)
    assert 60 < len(taken) < len(objects) / 2


@st.composite
def _good_times(draw: st.DrawFn) -> str:
    """Timestamps every rule accepts, in the layouts producers write."""
    when = draw(
        st.datetimes(
            min_value=datetime(1970, 1, 2),
            max_value=datetime(2026, 3, 1),
            timezones=st.sampled_from(
                [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-14))]
            ),
        )
    )
    return when.isoformat().replace("+00:00", draw(st.sampled_from(["+00:00", "Z"])))


@settings(max_examples=120, deadline=None)
@given(
    st.uuids(version=4),
    st.sampled_from(["C-1", "BENCH-1", "año ✓", "x" * 200]),
    _good_times(),
    st.integers(0, 2**53 - 1),
    st.floats(min_value=1e-9, max_value=1e9) | st.integers(1, 10**9),
    st.lists(st.sampled_from(list(_EDGE_VALUES)), max_size=2, unique=True),
    st.data(),
)
def test_random_progress_records_agree_and_ordinary_ones_take_the_shortcut(
    eid, cid, at, step, seconds, bent, data
) -> None:
    obj: dict[str, object] = {
        "kind": "job_progress",
        "event_id": str(eid),
        "contract_id": cid,
        "occurred_at": at,
        "job_id": "j1",
        "step": step,
        "step_seconds": seconds,
    }
    if not bent:
        assert _agree(obj) is not None
    for name in bent:
        obj[name] = data.draw(st.sampled_from(_EDGE_VALUES[name]), label=name)
    _agree(obj)
