"""Tables of the portal: users, API tokens, login sessions, login limits.

None of them is readable by the portal's database role (``yoco_portal``): they are
read and written through the application role, before a request knows its tenant.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from ledger.models import Base

ROLES = ("customer", "operator", "finance")


class PortalUser(Base):
    """A person who logs in: a customer's user (one customer), an operator or finance."""

    __tablename__ = "portal_users"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    email: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    role: Mapped[str] = mapped_column(Text, nullable=False)
    customer: Mapped[str | None] = mapped_column(Text)
    password_hash: Mapped[str] = mapped_column(Text, nullable=False)
    disabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    #: A customer user who manages their own customer's API tokens in the portal.
    customer_admin: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default="false"
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (
        CheckConstraint("role IN ('customer', 'operator', 'finance')", name="role_known"),
        CheckConstraint(
            "(role = 'customer') = (customer IS NOT NULL)", name="customer_iff_customer_role"
        ),
        CheckConstraint("email = lower(email)", name="email_lower"),
        CheckConstraint("NOT customer_admin OR role = 'customer'",
                        name="customer_admin_is_customer"),
    )


class PortalSession(Base):
    """A login session; the cookie holds the signed token, the table only its SHA-256."""

    __tablename__ = "portal_sessions"

    token_hash: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    user_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("portal_users.id", ondelete="CASCADE"), nullable=False
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index(None, "user_id"),)


class ApiToken(Base):
    """A bearer token: may post records for ``contract_ids`` and/or read ``customer``'s data.

    Only the SHA-256 of the token is stored (tokens are 256-bit random, so a fast hash
    is enough); ``prefix`` is the public part used to find the row.
    """

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    prefix: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    secret_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    customer: Mapped[str | None] = mapped_column(Text)
    contract_ids: Mapped[list[str]] = mapped_column(
        ARRAY(Text), nullable=False, server_default="{}"
    )
    #: What else it may do: ``metrics`` (scrape ``/metrics``, see docs/metrics.md).
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        CheckConstraint(
            "customer IS NOT NULL OR cardinality(contract_ids) > 0 OR cardinality(scopes) > 0",
            name="has_scope",
        ),
        CheckConstraint("scopes <@ ARRAY['metrics']::text[]", name="scopes_known"),
    )


class LoginLimit(Base):
    """Failed logins counted under one key: an account at a client (``pair:…``), a client
    address (``addr:…``) or an account from anywhere (``acct:…``).

    ``failures`` counts attempts since the key was last quiet for a whole window (an
    attempt is counted *before* its password is checked, then uncounted if it was
    right, so concurrent attempts cannot all slip under the limit); once ``failures``
    reaches the key's limit, the key is blocked until ``blocked_until``, a delay that
    doubles with every further failure (capped at the window).
    """

    __tablename__ = "login_limits"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, nullable=False)
    last_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    blocked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index(None, "last_at"),)


WEB_TABLES = ("portal_users", "portal_sessions", "api_tokens", "login_limits")
