"""Secrets: argon2 password hashes, hashed API tokens, signed cookies and CSRF tokens."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from itsdangerous import BadSignature, URLSafeTimedSerializer

TOKEN_PREFIX = "yoco"  # noqa: S105 (the public prefix of tokens, not a secret)


def password_hasher(*, cheap: bool = False) -> PasswordHasher:
    """The argon2id hasher (RFC 9106 low-memory profile; ``cheap`` only for tests)."""
    if cheap:
        return PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    return PasswordHasher()


def hash_password(hasher: PasswordHasher, password: str) -> str:
    """An argon2id hash (PHC string) of ``password``."""
    return hasher.hash(password)


def verify_password(hasher: PasswordHasher, stored: str | None, password: str) -> bool:
    """True when ``password`` matches ``stored``; costs the same when there is no user."""
    target = stored or _DUMMY.get(hasher)
    try:
        ok = hasher.verify(target, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
    return ok and stored is not None


class _Dummy:
    """A hash of a random password per hasher, verified when the account does not exist."""

    def __init__(self) -> None:
        self._by_params: dict[tuple[int, int, int], str] = {}

    def get(self, hasher: PasswordHasher) -> str:
        key = (hasher.time_cost, hasher.memory_cost, hasher.parallelism)
        if key not in self._by_params:
            self._by_params[key] = hasher.hash(secrets.token_urlsafe(16))
        return self._by_params[key]


_DUMMY = _Dummy()


def sha256(data: str | bytes) -> bytes:
    """SHA-256 of ``data`` (text as UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).digest()


@dataclass(frozen=True, slots=True)
class NewToken:
    """A freshly made API token: the text (shown once), its public prefix and stored hash."""

    text: str
    prefix: str
    secret_hash: bytes


def new_api_token() -> NewToken:
    """A random token ``yoco_<8 hex>_<43 url-safe chars>`` (256 bits of secret)."""
    prefix = f"{TOKEN_PREFIX}_{secrets.token_hex(4)}"
    text = f"{prefix}_{secrets.token_urlsafe(32)}"
    return NewToken(text=text, prefix=prefix, secret_hash=sha256(text))


def token_prefix(text: str) -> str | None:
    """The public prefix of a token's text, or None if it does not look like one."""
    parts = text.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or len(parts[1]) != 8:
        return None
    return f"{parts[0]}_{parts[1]}"


def same_hash(a: bytes, b: bytes) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a, b)


class CookieSigner:
    """Signs and checks cookie values, and derives CSRF tokens bound to a session."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._session = URLSafeTimedSerializer(secret, salt="yoco-session")
        self._anon = URLSafeTimedSerializer(secret, salt="yoco-anon")

    def sign_session(self, token: str) -> str:
        """The cookie value carrying session ``token``."""
        return self._session.dumps(token)

    def session_token(self, cookie: str | None, max_age: float) -> str | None:
        """The session token in a cookie value, or None if unsigned, altered or too old."""
        return _loads(self._session, cookie, max_age)

    def sign_anon(self, ident: str) -> str:
        """The cookie value of an anonymous visitor id (binds the login form's CSRF token)."""
        return self._anon.dumps(ident)

    def anon_ident(self, cookie: str | None) -> str | None:
        """The anonymous visitor id of a cookie value, or None."""
        return _loads(self._anon, cookie, 24 * 3600)

    def csrf_token(self, binding: str) -> str:
        """The CSRF token of a session (or anonymous visitor) ``binding``."""
        mac = hmac.new(self._secret, b"csrf\x00" + binding.encode(), hashlib.sha256)
        return mac.hexdigest()

    def check_csrf(self, binding: str | None, token: str | None) -> bool:
        """True when ``token`` is the CSRF token of ``binding``."""
        if not binding or not token:
            return False
        return hmac.compare_digest(self.csrf_token(binding), token)


def _loads(serializer: URLSafeTimedSerializer, value: str | None, max_age: float) -> str | None:
    if not value:
        return None
    try:
        out = serializer.loads(value, max_age=int(max_age))
    except BadSignature:
        return None
    return out if isinstance(out, str) else None
