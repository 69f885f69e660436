"""One router per resource; :data:`ROUTERS` is what :func:`web.app.create_app` mounts."""

from __future__ import annotations

from fastapi import APIRouter

from web.routers import (
    account,
    alerts,
    api_checkpoints,
    api_contracts,
    api_docs,
    api_failures,
    api_records,
    api_reports,
    auditlog,
    auth,
    checkpoints,
    contracts,
    credits,
    failures,
    finance,
    metrics,
    operator,
    reports,
    risk,
)

ROUTERS: tuple[APIRouter, ...] = (
    auth.router,
    contracts.router,
    failures.router,
    reports.router,
    credits.router,
    checkpoints.router,
    operator.router,
    risk.router,
    alerts.router,
    finance.router,
    api_docs.router,
    api_contracts.router,
    api_failures.router,
    api_checkpoints.router,
    api_records.router,
    api_reports.router,
    auditlog.router,
    metrics.router,
    account.router,
)
