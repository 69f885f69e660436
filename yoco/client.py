"""A small typed client of the yoco portal's JSON API (``/api/v1``), for scripts and
``yoco --server URL …`` (the CLI's remote mode).

::

    from yoco.client import Client

    with Client("https://sla.vendor.example", token="yoco_…") as api:
        for c in api.contracts():
            sla = api.sla(c.contract_id, year=1)
            print(c.contract_id, sla.resolution_rate, sla.guarantee_met)
        for f in api.failures("C-1", status="rolled_back"):
            print(f.event_id, f.lost_gpu_hours)

Lists are followed page by page (the ``Link: <…>; rel="next"`` header / the ``next``
field), so a list method returns every item.  Answers are revalidated with the ETag the
server sent (``If-None-Match``): a repeated request costs the server no figure
computation and brings back no body when nothing changed (an in-memory copy per
address, for the client's lifetime; the server says ``private, no-cache``).

Errors raise :class:`ApiError` subclasses carrying the HTTP status and the server's
message: :class:`NotFoundError` (404: unknown, or another customer's), :class:`AuthError`
(401/403), :class:`RequestRefused` (400/409/422), :class:`ServerError` (5xx), and
:class:`ConnectionFailed` when the server cannot be reached.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import httpx

__all__ = [
    "ApiError",
    "AuthError",
    "Checkpoint",
    "Client",
    "ConnectionFailed",
    "Contract",
    "Failure",
    "NotFoundError",
    "RequestRefused",
    "ServerError",
    "SlaFigures",
]

T = TypeVar("T")


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """The server refused or failed a request: ``status`` and its ``detail`` message."""

    def __init__(self, status: int, detail: str, url: str = "") -> None:
        where = f" from {url}" if url else ""
        # status 0: nothing answered, so there is no HTTP status to quote
        super().__init__(f"{detail} (HTTP {status}{where})" if status else detail)
        self.status = status
        self.detail = detail
        self.url = url


class NotFoundError(ApiError):
    """404: nothing there for this caller (unknown, or another customer's)."""


class AuthError(ApiError):
    """401 (no valid token or session) or 403 (the token may not do this)."""


class RequestRefused(ApiError):
    """400, 409 or 422: the request itself was refused (a bad cursor, a parameter…)."""


class ServerError(ApiError):
    """5xx: the server failed."""


class ConnectionFailed(ApiError):
    """The server could not be reached (status 0)."""

    def __init__(self, detail: str, url: str = "") -> None:
        super().__init__(0, detail, url)


def _error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        detail = body.get("detail") if isinstance(body, dict) else None
    except ValueError:
        detail = None
    if not isinstance(detail, str):
        detail = str(detail) if detail else response.reason_phrase or "error"
    status = response.status_code
    if status == 401 and "authorization" in response.request.headers:
        # the server's generic 401 asks for a token; this caller sent one
        detail = ("the server did not accept this token (unknown, revoked or mistyped): "
                  "check YOCO_TOKEN or --token")
    cls: type[ApiError]
    if status == 404:
        cls = NotFoundError
    elif status in (401, 403):
        cls = AuthError
    elif status >= 500:
        cls = ServerError
    else:
        cls = RequestRefused
    return cls(status, detail, str(response.request.url))


# --------------------------------------------------------------------------- models


def _dt(value: str) -> datetime:
    return datetime.fromisoformat(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contract:
    """A contract and its guarantee terms (money as decimal strings)."""

    contract_id: str
    customer: str
    start_date: str
    timezone: str
    term_years: int
    currency: str
    annual_value: str
    renewal_value: str | None
    gpu_hour_price: str | None
    terms: dict[str, Any]
    current_year: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Contract:
        """From the API's object."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True, kw_only=True)
class SlaFigures:
    """The figures of a contract year or month: ``yoco sla --json``'s object.

    The fields below are typed; ``data`` is the whole object as the server sent it
    (what ``yoco --server … sla --json`` prints).
    """

    contract_id: str
    year: int | None
    month: str | None
    period_start: datetime
    period_end: datetime
    covered_failures: int
    resolved_failures: int
    excluded_failures: int
    pending_failures: int
    resolution_rate: str | None
    guarantee_met: bool
    standing: str
    allocated_gpu_hours: str
    lost_gpu_hours: str
    goodput: str
    computed_at: datetime
    credit: dict[str, Any] | None
    #: (``whole_object``: no field of the API's object; tests/web/test_client_schema.py)
    data: dict[str, Any] = field(repr=False, compare=False, metadata={"whole_object": True})

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SlaFigures:
        """From the API's object."""
        return cls(
            contract_id=d["contract_id"], year=d["year"], month=d["month"],
            period_start=_dt(d["period_start"]), period_end=_dt(d["period_end"]),
            covered_failures=d["covered_failures"], resolved_failures=d["resolved_failures"],
            excluded_failures=d["excluded_failures"], pending_failures=d["pending_failures"],
            resolution_rate=d["resolution_rate"], guarantee_met=d["guarantee_met"],
            standing=d["standing"], allocated_gpu_hours=d["allocated_gpu_hours"],
            lost_gpu_hours=d["lost_gpu_hours"], goodput=d["goodput"],
            computed_at=_dt(d["computed_at"]), credit=d["credit"], data=d,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A failure of the list, with its status and latest outcome."""

    event_id: str
    occurred_at: datetime
    month: str
    job_id: str
    failure_class: str
    cause: str
    status: str
    excluded_by: str | None
    reason: str | None
    outcome: str | None
    lost_steps: int | None
    recovery_seconds: str | None
    lost_gpu_hours: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Failure:
        """From the API's object."""
        values = {k: d[k] for k in cls.__dataclass_fields__}
        values["occurred_at"] = _dt(d["occurred_at"])
        return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A signed tree head of a contract's log."""

    tree_size: int
    root_hash: str
    origin: str
    signed_at: datetime
    note: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Checkpoint:
        """From the API's object."""
        return cls(tree_size=d["tree_size"], root_hash=d["root_hash"], origin=d["origin"],
                   signed_at=_dt(d["signed_at"]), note=d["note"])


# --------------------------------------------------------------------------- client

_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


class Client:
    """The API of one yoco server, as one caller (a bearer ``token``, or none)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        cache_entries: int = 256,
    ) -> None:
        if not re.match(r"^https?://", base_url):
            raise ValueError(f"the server address must start with http:// or https://, "
                             f"got {base_url!r}")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                  transport=transport)
        self._copies: OrderedDict[str, tuple[str, httpx.Response]] = OrderedDict()
        self._cache_entries = cache_entries
        #: Answers that came back 304 (served from the copy); for tests and curiosity.
        self.revalidated = 0

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # ---- transport

    def _get(self, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
        """GET ``path``; a 304 gives back the copy kept for its address; errors raise."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        # params=None keeps a query already in ``path`` (a next link); {} would drop it
        request = self._http.build_request("GET", path, params=query or None)
        key = str(request.url)
        copy = self._copies.get(key)
        if copy is not None:
            request.headers["If-None-Match"] = copy[0]
        try:
            response = self._http.send(request)
        except httpx.HTTPError as exc:
            raise ConnectionFailed(
                f"cannot reach the yoco server at {self.base_url}: {exc}", key
            ) from None
        if response.status_code == 304 and copy is not None:
            self.revalidated += 1
            self._copies.move_to_end(key)
            return copy[1]
        if response.status_code >= 400:
            raise _error(response)
        etag = response.headers.get("etag")
        if etag and self._cache_entries > 0:
            response.read()
            self._copies[key] = (etag, response)
            self._copies.move_to_end(key)
            while len(self._copies) > self._cache_entries:
                self._copies.popitem(last=False)
        return response

    def _json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self._get(path, params).json()

    def _pages(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Any]:
        """Every item of a list, following ``next`` links."""
        target: str | None = path
        query = params
        while target:
            response = self._get(target, query)
            body = response.json()
            items = body["items"] if isinstance(body, dict) else body
            yield from items
            link = _NEXT.search(response.headers.get("link", ""))
            target, query = (link.group(1), None) if link else (None, None)

    # ---- the API

    def contracts(self) -> list[Contract]:
        """Every contract the caller may see, by id."""
        return [Contract.from_json(d) for d in self._pages("/api/v1/contracts")]

    def contract(self, contract_id: str) -> Contract:
        """One contract and its terms."""
        return Contract.from_json(self._json(f"/api/v1/contracts/{_seg(contract_id)}"))

    def sla(
        self, contract_id: str, *, year: int | None = None, month: str | None = None
    ) -> SlaFigures:
        """The figures of contract year ``year`` (default: the current one) or of
        ``month`` (``YYYY-MM``): the same object as ``yoco sla --json``."""
        return SlaFigures.from_json(self._json(
            f"/api/v1/contracts/{_seg(contract_id)}/sla", {"year": year, "month": month}
        ))

    def year(self, contract_id: str, year: int) -> dict[str, Any]:
        """A contract year's figures and its months."""
        data: dict[str, Any] = self._json(f"/api/v1/contracts/{_seg(contract_id)}/years/{year}")
        return data

    def failures(
        self,
        contract_id: str,
        *,
        year: int | None = None,
        month: str | None = None,
        failure_class: str | None = None,
        cause: str | None = None,
        status: str | None = None,
        per_page: int = 200,
    ) -> Iterator[Failure]:
        """Every failure of a contract year (default: the current one) that passes the
        filters, newest first, fetched page by page as the iterator is consumed."""
        params = {"year": year, "month": month, "failure_class": failure_class,
                  "cause": cause, "status": status, "per_page": per_page}
        for d in self._pages(f"/api/v1/contracts/{_seg(contract_id)}/failures", params):
            yield Failure.from_json(d)

    def failure(self, contract_id: str, event_id: str) -> dict[str, Any]:
        """One failure with its outcomes, corrections, exclusions and disputes."""
        data: dict[str, Any] = self._json(
            f"/api/v1/contracts/{_seg(contract_id)}/failures/{_seg(event_id)}"
        )
        return data

    def checkpoints(self, contract_id: str) -> list[Checkpoint]:
        """Every signed tree head of the contract's log, newest first."""
        return [Checkpoint.from_json(d)
                for d in self._pages(f"/api/v1/contracts/{_seg(contract_id)}/checkpoints")]

    def credits(self, contract_id: str) -> list[dict[str, Any]]:
        """The contract's renewal credits, newest first."""
        return list(self._pages(f"/api/v1/contracts/{_seg(contract_id)}/credits"))

    def proof(self, contract_id: str, event_id: str) -> dict[str, Any]:
        """The inclusion proof of an entry (check it with ``yoco verify-proof``)."""
        data: dict[str, Any] = self._json(
            f"/api/v1/contracts/{_seg(contract_id)}/entries/{_seg(event_id)}/proof"
        )
        return data

    def public_key(self) -> str:
        """The checkpoint signer's verifier key."""
        return self._get("/api/v1/public-key").text.strip()


def _seg(value: str) -> str:
    """``value`` as one path segment (escaped)."""
    from urllib.parse import quote

    return quote(value, safe="")
