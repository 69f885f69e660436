"""yoco-verify's reading of entries: the progress shortcut never hides another contract's
or a disguised entry."""

from __future__ import annotations

from yoco_verify.replay import parse_entries

from ledger.canonical import canonical_bytes

CONTRACT = canonical_bytes({"kind": "contract", "contract_id": "C-1", "event_id": "e0",
                            "contract": {}})


def progress(cid: str, **extra: object) -> bytes:
    return canonical_bytes({"kind": "job_progress", "contract_id": cid, "event_id": "e1",
                            "job_id": "j", "occurred_at": "2026-01-01T00:00:00+00:00",
                            "step": 1, "step_seconds": 1, **extra})


def test_progress_shortcut_only_for_the_logs_own_flat_progress_entries() -> None:
    fake = canonical_bytes({"kind": "failure", "contract_id": "C-1", "event_id": "e2",
                            "detail": '"kind":"job_progress"', "job_id": "j"})
    nested = canonical_bytes({"kind": "amendment", "contract_id": "C-1", "event_id": "e3",
                              "changes": {"kind": "job_progress"}})
    out = parse_entries([CONTRACT, progress("C-1"), progress("C-10"), fake, nested])
    assert out[1] == {"kind": "job_progress", "contract_id": "C-1"}
    # Another contract's progress (even one whose id starts like ours) is read in full.
    assert out[2]["contract_id"] == "C-10" and out[2]["step"] == 1
    # A quoted look-alike inside a string, or a nested object, is read in full.
    assert out[3]["kind"] == "failure" and out[3]["detail"] == '"kind":"job_progress"'
    assert out[4]["kind"] == "amendment"


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
