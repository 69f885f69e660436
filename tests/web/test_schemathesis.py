"""schemathesis against the app's own OpenAPI schema: no 5xx, no schema violations.

Every operation gets generated requests (a few dozen each, so the run stays near a
minute), authenticated as customer B's read token (ingest: A's runtime token).  The
operations are driven by hand with Hypothesis: schemathesis' pytest plugin does not
load under pytest 9.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

EXAMPLES = 25


def test_api_conforms_to_its_schema(app, seed) -> None:
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", app)
    tokens = {"read": seed.read_token_b, "ingest": seed.token}
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()
        ingest = operation.path == "/api/v1/records"
        token = tokens["ingest"] if ingest else tokens["read"]
        # A schema-valid batch may still be refused (422) for what only the ledger knows
        # (an unknown contract, an outcome of an unknown failure): no "positive data
        # acceptance" there.  Every other check applies everywhere.
        excluded = [positive_data_acceptance] if ingest else []
        _run(operation, {"Authorization": f"Bearer {token}"}, excluded)
        tested.append(operation.path)
    assert "/api/v1/records" in tested and len(tested) >= 10


def _run(operation, headers, excluded) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case) -> None:
        # A pagination cursor is valid only as the server signed it: any other string,
        # schema-valid or not, is refused with 400 by design (tests/web/test_api_machines.py
        # covers cursors).  Every other parameter keeps every check.
        if case.query and "cursor" in case.query:
            case.query.pop("cursor")
        case.call_and_validate(headers=headers, excluded_checks=excluded)

    check()
