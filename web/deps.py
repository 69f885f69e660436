"""Request dependencies: who is calling, the scoped database session, CSRF checks.

Handlers take these as ``Annotated`` aliases: ``PortalDep``, ``UserDep`` (a logged-in
person; pages), ``ReaderDep`` (a person or a read token; API), ``OperatorDep``,
``FinanceDep``, ``StaffDep``, ``PageDb`` / ``ApiDb`` (a session as the portal role scoped
to the caller), ``CsrfDep`` (a checked form token).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Form, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from web.accounts import Principal, principal_of_user, session_user, token_principal
from web.errors import CsrfFailed, Forbidden, Invalid, LoginRequired, NotFound
from web.portal import Portal

SESSION_COOKIE = "yoco_session"
ANON_COOKIE = "yoco_anon"


def get_portal(request: Request) -> Portal:
    """The application's :class:`Portal`."""
    portal: Portal = request.app.state.portal
    return portal


async def _portal(request: Request) -> Portal:
    # async: FastAPI would run a plain function in the thread pool (a thread hop per request)
    return get_portal(request)


PortalDep = Annotated[Portal, Depends(_portal)]
#: "Not known without asking the database" (:func:`known_principal`).
UNKNOWN = object()


def _token_key(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()


def _bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def known_principal(
    portal: Portal, authorization: str | None, session_cookie: str | None
) -> Principal | object | None:
    """The caller of a request with these ``Authorization`` and session-cookie values
    when that needs no database query (a session or, for reads, a bearer token seen live
    lately), else :data:`UNKNOWN`.  The rule of :func:`caller`: a request with an
    ``Authorization`` header is judged by it alone."""
    if authorization is not None:
        value = _bearer(authorization)
        if not value:
            return UNKNOWN
        key = _token_key(value)
        tokens = portal.cache.tokens
        hit = tokens.entry(key)
        if hit is None:
            return UNKNOWN
        if tokens.aging(hit[0]):  # checked again before it runs out
            portal.recheck(tokens, key, hit[0], lambda: _lookup_token(portal, value))
        return hit[1]
    token = portal.signer.session_token(session_cookie, portal.settings.session_hours * 3600)
    if not token:
        return None
    sessions = portal.cache.sessions
    seen = sessions.entry(token)
    if seen is None:
        return UNKNOWN
    if sessions.aging(seen[0]):
        portal.recheck(sessions, token, seen[0], lambda: _lookup_session(portal, token))
    return seen[1]


def _lookup_token(portal: Portal, value: str) -> Principal | None:
    """The principal of a live bearer token, asked of the database."""
    with portal.db.write() as s:
        return token_principal(s, value)


def _lookup_session(portal: Portal, token: str) -> Principal | None:
    """The principal of a live session token, asked of the database."""
    with portal.db.write() as s:
        user = session_user(s, token)
        return None if user is None else principal_of_user(user, binding=token)


def _known_caller(request: Request, portal: Portal) -> Principal | object | None:
    """The caller when that needs no database query, else UNKNOWN (remembered on the
    request once known)."""
    if hasattr(request.state, "principal"):
        cached: Principal | None = request.state.principal
        return cached
    found = known_principal(
        portal, request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE)
    )
    if found is not UNKNOWN:
        request.state.principal = found
    return found


async def caller_async(request: Request, portal: Portal) -> Principal | None:
    """:func:`caller` without leaving the event loop when no database query is needed."""
    known = _known_caller(request, portal)
    if known is UNKNOWN:
        return await run_in_threadpool(caller, request, portal)
    return known  # type: ignore[return-value]


def caller(request: Request, portal: Portal) -> Principal | None:
    """The principal of a bearer token or a session cookie (None if neither is valid).

    A request with an ``Authorization`` header is judged by it alone: a bad token is
    not rescued by a cookie.
    """
    if hasattr(request.state, "principal"):
        cached: Principal | None = request.state.principal
        return cached
    found: Principal | None = None
    header = request.headers.get("authorization")
    if header is not None:
        value = _bearer(header)
        if value:
            found = _lookup_token(portal, value)
            if found is not None:
                # Only the async readers (caller_async) look here; writers always ask.
                portal.cache.tokens.put(_token_key(value), found)
    else:
        token = portal.signer.session_token(
            request.cookies.get(SESSION_COOKIE), portal.settings.session_hours * 3600
        )
        if token:
            found = portal.cache.sessions.get(token)
            if found is None:
                found = _lookup_session(portal, token)
                if found is not None:
                    portal.cache.sessions.put(token, found)
    request.state.principal = found
    return found


async def current_user(request: Request, portal: PortalDep) -> Principal:
    """A logged-in person (pages); :class:`LoginRequired` otherwise."""
    who = await caller_async(request, portal)
    if who is None or who.kind != "user":
        raise LoginRequired()
    return who


async def api_reader(request: Request, portal: PortalDep) -> Principal:
    """A person or a token allowed to read its customer's data (API)."""
    who = await caller_async(request, portal)
    if who is None:
        raise LoginRequired("Send a session cookie or an 'Authorization: Bearer' token.")
    if not who.can_read:
        raise Forbidden("This token may only post records.")
    return who


def api_writer(request: Request, portal: PortalDep) -> Principal:
    """A bearer token allowed to post records for at least one contract."""
    who = caller(request, portal)
    if who is None or who.kind != "token":
        raise LoginRequired("Send an ingest token as 'Authorization: Bearer <token>'.")
    if not who.contract_ids:
        raise Forbidden("This token may not post records.")
    return who


UserDep = Annotated[Principal, Depends(current_user)]
ReaderDep = Annotated[Principal, Depends(api_reader)]
WriterDep = Annotated[Principal, Depends(api_writer)]


def staff(user: UserDep) -> Principal:
    """An operator or finance user; others get 404 (staff pages are not advertised)."""
    if not user.is_staff:
        raise NotFound()
    return user


def operator(user: UserDep) -> Principal:
    """An operator (SLA desk); others get 404."""
    if user.role != "operator":
        raise NotFound()
    return user


def finance(user: UserDep) -> Principal:
    """A finance user (operators may also see finance pages); others get 404."""
    if user.role not in ("finance", "operator"):
        raise NotFound()
    return user


StaffDep = Annotated[Principal, Depends(staff)]
OperatorDep = Annotated[Principal, Depends(operator)]
FinanceDep = Annotated[Principal, Depends(finance)]


def page_db(user: UserDep, portal: PortalDep) -> Iterator[Session]:
    """A portal-role session scoped to the logged-in user's tenant."""
    with portal.db.read(user) as session:
        yield session


def api_db(reader: ReaderDep, portal: PortalDep) -> Iterator[Session]:
    """A portal-role session scoped to the API caller's tenant."""
    with portal.db.read(reader) as session:
        yield session


PageDb = Annotated[Session, Depends(page_db)]
ApiDb = Annotated[Session, Depends(api_db)]


def csrf_binding(request: Request, portal: Portal) -> str | None:
    """What the caller's CSRF token is bound to: its session, else its anonymous id."""
    who = caller(request, portal)
    if who is not None and who.session_binding:
        return who.session_binding
    return portal.signer.anon_ident(request.cookies.get(ANON_COOKIE))


def check_csrf(
    request: Request, portal: PortalDep, csrf_token: Annotated[str, Form()] = ""
) -> None:
    """Refuse a form whose ``csrf_token`` is not the caller's."""
    if not portal.signer.check_csrf(csrf_binding(request, portal), csrf_token):
        raise CsrfFailed()


CsrfDep = Annotated[None, Depends(check_csrf)]

_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


async def refuse_nul(request: Request) -> None:
    """Refuse a NUL character anywhere in the path, the query or a form (every route).

    PostgreSQL cannot store NUL in text, so such a value would fail deep in a query:
    no contract, event or month can have one (404), and no field may (422).
    """
    if "\x00" in request.url.path:
        raise NotFound()
    if any("\x00" in k or "\x00" in v for k, v in request.query_params.multi_items()):
        raise Invalid("A value in the address contains a NUL character.")
    # Forms only on pages, where FastAPI has parsed them for the handler already (cached
    # on the request); the API takes JSON, read by its handlers as it streams.
    if (
        request.method == "POST"
        and not request.url.path.startswith("/api/")
        and request.headers.get("content-type", "").startswith(_FORMS)
    ):
        form = await request.form()
        for k, v in form.multi_items():
            if "\x00" in k or (isinstance(v, str) and "\x00" in v):
                raise Invalid(f"The field {k!r} contains a NUL character.")
