"""SQL the migrations share: append-only triggers and the application role's grants."""

from __future__ import annotations

from alembic import op

APP_ROLE = "yoco_app"
#: The role that owns the schema, runs the migrations and is the rebuild path.
OWNER_ROLE = "yoco_owner"

REFUSE_FUNCTION = """
CREATE OR REPLACE FUNCTION yoco_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'yoco: % on % is refused: the ledger is append-only; '
        'corrections are new entries that name the old', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def create_app_role() -> None:
    """Create the ``yoco_app`` role (once per server) and let the migrating user SET ROLE to it."""
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                CREATE ROLE {APP_ROLE} NOLOGIN;
            END IF;
            BEGIN
                EXECUTE 'GRANT {APP_ROLE} TO ' || quote_ident(current_user);
            EXCEPTION WHEN OTHERS THEN
                RAISE NOTICE 'could not grant {APP_ROLE} to %: %', current_user, SQLERRM;
            END;
        END
        $$
        """
    )
    op.execute(f"GRANT USAGE ON SCHEMA public TO {APP_ROLE}")
    op.execute(REFUSE_FUNCTION)


def make_append_only(table: str) -> None:
    """Refuse UPDATE, DELETE and TRUNCATE on ``table`` (ALWAYS: replicas roles cannot skip it)."""
    op.execute(
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION yoco_refuse_change()"
    )
    op.execute(
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION yoco_refuse_change()"
    )
    op.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_append_only")
    op.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_no_truncate")
    op.execute(f"GRANT SELECT, INSERT ON {table} TO {APP_ROLE}")


def grant_read_write(*tables: str) -> None:
    """Let the application role read and change projection ``tables``."""
    for table in tables:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}")


def grant_sequences(*sequences: str) -> None:
    """Let the application role draw from ``sequences`` (serial primary keys)."""
    for seq in sequences:
        op.execute(f"GRANT USAGE, SELECT ON SEQUENCE {seq} TO {APP_ROLE}")


def revoke_all(*tables: str) -> None:
    """Take the application role's rights on ``tables`` back (for downgrades)."""
    for table in tables:
        op.execute(f"REVOKE ALL ON {table} FROM {APP_ROLE}")


def create_entry_json_function() -> None:
    """``yoco_entry_json(bytea)``: an entry's canonical UTF-8 bytes as jsonb.

    The journal's queryable ``body`` is a column GENERATED from the hashed bytes by
    this function, so it can never say something the bytes do not.  ``convert_from``
    is only STABLE (it depends on the database encoding), so the wrapper is declared
    IMMUTABLE after checking that the encoding is UTF8, where the conversion is fixed.
    """
    op.execute(
        """
        DO $$
        BEGIN
            IF current_setting('server_encoding') <> 'UTF8' THEN
                RAISE EXCEPTION 'yoco needs a UTF8 database (this one is %)',
                    current_setting('server_encoding');
            END IF;
        END
        $$
        """
    )
    op.execute(
        "CREATE OR REPLACE FUNCTION yoco_entry_json(data bytea) RETURNS jsonb "
        "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE "
        "AS $$ SELECT convert_from(data, 'UTF8')::jsonb $$"
    )


def set_alert_kinds(kinds: tuple[str, ...]) -> None:
    """Make ``kinds`` the alert event kinds the check constraints of ``alert_events.kind``
    and ``alert_destinations.event_kinds`` allow (a migration that adds a kind, and its
    downgrade, which is refused while events of a removed kind are stored)."""
    listed = ", ".join(repr(k) for k in kinds)
    op.drop_constraint(op.f("ck_alert_events_kind_known"), "alert_events", type_="check")
    op.create_check_constraint(
        op.f("ck_alert_events_kind_known"), "alert_events", f"kind IN ({listed})"
    )
    op.drop_constraint(
        op.f("ck_alert_destinations_event_kinds_known"), "alert_destinations", type_="check"
    )
    op.create_check_constraint(
        op.f("ck_alert_destinations_event_kinds_known"), "alert_destinations",
        f"event_kinds <@ ARRAY[{listed}]::text[]",
    )
