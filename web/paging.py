"""Keyset pagination of the API's lists: the ``limit`` and ``cursor`` parameters and the
``next`` link (``Link: <…>; rel="next"``, RFC 8288).

A list answers its first ``limit`` items (default :data:`DEFAULT_LIMIT`) in its sort
order; when more remain, the answer carries a ``Link`` header whose ``next`` target is
the same address with ``cursor`` set (:mod:`web.cursors`).  A client that ignores the
header sees the first page, as before; one that follows it sees every item once.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import Query, Request

from web.cursors import MAX_CURSOR

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

LimitQ = Annotated[
    int,
    Query(ge=1, le=MAX_LIMIT, description=f"Items per page (default {DEFAULT_LIMIT})."),
]
CursorQ = Annotated[
    str | None,
    Query(
        max_length=MAX_CURSOR,
        description="Where to continue: the 'cursor' of the 'next' link of the previous "
        "page (opaque). Absent: the first page.",
    ),
]

#: The headers a paged answer documents (OpenAPI).
PAGED_HEADERS = {
    "Link": {
        "description": 'The next page, when there is one: `<URL>; rel="next"`.',
        "schema": {"type": "string"},
    },
    "ETag": {"description": "Strong entity tag; send it in If-None-Match.",
             "schema": {"type": "string"}},
}


def next_url(request: Request, cursor: str) -> str:
    """The address of the next page: this request's path and query with ``cursor``
    set and no ``page`` number (relative to the server, so it is right behind a proxy
    too)."""
    query = [(k, v) for k, v in request.query_params.multi_items()
             if k not in ("cursor", "page")]
    query.append(("cursor", cursor))
    return f"{request.url.path}?{urlencode(query)}"


def link_headers(request: Request, cursor: str | None) -> dict[str, str]:
    """``{"Link": '<next>; rel="next"'}`` when there is a next page, else nothing."""
    if cursor is None:
        return {}
    return {"Link": f'<{next_url(request, cursor)}>; rel="next"'}
