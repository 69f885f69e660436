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
