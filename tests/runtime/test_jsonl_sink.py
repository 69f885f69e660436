"""JsonlFileSink stores each record once also across processes and instances (a restarted
supervisor, or two delivering to the same file), and never glues a record onto a torn
line. Real processes, real files."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from runtime.errors import RecordRefused
from runtime.sink import JsonlFileSink

ROOT = Path(__file__).resolve().parents[2]

# A writer process: delivers the records of a JSON file in batches of 7, in the order
# given, with a fresh instance every 3 batches (a supervisor restarting).
WRITER = """
import json, sys
from runtime.sink import JsonlFileSink
path, recs = sys.argv[1], json.load(open(sys.argv[2]))
sink = JsonlFileSink(path)
for n, i in enumerate(range(0, len(recs), 7)):
    if n % 3 == 2:
        sink = JsonlFileSink(path)
    sink.deliver(recs[i:i + 7])
"""


def _rec(i: int) -> dict[str, object]:
    return {"kind": "job_progress", "event_id": str(uuid.UUID(int=i + 1, version=4)),
            "contract_id": "c", "job_id": "j", "step": i, "step_seconds": 0.5,
            "occurred_at": "2026-11-30T00:00:00+00:00"}


def _ids(path: Path) -> list[str]:
    return [json.loads(ln)["event_id"] for ln in path.read_text().splitlines()]


def test_two_instances_never_store_a_record_twice(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    a, b = JsonlFileSink(path), JsonlFileSink(path)
    r1, r2, r3 = _rec(1), _rec(2), _rec(3)
    a.deliver([r1])
    b.deliver([r1, r2])  # b reads r1 from the file
    a.deliver([r2, r3])  # a must see that b stored r2 meanwhile
    b.deliver([r3])
    assert _ids(path) == [r1["event_id"], r2["event_id"], r3["event_id"]]
    with pytest.raises(RecordRefused):
        b.deliver([r3 | {"step": 99}])  # stored by a, other content: refused
    assert len(_ids(path)) == 3


def test_concurrent_processes_deliver_each_record_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    recs = [_rec(i) for i in range(300)]
    forward, backward = tmp_path / "f.json", tmp_path / "b.json"
    forward.write_text(json.dumps(recs))
    backward.write_text(json.dumps(recs[::-1]))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(src)], env=env)
             for src in (forward, backward, forward)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    ids = _ids(path)
    assert len(ids) == len(set(ids)) == 300
    assert set(ids) == {r["event_id"] for r in recs}


def test_a_torn_tail_is_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    JsonlFileSink(path).deliver([_rec(1)])
    with path.open("a") as fh:
        fh.write('{"kind": "job_progress", "event_id": "torn')  # a writer died mid-line
    sink = JsonlFileSink(path)
    sink.deliver([_rec(1), _rec(2)])
    assert _ids(path) == [_rec(1)["event_id"], _rec(2)["event_id"]]
    assert sink.read_all() == [_rec(1), _rec(2)]
