"""The FastAPI application factory: pages, the JSON API and its OpenAPI schema.

``create_app(host)`` builds everything on call; importing this module creates nothing.
The host (:class:`web.portal.Host`) comes from the composition root, which ``web`` does
not import: ``yoco.webapp.portal_app()`` passes its ``App``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from web.errors import LoginRequired, NotFound, RateLimited, WebError
from web.portal import Host, Portal
from web.settings import WebSettings

log = logging.getLogger("yoco.web")
HERE = Path(__file__).resolve().parent

API_DESCRIPTION = """\
The yoco ledger's figures for customers' own tooling, and record ingestion for runtimes.

Authenticate with a session cookie (logged-in portal users) or a bearer token
(`Authorization: Bearer yoco_…`, made with `yoco tokens create`). Read tokens see their
customer's contracts only; ingest tokens may post records for their contracts only.
Anything another customer owns answers 404, exactly like something that does not exist.
"""

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
}


_HEADER_BYTES = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
#: Tenant data (API JSON, proofs, reports, exports) must not sit in a shared or browser
#: cache: every response but the static assets is ``no-store`` unless it says otherwise.
_NO_STORE = (b"cache-control", b"no-store")


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` (and ``Cache-Control: no-store``, except under
    ``/static``) to every HTTP response that does not set them."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        static = scope.get("path", "").startswith("/static/")

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers.extend((k, v) for k, v in _HEADER_BYTES if k not in present)
                if not static and _NO_STORE[0] not in present:
                    headers.append(_NO_STORE)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _error_page(request: Request, status: int, title: str, message: str) -> Response:
    from web.render import page

    return page(request, "error.html", {"title": title, "message": message}, status_code=status)


def _json_error(status: int, message: str, errors: Any = None) -> JSONResponse:
    body: dict[str, Any] = {"detail": message}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status)


async def _web_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, WebError):
        raise exc
    headers = {}
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(exc.retry_after)
    if _is_api(request):
        response: Response = _json_error(exc.status, exc.message, exc.detail)
        if isinstance(exc, LoginRequired):
            headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(exc, LoginRequired):
        from urllib.parse import quote

        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    else:
        response = _error_page(request, exc.status, exc.title, exc.message)
    response.headers.update(headers)
    return response


def _domain_status(exc: Exception) -> tuple[int, str, str] | None:
    """HTTP status, title and message of a domain error (None if it is not one)."""
    from billing.errors import BillingError, DisputeAlreadyOpen, PeriodOutOfRange, SelfDecision
    from ledger.errors import LedgerError, UnknownContract, UnknownEntry

    if isinstance(exc, UnknownContract | UnknownEntry | PeriodOutOfRange):
        return 404, "Not found", NotFound().message
    if isinstance(exc, DisputeAlreadyOpen):
        return 409, "Not possible now", (
            "This failure already has an open dispute; it must be decided before another "
            "is opened."
        )
    if isinstance(exc, SelfDecision):
        return 403, "Forbidden", "Whoever opened a dispute may not decide it."
    if isinstance(exc, BillingError | LedgerError):
        return 422, "Refused", str(exc)
    from reports.errors import MonthOutOfTerm, NoCheckpoint, ReportError

    if isinstance(exc, MonthOutOfTerm):
        return 404, "Not found", NotFound().message
    if isinstance(exc, NoCheckpoint):
        return 409, "Not available yet", str(exc)
    if isinstance(exc, ReportError):
        return 422, "Refused", str(exc)
    return None


async def _any_error(request: Request, exc: Exception) -> Response:
    mapped = _domain_status(exc)
    if mapped is None:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        status, title, message = (
            500,
            "Something went wrong",
            "Something went wrong on our side. It has been logged; please try again later.",
        )
    else:
        status, title, message = mapped
    if _is_api(request):
        return _json_error(status, message)
    return _error_page(request, status, title, message)


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, StarletteHTTPException):
        raise exc
    if _is_api(request):
        return _json_error(exc.status_code, str(exc.detail), None)
    if exc.status_code == 404:
        return _error_page(request, 404, "Not found", NotFound().message)
    return _error_page(request, exc.status_code, "Request refused", str(exc.detail))


async def _validation_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, RequestValidationError):
        raise exc
    if _is_api(request):
        from fastapi.encoders import jsonable_encoder

        errors = [
            {k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()
        ]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)
    return _error_page(
        request, 400, "Bad request", "Some of the values in this address are not valid."
    )


class _PortalApp(FastAPI):
    """FastAPI with the fast lane (:class:`web.fastlane.FastLane`) outside its whole
    middleware stack: a replayed answer costs none of FastAPI's per-request layers, and
    what it keeps has passed through all of them (the security headers included)."""

    def build_middleware_stack(self) -> Any:
        from web.fastlane import FastLane

        return FastLane(super().build_middleware_stack(), self.state.portal)


def create_app(
    host: Host,
    settings: WebSettings | None = None,
    *,
    hasher: PasswordHasher | None = None,
    clock: Callable[[], datetime] | None = None,
) -> FastAPI:
    """Build the portal: pages, ``/api/v1`` with its OpenAPI schema, static files.

    ``host`` is what the composition root gives the portal (``yoco.app.App`` is one);
    engines and keys are created on first use, and released at shutdown.
    """
    from web.deps import refuse_nul
    from web.routers import ROUTERS

    portal = Portal(host, settings or WebSettings(), hasher=hasher, clock=clock)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = (
            portal.settings.threads
        )
        if portal.settings.replay_cache_bytes > 0:
            portal.probes.start()  # the fast lane serves this event loop
        try:
            yield
        finally:
            await portal.probes.stop()
            portal.close()

    app = _PortalApp(
        title="yoco portal API",
        version="1",
        description=API_DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
        lifespan=lifespan,
        dependencies=[Depends(refuse_nul)],
    )
    app.state.portal = portal
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    for router in ROUTERS:
        app.include_router(router)
    app.add_exception_handler(WebError, _web_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _any_error)
    from billing.errors import BillingError
    from ledger.errors import LedgerError
    from reports.errors import ReportError

    app.add_exception_handler(LedgerError, _any_error)
    app.add_exception_handler(BillingError, _any_error)
    app.add_exception_handler(ReportError, _any_error)

    # A plain ASGI middleware: Starlette's BaseHTTPMiddleware (``@app.middleware``)
    # costs a task and a memory stream per request.
    app.add_middleware(SecurityHeaders)

    return app
