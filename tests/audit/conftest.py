"""Fixtures of the audit-kit tests: the report tests' seeded, signed ledger, exported."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from yoco_verify.cli import run

from reports import monthly as rm
from tests.reports import scenarios as sc
from tests.reports.conftest import app_ctx, engine_, seed
from yoco.database import unit_of_work

__all__ = ["app_ctx", "engine_", "seed", "verify", "world", "yoco"]


def yoco(*args: str) -> str:
    from yoco.cli import build_app

    result = CliRunner().invoke(build_app(), list(args))
    assert result.exit_code == 0, result.output
    return result.output


def verify(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    code = run([str(a) for a in args])
    return code, capsys.readouterr().out


def _build_world(seed: Callable[..., None], app_ctx: Any, tmp_path: Path) -> dict[str, Any]:
    """Three contracts (one closed and credited), reports of two issued (each recorded by a
    ``report`` entry), both logs exported over a checkpoint covering those entries: as a
    folder (``logs``) and as the portal's ``.tar.gz`` download (``archives``)."""
    contracts, records = [], []
    for fn in (sc.tipping, sc.quiet, sc.closed_year):
        c, r = fn()
        contracts.append(c)
        records += r
    seed(contracts, records)
    from billing.closing import close_year

    with unit_of_work(app_ctx.engine) as s:
        close_year(s, "C-CLOSED", 1, signer=app_ctx.signer,
                   origin_prefix=app_ctx.settings.log_origin)
    out = tmp_path / "reports"
    out.mkdir()
    files: dict[str, Path] = {}
    with unit_of_work(app_ctx.engine) as s:
        for cid, y, m in (("C-TIP", 2026, 3), ("C-TIP", 2026, 2), ("C-CLOSED", 2025, 12)):
            rep, _ = rm.issue_monthly_report(s, cid, y, m)
            stem = rm.file_stem(cid, y, m)
            (out / f"{stem}.html").write_bytes(rep.html_bytes)
            (out / f"{stem}.pdf").write_bytes(rep.pdf)
            files[f"{cid} {y}-{m:02d}"] = out / stem
    from ledger.checkpoints import sign_all
    from ledger.export import export_tar

    with unit_of_work(app_ctx.engine) as s:  # a checkpoint covering the report entries
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    key = app_ctx.signer.verifier_text()
    (tmp_path / "key.txt").write_text(key + "\n")
    logs, archives = {}, {}
    for cid in ("C-TIP", "C-CLOSED"):
        logs[cid] = tmp_path / f"log-{cid}"
        text = yoco("ledger", "export-log", cid, "--out", str(logs[cid]))
        assert f"exported {cid}" in text
        with unit_of_work(app_ctx.engine) as s:
            info, data = export_tar(s, cid)
        archives[cid] = tmp_path / f"{cid}-log-{info.tree_size}.tar.gz"
        archives[cid].write_bytes(data)
    return {"key": key, "key_file": tmp_path / "key.txt", "logs": logs, "reports": files,
            "archives": archives, "tmp": tmp_path}


# Tests that read or write the database after the world is built (they ask for one of
# these fixtures) get a world of their own; the others, which only read and copy files,
# get a copy of one world built once per test process (its reports, logs and key are the
# same bytes: building it signs, renders three PDFs and exports two logs).
_DB_FIXTURES = frozenset({"app_ctx", "seed", "engine_", "engine", "yoco_env"})
_built: dict[str, Any] = {}


def _relocate(value: Any, old: Path, new: Path) -> Any:
    if isinstance(value, Path):
        return new / value.relative_to(old)
    if isinstance(value, dict):
        return {k: _relocate(v, old, new) for k, v in value.items()}
    return value


@pytest.fixture
def world(request: pytest.FixtureRequest, tmp_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The audit kit's world (see :func:`_build_world`), its files under this test's
    ``tmp_path``; ``world["tmp"]`` is that folder, free for the test's own copies."""
    if _DB_FIXTURES & set(request.fixturenames):
        return _build_world(request.getfixturevalue("seed"), request.getfixturevalue("app_ctx"),
                            tmp_path)
    if "world" not in _built:
        home = tmp_path_factory.mktemp("audit-world")
        _built["world"] = _build_world(request.getfixturevalue("seed"),
                                       request.getfixturevalue("app_ctx"), home)
    original = _built["world"]
    copy = tmp_path / "world"
    shutil.copytree(original["tmp"], copy)
    return _relocate(original, original["tmp"], copy)


