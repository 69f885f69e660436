"""Conditional GETs of the JSON API: ``ETag`` and ``If-None-Match``, keyed by the ledger.

Every API answer is a function of a few things that are cheap to know before anything
is computed: which representation (the route and its normalised query), who asks (the
tenant scope, so one caller's tag never names another's answer), the size of each
contract log the answer reads (a new entry changes it), the latest signed checkpoint of
that log where the answer shows proofs or tree heads (signing adds no entry), the latest
witness cosignature of that log there too (the notes shown carry the cosignature lines,
which arrive after their checkpoint was signed: :attr:`web.db.LogState.heads`), and for
time-dependent figures the instant they are computed at (:func:`figures_instant`).
:func:`make_etag` hashes exactly those; a handler computes the tag first, answers
``304 Not Modified`` when the request's ``If-None-Match`` names it (nothing else is
read or computed), and otherwise sends the body with the tag.

The tags are **strong**: a given tag always stands for the same bytes.  Figures that
depend on the time (allocated GPU-hours of running jobs, a year turning from "on track"
to "met" at its end, the current contract year) are computed at an instant rounded
down to the figures TTL (``YOCO_WEB_FIGURES_TTL_SECONDS``), so every worker process
computes the very same body for the same log size and instant, and a client that got
its copy from one worker gets a 304 from another.  The representation version
(:data:`REPRESENTATION`) is part of every tag, so a release that changes a body changes
its tags.

Conditional answers say ``Cache-Control: private, no-cache``: no shared cache may keep
them, and whoever keeps a copy must revalidate it on every use (which is what the tag
is for).  ``Vary: Authorization, Cookie``: the answer depends on the caller.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from fastapi import Request, Response

#: Bumped whenever the body of any conditional answer changes shape or content.
REPRESENTATION = "yoco-api-1"
CACHE_CONTROL = "private, no-cache"
VARY = "Authorization, Cookie"


def figures_instant(now: datetime, ttl_seconds: float) -> datetime:
    """``now`` rounded down to a multiple of ``ttl_seconds`` since the epoch (UTC).

    The instant the API computes time-dependent figures at: the same in every worker
    for ``ttl_seconds``, so their answers (and tags) agree.  ``ttl_seconds <= 0``:
    ``now`` itself (no reuse).
    """
    if ttl_seconds <= 0:
        return now
    step = int(ttl_seconds * 1_000_000)
    micros = int((now - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000
    micros += now.microsecond
    return datetime.fromtimestamp((micros - micros % step) / 1_000_000, UTC)


def normalised_query(request: Request) -> tuple[tuple[str, str], ...]:
    """The request's query parameters, sorted (the order a client sends them in is not
    part of the representation)."""
    return tuple(sorted(request.query_params.multi_items()))


def make_etag(key: bytes, *parts: Any) -> str:
    """A strong entity tag (quoted) for an answer determined by ``parts``.

    ``parts`` are plain values (str, int, tuples, datetimes); their ``repr`` is hashed
    with :data:`REPRESENTATION`, by 128-bit BLAKE2b keyed with ``key`` (derived from the
    portal's secret): nobody but the server can make a tag, so a made-up
    ``If-None-Match`` can never get a 304 for something the caller was never sent (an
    id that does not exist answers 404 whatever tag comes with it).
    """
    h = hashlib.blake2b(digest_size=16, key=key[:64])
    h.update(repr((REPRESENTATION, *parts)).encode())
    return '"' + h.hexdigest() + '"'


def _tags(header: str) -> Iterable[str]:
    for raw in header.split(","):
        tag = raw.strip()
        if tag.startswith("W/"):
            tag = tag[2:]  # If-None-Match compares weakly (RFC 9110, 13.1.2)
        if tag:
            yield tag


def client_has(request: Request, etag: str) -> bool:
    """True when the request's ``If-None-Match`` names ``etag`` (or is ``*``)."""
    header = request.headers.get("if-none-match")
    if not header:
        return False
    return any(t == "*" or t == etag for t in _tags(header))


def not_modified(etag: str, headers: dict[str, str] | None = None) -> Response:
    """``304 Not Modified`` for ``etag`` (no body)."""
    return Response(status_code=304, headers=conditional_headers(etag) | (headers or {}))


def conditional_headers(etag: str) -> dict[str, str]:
    """The headers of an answer that carries ``etag``."""
    return {"ETag": etag, "Cache-Control": CACHE_CONTROL, "Vary": VARY}


def json_answer(
    request: Request, etag: str, body: bytes, headers: dict[str, str] | None = None
) -> Response:
    """``body`` (JSON bytes) with ``etag``, or a 304 when the client already has it."""
    if client_has(request, etag):
        return not_modified(etag, headers)
    return Response(
        body,
        media_type="application/json",
        headers=conditional_headers(etag) | (headers or {}),
    )
