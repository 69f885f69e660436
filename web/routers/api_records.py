"""``POST /api/v1/records``: runtimes append ingestion records, exactly as ``yoco ledger ingest``.

The body is a JSON array of records (DESIGN section 4).  The batch goes through the one
ingest path of the command line and the runtime's sink (:func:`ledger.ingest.ingest_batch`,
with the same projectors), is all or nothing, and is idempotent by ``event_id``.
Refusals are 422 with each record's ``index`` and ``field``; records for a contract the
token is not scoped to are 403, naming their index.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ledger import ingest as ingestion
from ledger.canonical import JsonInputError, parse_json_strict
from ledger.errors import IngestRefused
from ledger.records import OrderKey, RecordError
from web.deps import PortalDep, WriterDep
from web.schemas import ERRORS, ErrorBody, IngestOut, IngestRefusedBody

router = APIRouter(prefix="/api/v1", tags=["ingestion"])
log = logging.getLogger("yoco.web.ingest")

_RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["kind", "event_id", "contract_id", "occurred_at"],
    "properties": {
        "kind": {
            "type": "string",
            "enum": [
                "job_started",
                "job_progress",
                "job_finished",
                "failure",
                "outcome",
                "exclusion",
            ],
        },
        "event_id": {"type": "string", "format": "uuid"},
        "contract_id": {"type": "string"},
        "occurred_at": {"type": "string", "format": "date-time"},
    },
    "additionalProperties": True,
}


def _refused(status: int, detail: str, errors: list[RecordError]) -> JSONResponse:
    # The refusal of a reused event id names no log (ledger.ingest.event_id_taken), so
    # the messages go out as they are.
    return JSONResponse(
        {"detail": detail, "errors": [e.to_dict() for e in errors]}, status_code=status
    )


class _OutsideScope(Exception):
    """Records for contracts the token may not write to (403, nothing written)."""

    def __init__(self, errors: list[RecordError]) -> None:
        super().__init__(f"{len(errors)} record(s) outside the token's contracts")
        self.errors = errors


async def read_limited(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it is known to exceed ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before reading anything; a
    chunked body (no length) is read as it streams and dropped at the first chunk that
    goes past the limit, so a client cannot make the server buffer more than ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


@router.post(
    "/records",
    response_model=IngestOut,
    responses={
        401: ERRORS[401],
        403: {"model": IngestRefusedBody, "description": "A record names a contract the "
              "token may not write to (nothing was written)."},
        413: {"model": ErrorBody, "description": "The batch is too large."},
        422: {"model": IngestRefusedBody, "description": "Refused records, by index and "
              "field (nothing was written)."},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"type": "array", "items": _RECORD_SCHEMA, "maxItems": 10000}
                }
            },
        }
    },
)
async def post_records(request: Request, writer: WriterDep, portal: PortalDep) -> Any:
    """Append a batch of ingestion records: idempotent by event_id, all or nothing.

    A record already stored with the same content is counted in ``duplicates``; the
    same event_id with different content is refused.
    """
    limit = portal.settings.max_batch_bytes
    body = await read_limited(request, limit)
    if body is None:
        return JSONResponse(
            {"detail": f"the batch exceeds {limit} bytes; nothing written"},
            status_code=413,
            headers={"Connection": "close"},
        )
    try:
        objs = parse_json_strict(body)
    except JsonInputError as exc:
        path = exc.path or ""
        # Where the text stops being JSON, say where (line and column of the body).
        message = exc.message if exc.path is not None else str(exc)
        return _refused(
            422,
            "the body is not strict JSON; nothing written",
            [RecordError(message, field=path.removeprefix("$"))],
        )
    if not isinstance(objs, list):
        return _refused(
            422,
            "the body must be a JSON array of records; nothing written",
            [RecordError("expected a JSON array of records", field="")],
        )
    if len(objs) > portal.settings.max_batch_records:
        return JSONResponse(
            {"detail": f"at most {portal.settings.max_batch_records} records per batch"},
            status_code=413,
        )
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(_ingest, objs, writer.contract_ids, portal)


def _ingest(objs: list[Any], allowed: frozenset[str], portal: Any) -> Any:
    def in_scope(keys: Sequence[OrderKey]) -> None:
        foreign = [
            RecordError(
                f"this token may not write records for contract {k.contract_id!r}",
                field="contract_id",
                index=k.index,
            )
            for k in keys
            if k.contract_id not in allowed
        ]
        if foreign:
            raise _OutsideScope(foreign)

    try:
        result = ingestion.ingest_batch(
            portal.db.write,
            ingestion.RecordBatch(objs),
            portal.projectors,
            before_write=in_scope,
        )
    except _OutsideScope as exc:
        return _refused(403, f"{len(exc.errors)} record(s) outside this token's contracts; "
                        "nothing written", exc.errors)
    except IngestRefused as exc:
        _alert(portal, objs, exc.errors, allowed)
        return _refused(422, f"{len(exc.errors)} error(s); nothing written", exc.errors)
    return IngestOut(
        appended=result.appended, duplicates=result.duplicates, by_kind=dict(result.by_kind)
    )


def _alert(portal: Any, objs: list[Any], errors: list[RecordError],
           allowed: frozenset[str]) -> None:
    """Raise the ``record_refused`` alert (docs/alerts.md) in a transaction of its own.

    Tenant-safe: a refused record is attributed to its contract only when the token may
    write to it, so a customer's destination never hears of another token's records.
    Never fails the request: the refusal must reach the sender.
    """
    from alerts.refusals import raise_refusal, refusal_event

    try:
        event = refusal_event(objs, errors, source="API", scope=allowed)
        with portal.db.write() as session:
            raise_refusal(session, event)  # under the flood limit (docs/alerts.md)
    except Exception:
        log.exception("could not store the record_refused alert (the refusal stands)")

