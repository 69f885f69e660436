"""Logging in and out (pages)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from web.accounts import LoginLimits, authenticate, close_session
from web.deps import SESSION_COOKIE, CsrfDep, PortalDep, caller
from web.errors import RateLimited
from web.render import page, secure_cookies

router = APIRouter(include_in_schema=False)


def safe_next(target: str | None) -> str:
    """A local path to go to after login (anything else becomes ``/``)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@router.get("/login")
def login_form(request: Request, portal: PortalDep, next: str = "/") -> Response:
    """The login form (or straight on when already logged in)."""
    if caller(request, portal) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return page(request, "login.html", {"next": safe_next(next), "error": None, "email": ""})


@router.post("/login")
def login(
    request: Request,
    portal: PortalDep,
    _csrf: CsrfDep,
    email: Annotated[str, Form(max_length=320)] = "",
    password: Annotated[str, Form(max_length=1024)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    """Check e-mail and password (rate-limited) and start a session."""
    s = portal.settings
    address = request.client.host if request.client else "unknown"
    limits = LoginLimits(
        per_pair=s.login_failures_per_account,
        per_address=s.login_failures_per_address,
        per_account=s.login_failures_per_account_everywhere,
        window=timedelta(minutes=s.login_window_minutes),
        backoff=timedelta(seconds=s.login_backoff_seconds),
    )
    try:
        token = authenticate(
            portal.db.write,
            portal.hasher,
            email=email,
            password=password,
            address=address,
            limits=limits,
            hours=s.session_hours,
            now=portal.now(),
        )
    except RateLimited as exc:
        response = page(
            request,
            "login.html",
            {"next": safe_next(next), "error": exc.message, "email": email},
            status_code=429,
        )
        response.headers["Retry-After"] = str(exc.retry_after)
        return response
    if token is None:
        return page(
            request,
            "login.html",
            {
                "next": safe_next(next),
                "error": "That e-mail address and password do not match an account.",
                "email": email,
            },
            status_code=401,
        )
    done = RedirectResponse(safe_next(next), status_code=303)
    done.set_cookie(
        SESSION_COOKIE,
        portal.signer.sign_session(token),
        max_age=int(s.session_hours * 3600),
        httponly=True,
        samesite="lax",
        secure=secure_cookies(request, s.secure_cookies),
        path="/",
    )
    return done


@router.post("/logout")
def logout(request: Request, portal: PortalDep, _csrf: CsrfDep) -> Response:
    """End the session and forget the cookie."""
    token = portal.signer.session_token(
        request.cookies.get(SESSION_COOKIE), portal.settings.session_hours * 3600
    )
    if token:
        portal.cache.sessions.drop(token)
        with portal.db.write() as db:
            close_session(db, token)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        httponly=True,
        samesite="lax",
        secure=secure_cookies(request, portal.settings.secure_cookies),
    )
    return response
