"""The one wording of a failure's class, cause and outcome on every surface.

The ledger stores codes (``preemptive``, ``gpu_lost``, ``live_migrated``); people read
words.  The portal, the monthly report and its charts, the command line and the alerts
all take the words from here, so one failure reads the same everywhere ("pre-emptive",
"GPU lost", "live-migrated"), never ``gpu_lost`` on one page and "gpu lost" on the next.
JSON, CSV columns of codes and the ledger's entries keep the codes.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from billing.sla import CLASS_ORDER

__all__ = [
    "CLASS_LABELS",
    "CLASS_ORDER",
    "OUTCOME_LABELS",
    "STATUS_LABELS",
    "cause_label",
    "causes_text",
    "class_label",
    "classes_text",
    "outcome_label",
    "state_label",
    "status_label",
]


#: A failure class as words.
CLASS_LABELS: Final = {
    "unplanned": "unplanned",
    "preemptive": "pre-emptive",
    "planned": "planned",
}

#: A recorded outcome as words.
OUTCOME_LABELS: Final = {
    "live_migrated": "live-migrated",
    "rolled_back": "rolled back",
    "failed": "failed",
}

#: A failure's status in a report row or on a page (billing.sla.FailureStatus) as words:
#: "resolved" as the guarantee counts it (live-migrated with no lost progress).
STATUS_LABELS: Final = {
    "resolved": "resolved",
    "rolled_back": "rolled back",
    "failed": "failed",
    "pending": "pending",
    "excluded": "excluded",
    "not_covered": "not covered",
}

#: Parts of a cause code written as their usual abbreviation (``gpu_lost`` → "GPU lost").
_ABBREVIATIONS: Final = {
    "gpu": "GPU",
    "cpu": "CPU",
    "ecc": "ECC",
    "nvlink": "NVLink",
    "pcie": "PCIe",
    "xid": "Xid",
    "nic": "NIC",
    "nccl": "NCCL",
    "oom": "OOM",
    "hbm": "HBM",
    "psu": "PSU",
    "bmc": "BMC",
    "dimm": "DIMM",
    "os": "OS",
}


def state_label(code: str | None) -> str:
    """Any other state code as words, its underscores as spaces: a dispute's or a
    credit's status (``rolled_back`` → "rolled back"); "" for none."""
    return (code or "").replace("_", " ")


_words = state_label


def class_label(code: str | None) -> str:
    """A failure class as words: ``preemptive`` → "pre-emptive"; an unknown code with
    its underscores as spaces; "—" for none."""
    if not code:
        return "—"
    return CLASS_LABELS.get(code, _words(code))


def cause_label(code: str | None) -> str:
    """A cause code as words: ``gpu_lost`` → "GPU lost", ``network_wide_outage`` →
    "network wide outage" (causes are open codes: each part is a word, abbreviations
    such as GPU, ECC, NVLink keep their capitals); "—" for none."""
    if not code:
        return "—"
    return " ".join(_ABBREVIATIONS.get(part, part) for part in code.split("_") if part)


def outcome_label(code: str | None) -> str:
    """A recorded outcome as words: ``live_migrated`` → "live-migrated"; "—" for none."""
    if not code:
        return "—"
    return OUTCOME_LABELS.get(code, _words(code))


def status_label(code: str | None) -> str:
    """A failure's status as words: ``not_covered`` → "not covered"; "—" for none."""
    if not code:
        return "—"
    return STATUS_LABELS.get(code, _words(code))


def classes_text(codes: Iterable[str]) -> str:
    """Failure classes as one phrase in :data:`CLASS_ORDER` (unknown ones after, sorted):
    "unplanned, pre-emptive"; "none" when there are none."""
    given = set(codes)
    ordered = [c for c in CLASS_ORDER if c in given] + sorted(given - set(CLASS_ORDER))
    return ", ".join(class_label(c) for c in ordered) or "none"


def causes_text(codes: Iterable[str]) -> str:
    """Cause codes as one phrase, sorted by code: "customer code, facility power";
    "none" when there are none."""
    return ", ".join(cause_label(c) for c in sorted(set(codes))) or "none"
