"""A record sink that posts to the portal's ingestion API with an ingest token.

A training job on another cluster should not hold a database login: ``yoco tokens create
--name NAME --contract ID`` makes an *ingest token* that may only append records for its
contracts, and this sink delivers an outbox's batches to ``POST /api/v1/records`` with it
-- the same validate → ingest path as ``yoco ledger ingest`` and the ledger's own sink,
idempotent by ``event_id``. Use it from an adapter::

    YOCO_SINK=adapters.api_sink:ApiSink
    YOCO_SINK_ARGS='{"url": "https://yoco.example"}'
    YOCO_INGEST_TOKEN=yoco_...            # a secret: not in YOCO_SINK_ARGS

What the API answers decides what the outbox does (:mod:`runtime.outbox`):

* 200: acknowledged (new records and duplicates alike);
* 422 (a record refused, naming its index and field), 403 (a record for a contract the
  token may not write) and 413 (the batch too large): :class:`RecordRefused`, permanent:
  the outbox narrows the batch to single records and dead-letters those refused;
* anything else -- 401 (a revoked or mistyped token: fixed by an operator, then the
  records flow), 429, 5xx, a connection or a timeout error: an outage, retried with
  backoff until the API takes the batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from runtime.errors import ConfigError, RecordRefused, SinkError

#: The variable the token is read from when ``token`` is not given.
ENV_TOKEN = "YOCO_INGEST_TOKEN"  # noqa: S105 (the name of a variable, not a secret)
_PERMANENT = frozenset({403, 413, 422})


class ApiSink:
    """Delivers record batches to ``{url}/api/v1/records`` (a :class:`~runtime.sink.RecordSink`)."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 client: httpx.Client | None = None) -> None:
        token = token or os.environ.get(ENV_TOKEN)
        if not token:
            raise ConfigError(f"the API sink needs an ingest token: set {ENV_TOKEN} "
                              "(yoco tokens create --name NAME --contract ID)")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the API sink's url must start with http:// or https://, "
                              f"got {url!r}")
        self.endpoint = url.rstrip("/") + "/api/v1/records"
        self._headers = {"Authorization": f"Bearer {token}",
                         "Content-Type": "application/json"}
        self._client = client or httpx.Client(timeout=timeout_s)
        self.delivered = 0
        self.duplicates = 0

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Post ``records`` as one batch; return once the API has committed them."""
        body = json.dumps([dict(r) for r in records], separators=(",", ":"))
        try:
            resp = self._client.post(self.endpoint, content=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise SinkError(f"{self.endpoint} unreachable: {type(exc).__name__}: {exc}"
                            ) from exc
        if resp.status_code == 200:
            answer = _json(resp)
            self.delivered += int(answer.get("appended", 0))
            self.duplicates += int(answer.get("duplicates", 0))
            return
        detail = _describe(resp)
        if resp.status_code in _PERMANENT:
            raise RecordRefused(f"HTTP {resp.status_code}: {detail}")
        raise SinkError(f"HTTP {resp.status_code} from {self.endpoint}: {detail}")

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _describe(resp: httpx.Response) -> str:
    """The API's refusal in one line: its detail and each error's index, field, message."""
    data = _json(resp)
    if not data:
        return resp.text[:500] or resp.reason_phrase
    parts = [str(data.get("detail", ""))]
    for e in data.get("errors") or []:
        if isinstance(e, dict):
            parts.append(f"[{e.get('index')}].{e.get('field')}: {e.get('message')}")
    return "; ".join(p for p in parts if p)[:2000]
