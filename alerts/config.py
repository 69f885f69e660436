"""The alerts' settings (retry policy, checkpoint age) and the address check (SSRF).

Webhook URLs and SMTP hosts are chosen by an operator, but a URL that reaches the
host's own cloud metadata service (169.254.169.254 and friends) or a link-local address
would let whoever can configure a destination read credentials through the delivery log.
So :func:`check_host` refuses, by default, any host that *resolves* to a link-local,
metadata, unspecified, multicast or reserved address — checked when the destination is
configured and again before every attempt (DNS may change), and the attempt connects to
an address it just checked — the host is resolved once per attempt, the connection goes
to that address, with the name kept for ``Host`` and TLS (SNI and the certificate check)
— so a DNS answer that changes between the check and the connection (rebinding) is not
used. An IPv6 address that carries an IPv4 (6to4, Teredo, NAT64, mapped, …) is judged
by that IPv4 too (:func:`embedded_ipv4`). Loopback and private
(RFC 1918, ULA) addresses are allowed: operators run receivers on their own networks.
``allow_unsafe_address`` (``--allow-unsafe-address``) lifts the check for one
destination. Redirects are never followed (a 3xx is a failed attempt).
"""

from __future__ import annotations

import ipaddress
import socket
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import httpx

from alerts.errors import BadDestination, UnsafeAddress
from yoco_records.backoff import backoff_s

__all__ = [
    "METADATA_ADDRESSES",
    "AlertsConfig",
    "RetryPolicy",
    "check_host",
    "check_webhook_url",
    "embedded_ipv4",
    "retry_policy_of",
    "unsafe_reason",
    "webhook_addresses",
]

#: Cloud metadata endpoints outside the link-local ranges (AWS IPv6, Alibaba).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)

Resolver = Callable[[str], list[str]]


def _resolve(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


#: NAT64 prefixes (RFC 6052 well-known, RFC 8215 local-use) whose addresses carry an IPv4.
_NAT64_WKP = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
#: The IPv4-compatible (::/96, deprecated) and IPv4-translated (::ffff:0:0:0/96) forms.
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
#: ISATAP interface identifiers (RFC 5214): ``0:5efe`` or ``200:5efe``, then the IPv4.
_ISATAP_IIDS = (0x00005EFE, 0x02005EFE)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[tuple[ipaddress.IPv4Address, str]]:
    """Every IPv4 address ``ip`` carries, with the form that carries it: IPv4-mapped,
    IPv4-compatible, IPv4-translated, 6to4 (2002::/16), Teredo (2001::/32: its server
    and its client), NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48, RFC 6052)
    and ISATAP. A relay or translator on the way may deliver to that IPv4, so each is
    checked like an IPv4 address given directly."""
    n = int(ip)
    low32 = ipaddress.IPv4Address(n & 0xFFFFFFFF)
    found: list[tuple[ipaddress.IPv4Address, str]] = []
    if ip.ipv4_mapped is not None:
        found.append((ip.ipv4_mapped, "IPv4-mapped"))
    if ip in _TRANSLATED:
        found.append((low32, "IPv4-translated"))
    if ip in _COMPATIBLE and n > 1:
        found.append((low32, "IPv4-compatible"))
    if ip.sixtofour is not None:
        found.append((ip.sixtofour, "6to4"))
    if ip.teredo is not None:
        server, client = ip.teredo
        found += [(server, "Teredo server"), (client, "Teredo client")]
    if ip in _NAT64_WKP:
        found.append((low32, "NAT64"))
    if ip in _NAT64_LOCAL:
        # RFC 6052, a /48 prefix: bits 48-63 and 72-87 (bits 64-71 are the u octet);
        # a /96 inside it keeps the last 32 bits.
        v4 = ((n >> 64) & 0xFFFF) << 16 | ((n >> 40) & 0xFFFF)
        found += [(ipaddress.IPv4Address(v4), "NAT64"), (low32, "NAT64")]
    if (n >> 32) & 0xFFFFFFFF in _ISATAP_IIDS:
        found.append((low32, "ISATAP"))
    return found


def _reason(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_loopback:
        return None  # ::1 is inside the reserved ::/8 too
    if ip.is_link_local:
        return "link-local"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    return None


def _strict_reason(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    why = _reason(ip)
    if why is not None:
        return why
    if ip.is_loopback:
        return "loopback"
    if not ip.is_global:
        return "not a public address"
    return None


def unsafe_reason(address: str, *, strict: bool = False) -> str | None:
    """Why ``address`` (an IP literal) is unsafe to send to, or None when it is fine.

    ``strict`` (a destination a customer added in the portal, not the operator): only
    public addresses are fine — loopback, private, shared and every other non-global
    range are refused too (a customer must not reach the vendor's own network).
    An IPv6 address carrying an IPv4 (:func:`embedded_ipv4`) is unsafe when that IPv4
    is; the IPv4 is then named."""
    reason = _strict_reason if strict else _reason
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        for v4, form in embedded_ipv4(ip):
            why = reason(v4)
            if why is not None:
                return f"{why}: {v4}, carried in the address ({form})"
        if ip.ipv4_mapped is not None:
            return None  # the IPv4 it maps to decides, as for the IPv4 itself
    return reason(ip)


def check_host(host: str, *, field: str, allow_unsafe: bool = False,
               resolve: Resolver | None = None, strict: bool = False) -> list[str]:
    """Resolve ``host`` and refuse it if any address is unsafe (see the module docstring).

    Returns the addresses. Raises :class:`UnsafeAddress` naming ``field`` and the address,
    or :class:`BadDestination` when the host does not resolve. With ``allow_unsafe`` the
    host is not checked (nor resolved) at all. ``strict``: only public addresses
    (:func:`unsafe_reason`).
    """
    if allow_unsafe:
        return []
    try:
        addresses = [host] if _is_ip(host) else (resolve or _resolve)(host)
    except OSError as exc:
        raise BadDestination(f"{field}: cannot resolve host {host!r} ({exc})") from exc
    for a in addresses:
        why = unsafe_reason(a, strict=strict)
        if why is not None:
            raise UnsafeAddress(
                f"{field}: host {host!r} resolves to {a}, {why}; refused (it could reach the "
                "host's metadata service or link-local devices). Use --allow-unsafe-address "
                "only if you mean it"
            )
    return addresses


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def check_webhook_url(url: str, *, allow_unsafe: bool = False,
                      resolve: Resolver | None = None, strict: bool = False) -> str:
    """Refuse a webhook URL that is malformed, not http(s), carries credentials or points
    at an unsafe address (``strict``: any but a public one); return it unchanged. Errors
    name the field (``url``)."""
    webhook_addresses(url, allow_unsafe=allow_unsafe, resolve=resolve, strict=strict)
    return url


def webhook_addresses(url: str, *, allow_unsafe: bool = False,
                      resolve: Resolver | None = None, strict: bool = False) -> list[str]:
    """The checks of :func:`check_webhook_url`; return the addresses the host resolved
    to, every one of them checked (empty with ``allow_unsafe``: nothing is resolved).
    The sender connects to one of these very addresses (no second lookup)."""
    if not isinstance(url, str) or not url.strip() or url != url.strip():
        raise BadDestination("url: expected an http:// or https:// URL")
    if len(url) > 2000:
        raise BadDestination("url: longer than 2000 characters")
    for i, ch in enumerate(url):
        # A control (DEL, CR, LF, TAB …), a format character (bidi, zero-width) or any
        # space cannot be sent in a request line; refused here rather than at each send.
        if unicodedata.category(ch)[0] in "CZ":
            raise BadDestination(f"url: character {i + 1} is U+{ord(ch):04X} "
                                 f"({unicodedata.name(ch, 'a control character')}); a URL "
                                 "has no control, format or space characters")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise BadDestination(f"url: not a valid URL ({exc})") from exc
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise BadDestination(f"url: the scheme must be http or https, got {parts.scheme!r}")
    if parts.username is not None or parts.password is not None:
        raise BadDestination("url: credentials in the URL are refused (they would show in "
                             "logs); the shared secret authenticates yoco to the receiver")
    if parts.fragment:
        raise BadDestination("url: a fragment (#…) is never sent; remove it")
    host = parts.hostname
    if not host:
        raise BadDestination("url: no host")
    try:
        _ = parts.port
    except ValueError as exc:
        raise BadDestination(f"url: bad port ({exc})") from exc
    return check_host(host, field="url", allow_unsafe=allow_unsafe, resolve=resolve,
                      strict=strict)


@dataclass(kw_only=True, slots=True)
class RetryPolicy:
    """How a delivery is retried: ``max_attempts`` tries in all, waiting between them by
    the product's backoff rule (:mod:`yoco_records.backoff`: ``base_s`` × 2^(n−1), at
    most ``cap_s``, with jitter over its second half), each try bounded by
    ``timeout_s``."""

    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not 1 <= self.max_attempts <= 20:
            raise ValueError("max_attempts: expected 1 to 20")
        if not 0 < self.base_s <= self.cap_s <= 3600:
            raise ValueError("need 0 < base_s <= cap_s <= 3600 (seconds)")
        if not 0 < self.timeout_s <= 300:
            raise ValueError("timeout_s: expected 0 < t <= 300 seconds")

    def backoff(self, failed: int, jitter: float) -> float:
        """Seconds to wait after the ``failed``-th failed attempt; ``jitter`` in [0, 1)."""
        return backoff_s(failed, base_s=self.base_s, cap_s=self.cap_s, jitter=jitter)


def retry_policy_of(settings: object) -> RetryPolicy:
    """The retry policy of a deployment's settings (``YOCO_ALERTS_MAX_ATTEMPTS``,
    ``…_BACKOFF_S``, ``…_BACKOFF_CAP_S``, ``…_TIMEOUT_S`` as ``yoco.settings.Settings``
    reads them); a setting it lacks keeps :class:`RetryPolicy`'s default.  The one place
    both the command line and the portal (replays) build it."""
    default = RetryPolicy()
    base = float(getattr(settings, "alerts_backoff_s", default.base_s))
    return RetryPolicy(
        max_attempts=int(getattr(settings, "alerts_max_attempts", default.max_attempts)),
        base_s=base,
        cap_s=max(float(getattr(settings, "alerts_backoff_cap_s", default.cap_s)), base),
        timeout_s=float(getattr(settings, "alerts_timeout_s", default.timeout_s)),
    )


@dataclass(kw_only=True, slots=True)
class AlertsConfig:
    """Settings of the detector and the sender (``YOCO_ALERTS_*``, docs/alerts.md)."""

    #: A log with entries not under a signed checkpoint older than this raises an alert.
    checkpoint_max_age: timedelta = timedelta(hours=1)
    retry: RetryPolicy | None = None
    #: Raise a ``report_issued`` event for every issued report (``report`` entry), so the
    #: contract's subscribers (destinations naming the kind) get it by e-mail
    #: (``YOCO_ALERTS_REPORT_EMAILS``; off by default).
    report_emails: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint_max_age <= timedelta(0):
            raise ValueError("checkpoint_max_age: must be positive")
        if self.retry is None:
            self.retry = RetryPolicy()

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy (never None after construction)."""
        return self.retry or RetryPolicy()
