"""A real training job under ``yoco run`` reports into the ledger; the figures follow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests import factories as f
from yoco.cli import build_app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.slow
def test_a_killed_worker_is_live_migrated_and_the_ledger_counts_it(
    yoco_env, engine, tmp_path
) -> None:
    app = build_app()
    contracts = tmp_path / "c.json"
    contracts.write_text(json.dumps([f.contract("RUN-1", start_date="2026-01-01")]))
    assert runner.invoke(app, ["contracts", "import", str(contracts)]).exit_code == 0

    env = {**os.environ, **yoco_env, "YOCO_RUN_DIR": str(tmp_path / "runs")}
    proc = subprocess.run(
        [sys.executable, "-m", "yoco.cli", "run", "--workers", "2", "--spares", "1",
         "--contract", "RUN-1", "--job-id", "job-run-1", "--checkpoint-every", "5",
         "--inject", "kill:rank=1:step=6", "--progress-every", "0.2",
         str(ROOT / "examples" / "mlp_train.py"), "--steps", "16", "--step-sleep", "0.05"],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "finished at step 16" in proc.stdout

    with engine.connect() as c:
        kinds = dict(c.execute(text(
            "SELECT kind, count(*) FROM journal_entries WHERE contract_id = 'RUN-1' GROUP BY kind"
        )).all())
        outcome = c.execute(text("SELECT outcome, lost_steps FROM outcomes")).one()
    assert kinds["job_started"] == 1 and kinds["job_finished"] == 1
    assert kinds["failure"] == 1 and kinds["outcome"] == 1
    assert tuple(outcome) == ("live_migrated", 0)

    out = runner.invoke(app, ["sla", "RUN-1", "--year", "1", "--json"])
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output)
    assert figures["covered_failures"] == 1 and figures["resolved_failures"] == 1
    assert figures["guarantee_met"] is True
    assert runner.invoke(app, ["ledger", "verify"]).exit_code == 0


def test_run_refuses_an_unknown_contract_before_starting_anything(yoco_env, tmp_path) -> None:
    out = runner.invoke(build_app(), ["run", "--contract", "NOPE", "--workers", "1",
                                      "--spares", "0", str(ROOT / "examples" / "mlp_train.py")])
    assert out.exit_code == 2
    assert "unknown contract 'NOPE'" in out.output
