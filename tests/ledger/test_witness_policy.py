"""A contract's witness policy (``terms.witnesses``): one parser, used by the contract's
validation, billing's terms and the verifier; bad input names the field and is refused
whole; k of n counted over one checkpoint note, each key once, forgeries and
cosignatures of another root never."""

from __future__ import annotations

import base64
import os
from datetime import date
from typing import Any

import pytest

from billing.inforce import witness_policy_at
from billing.terms import Terms
from ledger import cosign, note
from ledger.cosign import Cosigner, WitnessPolicy
from ledger.errors import WitnessPolicyError
from ledger.records import contract_from_record, validate_contract
from tests import factories as fx

A = Cosigner.generate("witness.customer.example/w")
B = Cosigner.generate("witness.auditor.example/w")
C = Cosigner.generate("witness.third.example/w")
LOG = note.Signer.generate("yoco.example/ledger")


def _policy(*cosigners: Cosigner, quorum: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"keys": [c.key.to_text() for c in cosigners]}
    if quorum is not None:
        out["quorum"] = quorum
    return out


def _checkpoint(size: int, root: bytes | None = None) -> str:
    return note.sign_checkpoint(LOG, "yoco.example/ledger/C-1", size,
                                root if root is not None else bytes([size]) * 32)


def _cosigned(signed: str, *cosigners: Cosigner, at: int = 1_780_000_000) -> str:
    body = note.unverified_text(signed)
    return cosign.with_signatures(signed, [c.cosign(body, at) for c in cosigners])


def test_policy_round_trips_and_quorum_defaults_to_every_key() -> None:
    p = WitnessPolicy.from_json(_policy(A, B))
    assert p.quorum == 2 and p.names == (A.name, B.name)
    assert WitnessPolicy.from_json(p.to_json()) == p
    assert p.to_json() == {"keys": [A.key.to_text(), B.key.to_text()], "quorum": 2}
    assert p.describe() == f"2 of 2 witnesses: {A.name}, {B.name}"
    assert WitnessPolicy.from_json(_policy(A, B, C, quorum=2)).quorum == 2


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("A+1+x", "terms.witnesses", "must be an object"),
        ({"keys": [], "quorum": 1}, "terms.witnesses.keys", "non-empty array"),
        ({"keys": "k"}, "terms.witnesses.keys", "non-empty array"),
        ({"keys": [1]}, "terms.witnesses.keys[0]", "witness key string"),
        ({"keys": ["nope"]}, "terms.witnesses.keys[0]", "<name>+<hex8 key ID>+<base64 key>"),
        ({"keys": [A.key.to_text(), A.key.to_text()]}, "terms.witnesses.keys[1]",
         "listed twice"),
        ({"keys": [A.key.to_text(), Cosigner.generate(A.name).key.to_text()]},
         "terms.witnesses.keys[1]", "listed twice"),
        ({"keys": [" " + A.key.to_text()]}, "terms.witnesses.keys[0]", "written exactly"),
        ({"keys": [A.key.to_text()], "quorum": 0}, "terms.witnesses.quorum", "from 1 to the 1"),
        ({"keys": [A.key.to_text()], "quorum": 2}, "terms.witnesses.quorum", "from 1 to the 1"),
        ({"keys": [A.key.to_text()], "quorum": True}, "terms.witnesses.quorum", "integer"),
        ({"keys": [A.key.to_text()], "quorum": "1"}, "terms.witnesses.quorum", "integer"),
        ({"keys": [A.key.to_text()], "k": 1}, "terms.witnesses", "unknown field(s) ['k']"),
        ({"keys": [Cosigner.generate(f"w{i}.example/w").key.to_text() for i in range(17)]},
         "terms.witnesses.keys", "at most 16"),
    ],
)
def test_bad_policy_names_the_field(value: Any, field: str, words: str) -> None:
    with pytest.raises(WitnessPolicyError) as err:
        WitnessPolicy.from_json(value)
    assert err.value.field == field
    assert words in err.value.reason
    # The contract's validation reports the same field, with the line, and keeps nothing.
    spec, errors = validate_contract(fx.contract(terms={"witnesses": value}), line=7)
    assert spec is None
    assert [(e.field, e.line) for e in errors] == [(field, 7)]
    # Billing's terms refuse it naming the field too.
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Terms.from_json({"witnesses": value})


def test_contract_carries_the_policy_and_one_without_keeps_its_bytes() -> None:
    spec, errors = validate_contract(fx.contract(terms={"witnesses": _policy(A, B, quorum=1)}))
    assert not errors and spec is not None
    assert spec.terms.witnesses == WitnessPolicy((A.key, B.key), 1)
    record = spec.to_record()
    assert record["terms"]["witnesses"] == {"keys": [A.key.to_text(), B.key.to_text()],
                                            "quorum": 1}
    assert contract_from_record(record) == spec
    assert Terms.from_json(record["terms"]).witnesses == spec.terms.witnesses
    plain, _ = validate_contract(fx.contract())
    assert plain is not None and "witnesses" not in plain.to_record()["terms"]
    assert "witnesses" not in Terms.from_json(plain.to_record()["terms"]).to_json()


def test_k_of_n_counts_valid_cosignatures_of_this_note_only() -> None:
    policy = WitnessPolicy((A.key, B.key, C.key), 2)
    cp = _checkpoint(10)
    assert policy.check(cp).cosigned == () and not policy.check(cp).met
    one = _cosigned(cp, A)
    check = policy.check(one)
    assert not check.met and check.missing == (B.name, C.name)
    assert check.words().endswith(f"which needs 2 (missing: {B.name}, {C.name})")
    assert policy.check(_cosigned(cp, A, C)).met
    assert policy.check(_cosigned(cp, A, C)).cosigned == (A.name, C.name)


def test_the_same_key_twice_counts_once() -> None:
    cp = _checkpoint(10)
    body = note.unverified_text(cp)
    twice = cosign.with_signatures(cp, [A.cosign(body, 1_780_000_000),
                                        A.cosign(body, 1_780_000_001)])
    assert len(cosign.signature_lines(twice)) == 3  # the log's and A's two
    check = WitnessPolicy((A.key, B.key), 2).check(twice)
    assert check.cosigned == (A.name,) and check.missing == (B.name,) and not check.met


def test_a_forged_cosignature_does_not_count() -> None:
    cp = _checkpoint(10)
    blob = (B.key.key_id.to_bytes(4, "big") + (1_780_000_000).to_bytes(8, "big")
            + os.urandom(64))
    forged = cosign.with_signatures(
        _cosigned(cp, A), [f"\u2014 {B.name} {base64.b64encode(blob).decode()}\n"])
    check = WitnessPolicy((A.key, B.key), 2).check(forged)
    assert check.cosigned == (A.name,) and check.missing == (B.name,)


def test_a_cosignature_over_another_root_does_not_count() -> None:
    cp = _checkpoint(10)
    fork = _checkpoint(10, root=b"\x99" * 32)  # same size, another root
    older = _checkpoint(9)
    b_fork = cosign.signature_lines(_cosigned(fork, B))[-1]
    b_older = cosign.signature_lines(_cosigned(older, B))[-1]
    moved = cosign.with_signatures(_cosigned(cp, A), [b_fork, b_older])
    check = WitnessPolicy((A.key, B.key), 2).check(moved)
    assert check.cosigned == (A.name,) and not check.met


class _Row:
    def __init__(self, seq: int, changes: dict[str, Any]) -> None:
        self.event_id, self.seq, self.changes = f"a{seq}", seq, changes
        self.effective_date, self.applies_to_year_in_progress = date(2099, 1, 1), False


def test_the_policy_of_a_checkpoint_is_the_one_recorded_under_it_in_log_order() -> None:
    base, _ = validate_contract(fx.contract(terms={"witnesses": _policy(A)}))
    assert base is not None
    rows = [_Row(5, {"terms": {"witnesses": _policy(A, B)}}),
            _Row(9, {"terms": {"threshold_percent": "95"}}),
            _Row(12, {"terms": {"witnesses": None}})]
    assert witness_policy_at(base, rows, 5) == WitnessPolicy((A.key,), 1)
    # in force from the checkpoint that holds the amendment, whatever its effective date
    assert witness_policy_at(base, rows, 6) == WitnessPolicy((A.key, B.key), 2)
    assert witness_policy_at(base, rows, 12) == WitnessPolicy((A.key, B.key), 2)
    assert witness_policy_at(base, rows, 13) is None
