"""Page rendering: the CSRF-aware page response and fragments, on the portal's templates.

The filters and the chart those templates use are :mod:`web.filters`.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from web.deps import ANON_COOKIE, caller, csrf_binding, get_portal

#: What an RFC 8187 ``filename*`` value may carry unencoded (its ``attr-char``).
_ATTR_SAFE = "!#$&+-.^_`|~"


def attachment(filename: str) -> dict[str, str]:
    """The ``Content-Disposition`` header of a download named ``filename`` (RFC 6266): a
    plain ``filename`` for older clients (printable ASCII only, quotes and backslashes
    replaced) and ``filename*`` with the exact name in UTF-8, percent-encoded. Any name —
    a contract id in Cyrillic, a quote, a CR — gives a valid header, never a 500; path
    separators become ``_`` in both."""
    name = filename.replace("/", "_").replace("\\", "_")
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in name)
    encoded = quote(name, safe=_ATTR_SAFE, encoding="utf-8")
    return {"Content-Disposition": f"attachment; filename=\"{fallback}\"; "
                                   f"filename*=UTF-8''{encoded}"}


def secure_cookies(request: Request, mode: str) -> bool:
    """Whether cookies get the Secure attribute (``auto``: when served over HTTPS)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return request.url.scheme == "https"


def page(
    request: Request,
    name: str,
    context: dict[str, Any] | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    """Render template ``name`` with the caller, a CSRF token and ``context``."""
    portal = get_portal(request)
    try:
        who = caller(request, portal)
        binding = csrf_binding(request, portal)
    except Exception:  # an error page must render even when the database is down
        who, binding = None, None
    new_anon = None
    if binding is None:
        new_anon = secrets.token_urlsafe(24)
        binding = new_anon
    ctx: dict[str, Any] = {
        "user": who,
        "csrf_token": portal.signer.csrf_token(binding),
        "verifier_key": None,
    }
    ctx.update(context or {})
    response = portal.templates.TemplateResponse(request, name, ctx, status_code=status_code)
    if new_anon is not None:
        response.set_cookie(
            ANON_COOKIE,
            portal.signer.sign_anon(new_anon),
            max_age=24 * 3600,
            httponly=True,
            samesite="lax",
            secure=secure_cookies(request, portal.settings.secure_cookies),
        )
    response.headers["Cache-Control"] = "no-store"
    return response


def fragment(request: Request, name: str, context: dict[str, Any]) -> Markup:
    """Template ``name`` rendered alone (no page around it, nothing about the caller).

    What the pages region of :mod:`web.cache` keeps: such a fragment must depend only on
    what its cache key names, never on who is logged in.
    """
    html = get_portal(request).templates.get_template(name).render(context)
    return Markup(html)  # noqa: S704 (rendered by the autoescaping environment)
