"""API documentation rendered by the app itself from its OpenAPI schema (no CDN)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from web.render import page

router = APIRouter(include_in_schema=False)


def operations(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The schema's operations in path order, with parameters and response codes."""
    out = []
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            out.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "tags": op.get("tags", []),
                    "parameters": op.get("parameters", []),
                    "responses": sorted(op.get("responses", {}).items()),
                    "body": "requestBody" in op,
                }
            )
    return out


@router.get("/api/docs")
def api_docs(request: Request) -> Response:
    """A readable page of every API operation; the schema is at ``/api/openapi.json``."""
    schema = request.app.openapi()
    return page(
        request,
        "api_docs.html",
        {"schema": schema, "ops": operations(schema), "section": "api"},
    )
