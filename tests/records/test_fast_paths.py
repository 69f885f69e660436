"""The validator's shortcuts say what the slow, obvious readings say.

``is_producer_event_id`` reads the version and variant digits of a hyphenated id
directly instead of building a :class:`uuid.UUID`; it must agree with ``uuid`` on every
id, whatever its version, variant or letter case.
"""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from yoco_records.schema import PRODUCER_UUID_VERSION, is_producer_event_id


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
