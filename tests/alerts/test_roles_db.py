"""The alerts' tables and the database roles: exactly what the alerts need, nothing more."""

from __future__ import annotations

import importlib

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from alerts.models import ALERT_TABLES
from tests.test_roles_db import _refused, engines  # noqa: F401  (fixture)

_m = importlib.import_module("migrations.versions.0017_alerts")
_m27 = importlib.import_module("migrations.versions.0027_customer_email_alerts")
#: What 0017 granted, and the column 0027 added (a customer's removed recipient).
UPDATABLE: dict[str, tuple[str, ...]] = {
    table: (*_m.UPDATABLE.get(table, ()), *_m27.UPDATABLE.get(table, ()))
    for table in {*_m.UPDATABLE, *_m27.UPDATABLE}
}


def test_the_application_role_has_exactly_the_alerts_privileges(owner_engine) -> None:
    with owner_engine.connect() as c:
        for table in ALERT_TABLES:
            privs = {
                p: c.execute(text("SELECT has_table_privilege('yoco_app', :t, :p)"),
                             {"t": table, "p": p}).scalar_one()
                for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES",
                          "TRIGGER")
            }
            assert privs == {"SELECT": True, "INSERT": True, "UPDATE": False, "DELETE": False,
                             "TRUNCATE": False, "REFERENCES": False, "TRIGGER": False}, table
            columns = list(c.execute(text(
                "SELECT column_name FROM information_schema.columns WHERE table_name = :t"),
                {"t": table}).scalars())
            updatable = {
                col for col in columns
                if c.execute(text("SELECT has_column_privilege('yoco_app', :t, :c, 'UPDATE')"),
                             {"t": table, "c": col}).scalar_one()
            }
            assert updatable == set(UPDATABLE.get(table, ())), table
            # The tenant role reads none of them (the operator page reads as yoco_app).
            assert not c.execute(text("SELECT has_table_privilege('yoco_portal', :t, 'SELECT')"),
                                 {"t": table}).scalar_one(), table


@pytest.mark.parametrize("table", ALERT_TABLES)
def test_no_process_role_may_delete_truncate_or_rewrite_alerts(
        engines: dict[str, Engine], table: str) -> None:  # noqa: F811
    key_column = {"alert_destinations": "url", "alert_events": "key",
                  "alert_deliveries": "event_id", "alert_attempts": "ok",
                  "alert_year_standings": "contract_id",
                  "alert_replays": "requested_by",
                  "alert_destination_changes": "changed_by"}[table]
    allowed = []
    for who, engine in engines.items():
        for sql in (
            f"UPDATE {table} SET {key_column} = {key_column}",
            f"DELETE FROM {table}",
            f"TRUNCATE {table} CASCADE",
        ):
            if not _refused(engine, sql):
                allowed.append((who, sql))
    assert allowed == []


def test_the_portal_role_cannot_read_alerts(engines: dict[str, Engine]) -> None:  # noqa: F811
    for table in ALERT_TABLES:
        assert _refused(engines["yoco_portal as yoco_web"], f"SELECT * FROM {table}")
