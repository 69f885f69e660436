"""Opaque, signed pagination cursors for the API's lists (keyset pagination).

A cursor names a *position* in a list's deterministic sort order (the sort key of the
last item the client was given), never an offset: the next page is "the items after
this key", so entries appended meanwhile never shift a page or repeat an item, and a
cursor stays valid for as long as the list exists.

A cursor is ``base64url(JSON).base64url(HMAC-SHA256)``, signed with a key derived from
the portal's secret (the same in every worker).  It is bound to its list — the route
and the parameters that choose the items (contract, contract year, filters) — so a
cursor of one list given to another, an edited cursor, or garbage is refused with
:class:`BadCursor` (400), never read.  Signed, not encrypted: it holds only the sort
key of an item its holder was already shown; clients must treat it as opaque.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any

from ledger.errors import InvariantBroken
from web.errors import WebError

#: Longest cursor accepted (a sort key is a few short values).
MAX_CURSOR = 512


class BadCursor(WebError):
    """A cursor that this server did not issue for this list (400)."""

    status = 400
    title = "Bad cursor"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CursorCodec:
    """Encodes and checks cursors with a key derived from ``secret``."""

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"yoco-api-cursor\x00" + secret).digest()

    def _sig(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:16]

    def encode(self, kind: str, bound: tuple[Any, ...], position: list[Any]) -> str:
        """A cursor for the item at ``position`` of list ``kind`` chosen by ``bound``."""
        payload = json.dumps(
            {"k": kind, "b": _bind(bound), "p": position}, separators=(",", ":")
        ).encode()
        return _b64(payload) + "." + _b64(self._sig(payload))

    def decode(self, cursor: str, kind: str, bound: tuple[Any, ...]) -> list[Any]:
        """The position in ``cursor``; :class:`BadCursor` unless this server issued it
        for this very list."""
        if len(cursor) > MAX_CURSOR or cursor.count(".") != 1:
            raise BadCursor(_MALFORMED)
        body, sig = cursor.split(".")
        try:
            payload, mac = _unb64(body), _unb64(sig)
        except (binascii.Error, ValueError):
            raise BadCursor(_MALFORMED) from None
        if not hmac.compare_digest(mac, self._sig(payload)):
            raise BadCursor(_MALFORMED)
        data = json.loads(payload)
        if data.get("k") != kind or data.get("b") != _bind(bound):
            raise BadCursor(
                "This cursor belongs to another list (another contract, year or filter): "
                "ask for the first page of this list again without 'cursor'."
            )
        position = data.get("p")
        if not isinstance(position, list):  # we signed it: only a leaked key gets here
            raise InvariantBroken("a signed cursor without its position")
        return position


_MALFORMED = (
    "The 'cursor' parameter is not a cursor this server issued (it was changed or cut); "
    "use the 'next' link of the previous page as it was given, or start again without it."
)


def _bind(bound: tuple[Any, ...]) -> str:
    return hashlib.sha256(repr(bound).encode()).hexdigest()[:24]
