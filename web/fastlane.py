"""The API's fast lane: a repeated GET answered again without FastAPI, in the event loop.

A GET of ``/api/v1`` is a function of a few inputs (see :mod:`web.conditional`): the
request target, the caller's tenant scope, its ``If-None-Match``, the state of the
contract's log (its size and latest signed tree size) and, for figures that depend on
the time, the figures instant.  A handler that knows its answer is exactly such a
function *declares* it (:func:`web.replay.declare`: the scope, the log state and the instant it
used); :class:`FastLane`, a plain ASGI middleware outside everything else, then keeps
the complete response (status, every header, body) under

    (scope, raw path, raw query, If-None-Match) -> (log state, instant, response)

and answers the next request with the same key from it, **only** when

- the caller is known without asking the database, by the very rule the handlers use
  (:func:`web.deps.known_principal`: a bearer token or a session seen live within
  ``YOCO_WEB_SESSION_CACHE_SECONDS``) and may read (``can_read``), and its scope is
  the kept one — so one tenant's answer never reaches another, and revocation works as
  it does for every read (within that TTL);
- the figures instant now is the kept one;
- the visibility probe, run now in the event loop (:class:`web.replay.AsyncProbe`), sees the
  contract for this scope with the kept log state — so an answer is never older than
  the ledger state it claims, and a contract the caller may not see is never answered
  from here (the handler answers 404).

An answer that sets a cookie is never kept (it belongs to one caller, not to a tenant).
Anything else — another method, a path outside ``/api/v1``, an unknown caller, no kept
answer, a different state, an error of the probe — goes to the application as before.
What is replayed is byte for byte what the handler sent for an identical request in
the identical state, so the behaviour of every route is unchanged; what is saved is
the routing, the dependency solving, the hop to the thread pool and the pooled
connection checkout of each repeated request, and concurrent requests for one contract
share one probe round trip.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from web.accounts import Principal
from web.db import scope_settings
from web.replay import PUBLIC, SCOPE_KEY, Declaration, Kept

if TYPE_CHECKING:
    from web.portal import Portal

log = logging.getLogger("yoco.web")

PREFIX = "/api/v1/"
LIST = "/api/v1/contracts"
CONTRACTS = LIST + "/"
PUBLIC_PATHS = frozenset({"/api/v1/public-key"})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as Starlette reads it."""
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class FastLane:
    """Replays declared answers of ``/api/v1`` GETs (see the module's docstring)."""

    def __init__(self, app: Any, portal: Portal) -> None:
        self.app = app
        self.portal = portal
        self._warned = -1e9

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
        try:
            if await self._replayed(scope, target, inm, send):
                return
        except Exception:  # the probe's connection broke, or worse: the usual way
            now = time.monotonic()
            if now - self._warned > 60:  # once a minute, not once per request
                self._warned = now
                log.warning("fast lane: answering %s the usual way", scope["path"],
                            exc_info=True)
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
            portal.replays.put(
                (holder.scope, *target, inm),
                Kept(holder.state, holder.at, int(status),
                     list(start.get("headers", [])), b"".join(parts)),
            )

    async def _replayed(
        self, scope: Any, target: tuple[bytes, bytes], inm: str | None, send: Any
    ) -> bool:
        """Answer from a kept answer if it is still exactly the answer; False if not."""
        from web.deps import SESSION_COOKIE, known_principal

        portal = self.portal
        path: str = scope["path"]
        if path in PUBLIC_PATHS:
            who_scope = PUBLIC
        else:
            if path != LIST and not path.startswith(CONTRACTS):
                return False
            cookie = None
            auth = _header(scope, b"authorization")
            if auth is None:
                raw = _header(scope, b"cookie")
                if raw:
                    from starlette.requests import cookie_parser

                    cookie = cookie_parser(raw).get(SESSION_COOKIE)
            who = known_principal(portal, auth, cookie)
            # the rule of web.deps.api_reader: someone known who may read
            if not isinstance(who, Principal) or not who.can_read:
                return False
            who_scope = scope_settings(who)
        kept = portal.replays.get((who_scope, *target, inm))
        if kept is None:
            return False
        if kept.at is not None and kept.at != portal.figures_now():
            return False
        if kept.state is not None or who_scope is not PUBLIC:
            contract_id = None if path == LIST else path[len(CONTRACTS):].split("/", 1)[0]
            if contract_id == "":
                return False
            state = await portal.probes.state(who_scope, contract_id)
            if state is None or state != kept.state:
                return False
        portal.replays.hits += 1
        await send({"type": "http.response.start", "status": kept.status,
                    "headers": kept.headers})
        await send({"type": "http.response.body", "body": kept.body})
        return True
