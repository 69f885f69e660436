"""The ledger's tenant-scoped contract reads (the portal's lists and visibility checks):
a scope sees its own customer's contracts, staff see every one, and a scope bound to no
customer sees none -- never all of them."""

from __future__ import annotations

from ledger.contracts import (
    TenantScope,
    add_contracts,
    contract_ids_of,
    contract_page,
    customer_has_contracts,
    existing_contract_ids,
    visible_contracts,
    visible_log_size,
)
from ledger.journal import log_size, log_sizes
from ledger.records import parse_contracts
from tests import factories as f
from yoco.database import unit_of_work

ACME = TenantScope(customer="acme")
STAFF = TenantScope(everyone=True)
NOBODY = TenantScope()


def _contracts(engine) -> None:
    specs, errors = parse_contracts(
        f.jsonl([
            f.contract("A-1", customer="acme"),
            f.contract("A-2", customer="acme"),
            f.contract("B-1", customer="bolt"),
        ])
    )
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)


def test_a_scope_reads_its_customers_contracts_and_staff_read_all(engine) -> None:
    _contracts(engine)
    with unit_of_work(engine) as s:
        assert [c.contract_id for c in visible_contracts(s, ACME)] == ["A-1", "A-2"]
        assert [c.contract_id for c in visible_contracts(s, STAFF)] == ["A-1", "A-2", "B-1"]
        assert visible_contracts(s, NOBODY) == []

        size = log_size(s, "A-1")
        assert size == 1  # the contract entry opens its log
        assert contract_page(s, ACME, None, 10) == [("A-1", 1), ("A-2", 1)]
        assert contract_page(s, ACME, "A-1", 10) == [("A-2", 1)]
        assert contract_page(s, STAFF, "A-1", 1) == [("A-2", 1)]
        assert contract_page(s, NOBODY, None, 10) == []

        assert visible_log_size(s, ACME, "A-1") == size
        # another customer's contract answers as one that does not exist
        assert visible_log_size(s, ACME, "B-1") is None
        assert visible_log_size(s, ACME, "nope") is None
        assert visible_log_size(s, NOBODY, "A-1") is None
        assert visible_log_size(s, STAFF, "B-1") == 1

        assert log_sizes(s) == {"A-1": 1, "A-2": 1, "B-1": 1}
        assert customer_has_contracts(s, "bolt") and not customer_has_contracts(s, "zeta")
        assert contract_ids_of(s, "acme") == ["A-1", "A-2"]
        assert existing_contract_ids(s, ["A-2", "B-1", "nope"]) == {"A-2", "B-1"}
