"""Errors of the web layer; domain errors become these (and HTTP) only in ``web/``."""

from __future__ import annotations

from typing import Any


class WebError(Exception):
    """An error shown to the caller with ``status`` and a message safe to show."""

    status = 400
    title = "Bad request"

    def __init__(self, message: str = "", *, detail: Any = None) -> None:
        super().__init__(message or self.title)
        self.message = message or self.title
        self.detail = detail


class NotFound(WebError):
    """Nothing here for this caller: unknown, or another tenant's (never told apart)."""

    status = 404
    title = "Not found"

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "There is nothing at this address for your account.")


class LoginRequired(WebError):
    """The caller is not logged in (pages redirect to the login form, the API says 401)."""

    status = 401
    title = "Login required"


class Forbidden(WebError):
    """The caller is known but may not do this."""

    status = 403
    title = "Forbidden"


class CsrfFailed(WebError):
    """A form came without the token of the caller's session."""

    status = 403
    title = "Form expired"

    def __init__(self) -> None:
        super().__init__("This form has expired or did not come from this site. Reload and retry.")


class RateLimited(WebError):
    """Too many failed logins: retry after ``retry_after`` seconds."""

    status = 429
    title = "Too many attempts"

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            f"Too many failed logins. Try again in {max(1, retry_after // 60)} minute(s)."
        )
        self.retry_after = retry_after


class Conflict(WebError):
    """The request is understood but cannot be done in the current state."""

    status = 409
    title = "Not possible now"


class Invalid(WebError):
    """Input that was refused; ``detail`` lists the errors."""

    status = 422
    title = "Refused"
