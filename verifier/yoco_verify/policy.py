"""The contract's witness policy, checked offline (docs/audit.md §7).

A contract's terms may name the witnesses its customer trusts and how many of them must
cosign a checkpoint before it counts (``terms.witnesses``: k of n ``cosignature/v1``
keys). The policy a checkpoint must meet is read from the log itself: the contract entry
as changed by every amendment *under* that checkpoint, in log order (the rule is
``billing.inforce.witness_policy_at``, shared here as a copy). The customer may also give
the terms as they hold them (``--terms``): then that policy is required as well, and a
log that records another policy is reported.

Counting is :class:`~yoco_verify.shared.ledger.cosign.WitnessPolicy`'s: only a line that
verifies over this very checkpoint note counts (a forged line, or a cosignature of
another size or root, does not), and several lines by one key count once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from yoco_verify import VerifyError
from yoco_verify.replay import Ledger
from yoco_verify.shared.billing.inforce import witness_policy_at
from yoco_verify.shared.ledger.cosign import PolicyCheck, WitnessPolicy
from yoco_verify.shared.ledger.errors import WitnessPolicyError

__all__ = [
    "MAX_TERMS_BYTES",
    "log_policy",
    "read_terms_policy",
    "report_policy_problems",
]

#: The largest ``--terms`` file read (a contract object is a few kilobytes).
MAX_TERMS_BYTES = 1 << 20


def log_policy(led: Ledger, size: int) -> WitnessPolicy | None:
    """The witness policy the log's checkpoint of ``size`` entries must meet, from the
    log's own contract and amendment entries; None when the contract has none. Raises
    :class:`VerifyError` when a recorded policy is malformed."""
    try:
        return witness_policy_at(led.contract, led.amendments, size)
    except WitnessPolicyError as exc:
        raise VerifyError(f"the log's witness policy is malformed: {exc}") from None


def read_terms_policy(path: Path) -> WitnessPolicy:
    """The witness policy of a terms file the customer holds: a JSON contract object
    (with ``terms``) or a terms object. Raises :class:`VerifyError` naming the file and
    the field when it cannot be read, is malformed or names no policy."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TERMS_BYTES + 1)
    except OSError as exc:
        raise VerifyError(f"--terms {path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_TERMS_BYTES:
        raise VerifyError(f"--terms {path}: larger than {MAX_TERMS_BYTES} bytes")
    try:
        obj: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise VerifyError(f"--terms {path}: not a JSON object: {exc}") from None
    if isinstance(obj, dict) and isinstance(obj.get("terms"), dict):
        obj, where = obj["terms"], "terms.witnesses"
    else:
        where = "witnesses"
    if not isinstance(obj, dict) or obj.get("witnesses") is None:
        raise VerifyError(f"--terms {path}: {where}: the terms name no witness policy")
    try:
        return WitnessPolicy.from_json(obj["witnesses"], where)
    except WitnessPolicyError as exc:
        raise VerifyError(f"--terms {path}: {exc}") from None


def words(policy: WitnessPolicy, check: PolicyCheck) -> str:
    """One line on the policy and what the checkpoint shows (names the missing ones)."""
    who = ", ".join(check.cosigned) or "none of them"
    if check.met:
        return f"{policy.describe()}; cosigned by {who}"
    return check.words()


def report_policy_problems(
    led: Ledger, size: int, block: dict[str, Any], issued: bool
) -> list[str]:
    """What is wrong with a report's statement about its checkpoint's witness policy
    (``block["witnesses"]``), against the policy the log records under that checkpoint;
    an issued report must state that its checkpoint met the policy."""
    policy = log_policy(led, size)
    stated = block.get("witnesses")
    if policy is None:
        if stated is not None:
            return [f"the report states a witness policy, but the log records none under "
                    f"checkpoint {size}"]
        return []
    if not isinstance(stated, dict):
        return [f"the contract's terms under checkpoint {size} hold a witness policy "
                f"({policy.describe()}), but the report does not state it"]
    out = []
    if stated.get("policy") != policy.to_json():
        out.append(f"the report states the witness policy {stated.get('policy')!r}, the log "
                   f"records {policy.to_json()!r} under checkpoint {size}")
    if issued and stated.get("met") is not True:
        out.append(f"issued over checkpoint {size}, which the report says does not meet the "
                   "contract's witness policy: an issued report rests only on one that does")
    return out
