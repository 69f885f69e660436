"""The customer's audit kit end to end: export a real ledger's log, verify it offline with
yoco-verify, recompute real reports' figures, and refuse every kind of tampering."""

from __future__ import annotations

import random
import re
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ledger import note, tiles
from reports import monthly as rm
from tests import factories as f
from tests.audit.conftest import verify, yoco
from yoco.database import unit_of_work


def test_export_is_tlog_tiles_and_verifies_with_real_reports(world, capsys) -> None:
    log = world["logs"]["C-TIP"]
    cp = note.parse_checkpoint(note.unverified_text((log / "checkpoint").read_text()))
    want = {t.path for t in tiles.tiles_for_size(cp.size)}
    have = {p.relative_to(log).as_posix() for p in log.rglob("*") if p.is_file()}
    assert have == want | {"checkpoint"}
    stem = world["reports"]["C-TIP 2026-03"]
    code, out = verify(capsys, log, "--public-key", world["key_file"],
                       "--report", f"{stem}.html", "--report", f"{stem}.pdf",
                       "--report", f"{world['reports']['C-TIP 2026-02']}.pdf")
    assert code == 0, out
    assert f"{cp.size} entries, every one hashed to the signed root" in out
    # Every figure of the table, month and year to date, of both formats, matches.
    for label in ("Covered failures (month): 6  matches", "Resolution rate (year to date): "
                  "80.95 % (17 of 21)  matches", "Goodput (month)", "Lost GPU-hours (all "
                  "failures) (year to date)", "Cost of lost GPU-hours (month)",
                  "Credit status (year to date): no credit  matches"):
        assert out.count(label) >= 2, (label, out)
    assert "DIFFERS" not in out and out.rstrip().endswith("every figure matches")


def test_closed_year_credit_recomputed(world, capsys) -> None:
    stem = world["reports"]["C-CLOSED 2025-12"]
    code, out = verify(capsys, world["logs"]["C-CLOSED"], "-k", world["key"],
                       "--report", f"{stem}.pdf", "--report", f"{stem}.html")
    assert code == 0, out
    assert "Credit status (year to date): 130,000.00 EUR (issued)  matches" in out
    assert "Guarantee (≥ 90 %) (year to date): missed  matches" in out  # the year is over


def _copy(world: dict[str, Any], name: str) -> Path:
    dst = world["tmp"] / name
    shutil.copytree(world["logs"]["C-TIP"], dst)
    return dst


def _bundle(log: Path) -> Path:
    return next(p for p in (log / "tile" / "entries").rglob("*") if p.is_file())


def test_tampered_entry_is_refused(world, capsys) -> None:
    log = _copy(world, "tampered-entry")
    b = _bundle(log)
    data = b.read_bytes()
    assert b'"rolled_back"' in data
    b.write_bytes(data.replace(b'"rolled_back"', b'"live_migrat"', 1))  # same length
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1
    assert re.search(r"tile/0/000\.p/\d+: hash \d+ is not the hash of entry \d+", out), out


def test_tampered_tile_is_refused(world, capsys) -> None:
    log = _copy(world, "tampered-tile")
    t = next(p for p in (log / "tile" / "0").rglob("*") if p.is_file())
    data = bytearray(t.read_bytes())
    data[40] ^= 1  # inside the second hash
    t.write_bytes(bytes(data))
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1 and "hash 1 is not the hash of entry 1" in out, out


def test_consistently_rewritten_log_is_refused_by_the_signed_root(world, capsys) -> None:
    # Change an entry AND recompute every tile: only the signed root can tell.
    log = _copy(world, "rewritten")
    b = _bundle(log)
    entries = tiles.parse_bundle(b.read_bytes())
    i = next(n for n, e in enumerate(entries) if b'"rolled_back"' in e)
    entries[i] = entries[i].replace(b'"rolled_back"', b'"live_migrated"').replace(
        b'"lost_steps":120', b'"lost_steps":0')
    b.write_bytes(tiles.bundle_entries(entries))
    from ledger.merkle import leaf_hash

    levels = tiles.compute_levels([leaf_hash(e) for e in entries])
    for t in tiles.tiles_for_size(len(entries)):
        if t.level >= 0:
            (log / t.path).write_bytes(tiles.tile_bytes(levels, t))
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1 and "the signed root is" in out, out


def test_truncated_log_is_refused(world, capsys) -> None:
    log = _copy(world, "short-bundle")
    b = _bundle(log)
    entries = tiles.parse_bundle(b.read_bytes())
    b.write_bytes(tiles.bundle_entries(entries[:-1]))
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1 and "the log is truncated" in out and f"needs {len(entries)}" in out, out
    log = _copy(world, "no-bundle")
    _bundle(log).unlink()
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1 and "tile/entries/000.p/" in out and "missing" in out, out


def test_checkpoint_signed_by_another_key_is_refused(world, capsys) -> None:
    log = _copy(world, "other-key")
    cp = note.parse_checkpoint(note.unverified_text((log / "checkpoint").read_text()))
    impostor = note.Signer.generate(cp.origin)  # same name, other key
    (log / "checkpoint").write_text(note.sign_checkpoint(impostor, cp.origin, cp.size, cp.root))
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1 and "checkpoint: note has no signature by a known key" in out, out
    # ... and the genuine export checked against the impostor's key is refused too.
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", impostor.verifier_text())
    assert code == 1 and "no signature by a known key" in out


def test_report_with_one_figure_changed_is_refused(world, capsys) -> None:
    stem = world["reports"]["C-TIP 2026-03"]
    html = Path(f"{stem}.html").read_text()
    # 1. The visible text lies, the block does not.
    visible = world["tmp"] / "visible.html"
    row = re.search(r'data-figure="lost"><th>[^<]*</th><td class="num">([^<]*)</td>', html)
    assert row is not None
    visible.write_text(html.replace(row.group(0), row.group(0).replace(row.group(1), "1.000000")))
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--report", visible)
    assert code == 1 and "visible text: lost: the page shows" in out, out
    # 2. Block and page lie together: the recomputation differs.
    both = world["tmp"] / "both.html"
    lie = html.replace(row.group(0), row.group(0).replace(row.group(1), "1.000000"))
    lie = lie.replace(f'"month": "{row.group(1)}"', '"month": "1.000000"', 1)
    assert lie.count('"month": "1.000000"') == 1
    both.write_text(lie)
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--report", both)
    assert code == 1
    assert (f"Lost GPU-hours (all failures) (month): report says '1.000000', the entries give "
            f"'{row.group(1)}'  DIFFERS") in out, out
    assert "visible text" not in out
    # 3. A report over a checkpoint this log never signed.
    other = world["tmp"] / "other-root.html"
    block = re.search(r'"root_hash": "([^"]+)"', html)
    assert block is not None
    other.write_text(html.replace(block.group(1), "A" * 43 + "="))
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--report", other)
    assert code == 1 and "the report is not over this log" in out, out


def test_mine_catches_a_withheld_failure_and_a_contradiction(world, capsys) -> None:
    mine = world["tmp"] / "mine.csv"
    mine.write_text(
        "# our own runtime's failure log\n"
        "job,start,end,node,gpu,outcome,lost_steps\n"
        # in the ledger: the rolled-back failure of 3 March on node-31 GPU 0
        "llm-70b,2026-03-03T11:59:00+00:00,2026-03-03T12:01:00+00:00,node-31,0,rolled_back,120\n"
        # in the ledger as live-migrated; we saw a rollback
        "llm-70b,2026-03-02T11:00:00+00:00,2026-03-02T13:00:00+00:00,,,rolled_back,\n"
        # withheld: the operator never recorded this one
        "llm-70b,2026-03-20T08:00:00+00:00,2026-03-20T08:05:00+00:00,node-44,5,,\n"
    )
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--mine", mine)
    assert code == 1
    assert "mine: 3 observations, 2 problem(s)" in out
    assert re.search(r"missing: line 5: job llm-70b, 2026-03-20T08:00:00\+00:00 .*node-44, "
                     r"GPU 5: no failure in the log matches", out), out
    assert re.search(r"contradicts: line 4: .*you saw rolled_back, the log's latest outcome "
                     r"of failure \S+ \(entry \d+\) is live_migrated", out), out
    bad = world["tmp"] / "bad.csv"
    bad.write_text("job,start,end\nj,2026-03-20T08:00:00,2026-03-20T09:00:00+00:00\n")
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--mine", bad)
    assert code == 1 and "mine: line 2, start: '2026-03-20T08:00:00' has no time zone" in out


def test_between_two_reports_lists_every_correction(
    world, seed, app_ctx, capsys
) -> None:
    from ledger.checkpoints import sign_all

    with unit_of_work(app_ctx.engine) as s:  # March's report, issued (recorded) and signed
        _, recorded = rm.issue_monthly_report(s, "C-TIP", 2026, 3)
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    old = world["tmp"] / "log-old"
    yoco("ledger", "export-log", "C-TIP", "--out", str(old))
    rng = random.Random(9)
    with unit_of_work(app_ctx.engine) as s:
        from sqlalchemy import text as sql

        fid, when = s.execute(sql(
            "SELECT event_id::text, occurred_at FROM failures WHERE contract_id = 'C-TIP' "
            "AND failure_class = 'unplanned' AND cause = 'gpu_lost' ORDER BY occurred_at "
            "DESC LIMIT 1")).one()
    at = datetime(2026, 4, 2, tzinfo=UTC)
    fix = [
        f.rec("outcome", "C-TIP", at, event_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
              failure_event_id=fid, outcome="live_migrated", lost_steps=0,
              recovery_seconds=5, step_seconds=2.0, gpus_affected=8),
        f.rec("exclusion", "C-TIP", at + timedelta(hours=1),
              event_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
              failure_event_id=fid, reason="customer's maintenance window", approved_by="k.l"),
    ]
    seed([], fix)
    new = world["tmp"] / "log-new"
    yoco("ledger", "export-log", "C-TIP", "--out", str(new))
    code, out = verify(capsys, new, "-k", world["key"], "--since", old / "checkpoint")
    assert code == 0, out
    assert re.search(r"since checkpoint \d+: this log of \d+ entries extends it", out)
    assert "appended since: 1 exclusion, 1 outcome" in out
    assert f"outcome: failure {fid} ({when:%Y-%m}): outcome" in out and "→ live_migrated" in out
    assert f"exclusion: failure {fid} ({when:%Y-%m}, an already reported failure) excluded" in out
    # ... and what that does to the figures of the report already issued.
    size = recorded.body["checkpoint_tree_size"]
    assert f"report 2026-03 (checkpoint {size}): covered (month) was '6', the entries now give '5'" in out
    assert f"report 2026-03 (checkpoint {size}): excluded (year to date) was '2', the entries now give '3'" in out
    # A report issued over an older checkpoint still checks against the newer download:
    # its figures are recomputed from the entries under its own checkpoint only.
    stem = world["reports"]["C-TIP 2026-03"]
    code, out = verify(capsys, new, "-k", world["key"], "--report", f"{stem}.pdf")
    assert code == 0, out
    assert "Excluded failures (month): 2  matches" in out
    # A rewritten history: a validly signed head of the old size with another root.
    cp = note.parse_checkpoint(note.unverified_text((old / "checkpoint").read_text()))
    forged = world["tmp"] / "forged-checkpoint"
    forged.write_text(note.sign_checkpoint(app_ctx.signer, cp.origin, cp.size, b"\x07" * 32))
    code, out = verify(capsys, new, "-k", world["key"], "--since", forged)
    assert code == 1 and "the operator rewrote history" in out, out


@pytest.mark.usefixtures("app_ctx")  # the CLI reads the database the world was built in
def test_export_refusals(world, capsys) -> None:
    from yoco.cli import build_app

    r = CliRunner().invoke(build_app(), ["ledger", "export-log", "C-TIP", "--checkpoint", "3",
                                         "--out", str(world["tmp"] / "x")])
    assert r.exit_code == 2, r.output
    assert "has no signed checkpoint of size 3 (signed sizes:" in r.output, r.output
    r = CliRunner().invoke(build_app(), ["ledger", "export-log", "C-NOPE", "--out",
                                         str(world["tmp"] / "y")])
    assert r.exit_code == 2 and "C-NOPE" in r.output
    code, out = verify(capsys, world["tmp"] / "nowhere", "-k", world["key"])
    assert code == 1 and "checkpoint: missing" in out
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", "not-a-key+zz")
    assert code == 1 and "public key" in out


def test_pdf_whose_page_lies_is_refused(world, capsys) -> None:
    """A PDF rendered from a forged HTML (one visible figure changed, the attached block
    honest) is refused by its extracted text; the honest PDF passes."""
    from reports.render import html_to_pdf

    stem = world["reports"]["C-TIP 2026-03"]
    html = Path(f"{stem}.html").read_text()
    row = re.search(r'data-figure="rate"><th>[^<]*</th><td class="num">([^<]*)</td>', html)
    assert row is not None and row.group(1) == "33.33 % (2 of 6)"
    forged = world["tmp"] / "forged.pdf"
    forged.write_bytes(html_to_pdf(html.replace(row.group(0), row.group(0).replace(
        row.group(1), "100.00% (6 of 6)"))))
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--report", forged)
    assert code == 1
    assert "visible text: rate: the page shows 'resolution rate' as '100.00% (6 of 6)" in out, out


def test_a_signed_year_close_with_false_figures_is_caught(world, app_ctx, capsys) -> None:
    """A malicious operator signs a log whose year close claims the guarantee was met (and
    so issues no credit): every hash is right, the figures are not."""
    import json

    from ledger.canonical import canonical_bytes
    from ledger.merkle import leaf_hash

    log = world["tmp"] / "false-close"
    shutil.copytree(world["logs"]["C-CLOSED"], log)
    entries: list[bytes] = []
    cp = note.parse_checkpoint(note.unverified_text((log / "checkpoint").read_text()))
    bundles = [t for t in tiles.tiles_for_size(cp.size) if t.level < 0]
    for t in bundles:
        entries += tiles.parse_bundle((log / t.path).read_bytes())
    i = next(n for n, e in enumerate(entries) if b'"kind":"year_close"' in e)
    body = json.loads(entries[i])
    body["figures"]["resolved_failures"] = 5
    body["figures"]["guarantee_met"] = True
    entries[i] = canonical_bytes(body)
    for t in bundles:
        (log / t.path).write_bytes(tiles.bundle_entries(entries[t.first : t.first + t.width]))
    levels = tiles.compute_levels([leaf_hash(e) for e in entries])
    for t in tiles.tiles_for_size(cp.size):
        if t.level >= 0:
            (log / t.path).write_bytes(tiles.tile_bytes(levels, t))
    root = tiles.tree_root(cp.size, levels)
    (log / "checkpoint").write_text(note.sign_checkpoint(app_ctx.signer, cp.origin, cp.size, root))
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 0, out  # the log itself is consistent and signed ...
    html = Path(f"{world['reports']['C-CLOSED 2025-12']}.html").read_text()
    old_root = re.search(r'"root_hash": "([^"]+)"', html)
    assert old_root is not None
    report = world["tmp"] / "false-close.html"
    import base64

    # The report is over the tree before its own report entry was appended.
    size = int(re.search(r'"tree_size": (\d+)', html).group(1))  # type: ignore[union-attr]
    prefix = tiles.tree_root(size, levels)
    report.write_text(html.replace(old_root.group(1), base64.b64encode(prefix).decode()))
    code, out = verify(capsys, log, "-k", world["key"], "--report", report)
    assert code == 1
    assert (f"credit: year_close of contract year 1 (entry {i}): resolved_failures stated 5, "
            "the entries before it give 3") in out, out
    assert "guarantee_met stated True, the entries before it give False" in out
