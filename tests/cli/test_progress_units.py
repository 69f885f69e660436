"""The ingest progress bar says what it counts: the file's bytes, then records."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from tests import factories as f
from yoco.render import progress_units


def test_progress_units() -> None:
    assert progress_units(12_345_678, 45_600_000, "bytes") == "12.3 MB of 45.6 MB"
    assert progress_units(512, 2048, "bytes") == "512 bytes of 2.0 kB"
    assert progress_units(1234, 5000, "records") == "1,234 of 5,000 records"
    assert progress_units(7, None, "records") == "7 records"


def test_the_ingest_bar_on_a_terminal_names_its_units(yoco_env, tmp_path: Path,
                                                      monkeypatch) -> None:
    import yoco.cli as cli

    contracts = tmp_path / "contracts.json"
    contracts.write_text(json.dumps([f.contract("C-1")]))
    data = tmp_path / "records.jsonl"
    data.write_bytes(f.jsonl([f.rec("job_started", "C-1", job_id="j1", gpus=8)]))
    app = cli.build_app()
    assert CliRunner().invoke(app, ["contracts", "import", str(contracts)]).exit_code == 0
    screen = io.StringIO()
    # stderr as a terminal, so the bar is drawn (it is off for a pipe)
    monkeypatch.setattr(cli, "err", Console(file=screen, force_terminal=True, width=120))
    result = CliRunner().invoke(app, ["ledger", "ingest", str(data)])
    assert result.exit_code == 0, result.output
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    size = data.stat().st_size
    assert f"{size} bytes of {size} bytes" in drawn, drawn
    assert "1 of 1 records" in drawn, drawn


def test_risk_calibration_counts_its_years_on_stderr_and_leaves_stdout_alone(
    monkeypatch,
) -> None:
    """``yoco risk calibration`` (26 s at its default 2,000 years) shows a bar counting
    simulated years on a terminal's stderr; its stdout is the same table with or without
    it, and JSON stays JSON."""
    import yoco.cli as cli
    from billing.risk import calibration_table

    app = cli.build_app()
    args = ["risk", "calibration", "--years", "40", "--seed", "7"]
    plain = CliRunner().invoke(app, args)  # stderr not a terminal: no bar
    assert plain.exit_code == 0, plain.output
    assert plain.stderr == ""
    assert plain.stdout.startswith("forecast bin   years"), plain.stdout

    screen = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=screen, force_terminal=True, width=120))
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == plain.stdout
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "simulating" in drawn and "40 of 40 years" in drawn, drawn
    assert "simulating" not in shown.stdout

    as_json = CliRunner().invoke(app, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == calibration_table(years=40, seed=7)

    # The callback sees every year, and changes none of the draws.
    seen: list[tuple[int, int]] = []
    table = calibration_table(years=40, seed=7, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(n, 40) for n in range(1, 41)]
    assert table == calibration_table(years=40, seed=7)
