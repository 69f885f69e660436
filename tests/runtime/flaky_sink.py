"""A sink for tests: a JSONL sink that fails while a flag file exists (a ledger outage),
refuses for good every record of the kinds in ``refuse_kinds`` (a ledger refusal), and
counts every delivery attempt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.errors import RecordRefused, SinkError
from runtime.sink import JsonlFileSink


class FlakySink:
    """Delegates to :class:`JsonlFileSink` unless ``down_flag`` exists."""

    def __init__(self, path: str, down_flag: str, refuse_kinds: str = "") -> None:
        self.inner = JsonlFileSink(path)
        self.down_flag = Path(down_flag)
        self.refuse = {k for k in refuse_kinds.split(",") if k}
        self.attempts = Path(path + ".attempts")

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Refuse during the outage; otherwise store durably."""
        with self.attempts.open("a") as fh:
            fh.write(f"{len(records)}\n")
        if self.down_flag.exists():
            raise SinkError("ledger unavailable")
        bad = [r for r in records if r["kind"] in self.refuse]
        if bad:
            raise RecordRefused(f"record {bad[0]['event_id']}: {bad[0]['kind']} refused")
        self.inner.deliver(records)
