"""The API's replay of repeated GETs, behind the normal authentication.

A GET of ``/api/v1`` is a function of a few inputs (see :mod:`web.conditional`): the
request target, the caller's tenant scope, its ``If-None-Match``, the state of the
contract's log (its size and latest signed tree size) and, for figures that depend on
the time, the figures instant.  A handler that knows its answer is exactly such a
function *declares* it (:func:`web.replay.declare`: the scope, the log state and the
instant it used); :class:`FastLane`, a plain ASGI middleware outside everything else,
then keeps the complete response (status, every header, body) under

    (scope, raw path, raw query, If-None-Match) -> (log state, instant, response)

The kept answers are the ``replays`` region of the portal's one cache, under its one
rule (:mod:`web.cache`): an answer names the tenant scope (part of the key), the contract
log's state and the figures instant it was made from, and is replayed only when the
state read afresh for this request by the visibility probe
(:class:`web.replay.AsyncProbe`, run as the caller's scope: a contract it may not see has
no state) and the instant are those; space is bounded by bytes
(``YOCO_WEB_REPLAY_CACHE_BYTES``, least recently used out first).  The body is not kept
a second time: where the handler kept it in the cache (:func:`web.replay.body_kept`), the
kept answer refers to that very entry (:class:`web.replay.Kept`), and is replayed only
while that entry is there, unchanged.

Who may be answered from it is decided by the API's one authentication path: the
middleware runs :func:`web.deps.api_reader` -- the very dependency every read route
runs, with its rule and its caches: a token or session remembered within
``YOCO_WEB_SESSION_CACHE_SECONDS``, else asked of the database (the caller found is kept
on the request, so a request that goes on to its handler is not looked up twice) -- and
only a caller it lets in may get a kept answer; whoever it refuses goes to the
application, which refuses them with the same error. Only then does
:func:`replay_kept` look for the kept answer and check it as above. (The public key
needs no caller.)

An answer that sets a cookie is never kept (it belongs to one caller, not to a tenant).
What is replayed is byte for byte what the handler sent for an identical request in the
identical state, so the behaviour of every route is unchanged; what is saved is the
handler itself: the hop to the thread pool, the pooled connection checkout and the
answer's making, and concurrent requests for one contract share one probe round trip.
(Answered here, outside FastAPI, it costs under a third of the CPU of the same answer
replayed after FastAPI's routing and dependency solving: docs/benchmarks-portal.md.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from web.accounts import Principal
from web.db import scope_settings
from web.replay import PUBLIC, SCOPE_KEY, Declaration, Kept, source_of

if TYPE_CHECKING:
    from web.portal import Portal

log = logging.getLogger("yoco.web")

PREFIX = "/api/v1/"
LIST = "/api/v1/contracts"
CONTRACTS = LIST + "/"
PUBLIC_PATHS = frozenset({"/api/v1/public-key"})


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as Starlette reads it."""
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


async def replay_kept(scope: MutableMapping[str, Any], portal: Portal,
                      who: Principal | None) -> tuple[Kept, bytes] | None:
    """The kept answer to this request of ``who`` (already let in by
    :func:`web.deps.api_reader`; None: a public answer) and its body, if it is still
    exactly the answer, else None (the handler answers). A failed probe is logged (once
    a minute) and the handler answers."""
    path: str = scope["path"]
    if who is None:
        if path not in PUBLIC_PATHS:
            return None
        who_scope = PUBLIC
    else:
        if path != LIST and not path.startswith(CONTRACTS):
            return None
        who_scope = scope_settings(who)
    target = (scope.get("raw_path") or path.encode(), scope["query_string"])
    kept = portal.cache.replays.get((who_scope, *target, _header(scope, b"if-none-match")))
    if kept is None:
        return None
    if kept.at is not None and kept.at != portal.figures_now():
        return None
    if kept.state is not None or who_scope is not PUBLIC:
        contract_id = None if path == LIST else path[len(CONTRACTS):].split("/", 1)[0]
        if contract_id == "":
            return None
        try:
            state = await portal.probes.state(who_scope, contract_id)
        except Exception:  # the probe's connection broke, or worse: the usual way
            _warn_once(portal, path)
            return None
        if state is None or state != kept.state:
            return None
    body = kept.content()
    if body is None:  # the body's entry is gone (or made again): the handler answers
        return None
    portal.cache.replays.hits += 1
    return kept, body


def _warn_once(portal: Portal, path: str) -> None:
    now = time.monotonic()
    if now - portal.cache.replay_warned_at > 60:  # once a minute, not once per request
        portal.cache.replay_warned_at = now
        log.warning("replay: answering %s the usual way", path, exc_info=True)


async def _reader(scope: MutableMapping[str, Any], portal: Portal) -> Principal | None:
    """The caller as :func:`web.deps.api_reader` lets it in, or None when it refuses
    (the application then refuses the request the same way)."""
    from starlette.requests import Request

    from web.deps import api_reader
    from web.errors import WebError

    try:
        return await api_reader(Request(scope), portal)
    except WebError:
        return None
    except Exception:  # the database, say: the application answers (and reports) it
        _warn_once(portal, str(scope["path"]))
        return None


class FastLane:
    """Keeps the declared answers of ``/api/v1`` GETs and replays them, after the API's
    authentication (see the module's docstring)."""

    def __init__(self, app: Any, portal: Portal) -> None:
        self.app = app
        self.portal = portal

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not scope["path"].startswith(PREFIX)
            or not self.portal.probes.serving()
        ):
            await self.app(scope, receive, send)
            return
        portal = self.portal
        target = (scope.get("raw_path") or scope["path"].encode(), scope["query_string"])
        inm = _header(scope, b"if-none-match")
        path: str = scope["path"]
        kept = None
        if path in PUBLIC_PATHS:
            kept = await replay_kept(scope, portal, None)
        elif path == LIST or path.startswith(CONTRACTS):  # the read routes, ReaderDep's
            who = await _reader(scope, portal)
            kept = None if who is None else await replay_kept(scope, portal, who)
        if kept is not None:
            answer, body = kept
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": answer.headers})
            await send({"type": "http.response.body", "body": body})
            return
        holder = Declaration()
        scope[SCOPE_KEY] = holder
        start: dict[str, Any] = {}
        parts: list[bytes] = []
        complete = False

        async def keep(message: Any) -> None:
            nonlocal complete
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                complete = not message.get("more_body", False)
            await send(message)

        await self.app(scope, receive, keep)
        status = start.get("status")
        if holder.at is not None and portal.settings.figures_ttl_seconds <= 0:
            return  # figures of this very microsecond: never asked for again
        # An answer that sets a cookie is someone's own (a session, a CSRF binding):
        # kept by tenant scope it could reach another caller of that tenant. None of
        # /api/v1 sets one today; this keeps it so if a route ever does.
        if any(k.lower() == b"set-cookie" for k, _ in start.get("headers", [])):
            return
        if holder.set and complete and status in (200, 304) and holder.scope is not None:
            body = b"".join(parts)  # one part: that very object, no copy
            source = None if holder.body is None else source_of(*holder.body, body)
            portal.cache.replays.put(
                (holder.scope, *target, inm),
                Kept(holder.state, holder.at, int(status), list(start.get("headers", [])),
                     b"" if source is not None else body, source=source),
            )
