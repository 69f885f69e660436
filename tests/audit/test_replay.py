"""yoco-verify's reading of entries: each held to the ledger's own rules (canonical bytes,
no key twice, no event id twice, one contract), and progress entries read short."""

from __future__ import annotations

import json

import pytest
from yoco_verify import VerifyError
from yoco_verify.replay import parse_entries

from ledger.canonical import canonical_bytes

CONTRACT = canonical_bytes({"kind": "contract", "contract_id": "C-1", "event_id": "e0",
                            "contract": {}})


def progress(cid: str, **extra: object) -> bytes:
    return canonical_bytes({"kind": "job_progress", "contract_id": cid, "event_id": "e1",
                            "job_id": "j", "occurred_at": "2026-01-01T00:00:00+00:00",
                            "step": 1, "step_seconds": 1, **extra})


def test_progress_entries_are_read_short_and_lookalikes_in_full() -> None:
    fake = canonical_bytes({"kind": "failure", "contract_id": "C-1", "event_id": "e2",
                            "detail": '"kind":"job_progress"', "job_id": "j"})
    nested = canonical_bytes({"kind": "amendment", "contract_id": "C-1", "event_id": "e3",
                              "changes": {"kind": "job_progress"}})
    out = parse_entries([CONTRACT, progress("C-1"), fake, nested])
    assert out[1] == {"kind": "job_progress", "contract_id": "C-1"}
    # A quoted look-alike inside a string, or a nested object, is read in full.
    assert out[2]["kind"] == "failure" and out[2]["detail"] == '"kind":"job_progress"'
    assert out[3]["kind"] == "amendment"


def _refused(entries: list[bytes]) -> str:
    with pytest.raises(VerifyError) as exc:
        parse_entries(entries)
    return str(exc.value)


def test_entries_are_held_to_their_own_rules() -> None:
    failure = {"kind": "failure", "contract_id": "C-1", "event_id": "f1",
               "failure_class": "unplanned", "job_id": "j"}
    # Not canonical: indented, or keys out of order -- the same JSON value, other bytes.
    indented = json.dumps(failure, indent=2).encode()
    assert "entry 1: its bytes are not its RFC 8785 canonical form" in _refused(
        [CONTRACT, indented])
    # A key twice: json.loads would read the last; the shortcut would have read the first.
    twice = progress("C-1").replace(b'"kind":"job_progress"',
                                    b'"kind":"job_progress","kind":"failure"', 1)
    msg = _refused([CONTRACT, twice])
    assert msg.startswith("entry 1: not strict JSON") and "duplicate key 'kind'" in msg, msg
    # A second failure reusing an old failure's id (its class changed to planned).
    again = canonical_bytes({**failure, "failure_class": "planned"})
    assert _refused([CONTRACT, canonical_bytes(failure), progress("C-1"), again]) == (
        "entry 3 (failure): event id f1 is already entry 1's (an id names one event; a "
        "second entry may not reuse it)")
    # Another contract's entry, progress included (even an id that starts like ours).
    assert _refused([CONTRACT, progress("C-10")]) == (
        "entry 1 (job_progress): of contract 'C-10', in the log of contract 'C-1'")
    assert "of contract 'C-2'" in _refused(
        [CONTRACT, canonical_bytes({**failure, "contract_id": "C-2"})])


def test_verifier_modules_import_without_database_web_or_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('sqlalchemy','fastapi','starlette','torch','psycopg','weasyprint','jinja2',"
        "'yoco','web','reports','runtime'):\n"
        "    sys.modules[m] = None\n"
        "import yoco_verify.cli, yoco_verify.figures, yoco_verify.report, yoco_verify.mine,"
        " yoco_verify.diff, yoco_verify.logdir, yoco_verify.replay\n"
        "print('ok')\n"
    )
    import os
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{repo / 'verifier'}"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_all_at_once_and_one_by_one_read_the_same(monkeypatch) -> None:
    """parse_entries checks the rules over all entries at once and reads them one by one
    only when one breaks a rule: both readings give the same bodies, and the same error."""
    from yoco_verify.replay import _parse_one_by_one

    from yoco_records import canonical as c

    monkeypatch.setattr(c, "_CHUNK", 7)  # many chunks, shapes changing between them
    from yoco_verify.shared.yoco_records import canonical as vc

    monkeypatch.setattr(vc, "_CHUNK", 7)
    entries = [CONTRACT]
    for i in range(60):
        entries.append(progress("C-1", event_id=f"p{i}", step=i, step_seconds=1.5 + i))
        if i % 9 == 0:
            entries.append(canonical_bytes({"kind": "failure", "contract_id": "C-1",
                                            "event_id": f"f{i}", "recovery_seconds": 2.25,
                                            "job_id": "j", "note": "é" * (i % 2)}))
    assert parse_entries(entries) == _parse_one_by_one(entries)
    # Each kind of broken rule, anywhere among them: the same first error either way.
    broken = [
        (12, canonical_bytes({"kind": "job_progress", "contract_id": "C-2", "event_id": "x"})),
        (30, progress("C-1", event_id="p3", step=3, step_seconds=4.5)),
        (31, canonical_bytes({"contract_id": "C-1", "event_id": "q"})),
        (40, canonical_bytes({"kind": "outcome", "contract_id": "C-1", "event_id": 7})),
        (41, canonical_bytes([1, 2])),
        (50, progress("C-1", event_id="p50", step=50).replace(b'"step":50', b'"step":50.0')),
        (51, progress("C-1", event_id="p51", step=51).replace(b"{", b"{ ", 1)),
    ]
    for at, entry in broken:
        altered = [*entries[:at], entry, *entries[at + 1 :]]
        with pytest.raises(VerifyError) as fast:
            parse_entries(altered)
        with pytest.raises(VerifyError) as slow:
            _parse_one_by_one(altered)
        assert str(fast.value) == str(slow.value), at
