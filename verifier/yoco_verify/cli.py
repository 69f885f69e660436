"""``yoco-verify``: check an exported log and recompute a report's figures, offline.

Exit status: 0 when every check passes and every figure matches; 1 when a check fails or
a figure differs, or an input cannot be read (each problem is printed with its reason);
2 for bad usage (argparse).
"""

from __future__ import annotations

import argparse
import base64
import gc
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from yoco_verify import VerifyError
from yoco_verify.logdir import (
    MAX_TOTAL,
    VerifiedLog,
    load_key,
    open_log,
    read_checkpoint,
    since_text,
)
from yoco_verify.replay import Ledger, parse_entries, replay
from yoco_verify.shared.yoco_records.textsafe import safe_text

__all__ = ["main"]

_LABEL = {"month": "month", "year": "year to date"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="yoco-verify",
        description=(
            "Check a yoco contract log exported in the C2SP tlog-tiles layout against its "
            "signed checkpoint and your pinned public key, then recompute every figure of "
            "monthly reports from the entries alone. No database, no network."
        ),
        epilog=(
            "Examples:\n"
            "  yoco-verify C-1-log-812.tar.gz --public-key key.txt\n"
            "  yoco-verify C-1-log-812.tar.gz -k key.txt --report yoco-sla-C-1-2026-03.pdf\n"
            "  yoco-verify C-1-log-812.tar.gz -k key.txt "
            "--report yoco-statement-C-1-year-1.pdf\n"
            "  yoco-verify C-1-log-812.tar.gz -k key.txt --mine my-failures.csv\n"
            "  yoco-verify C-1-log-900.tar.gz -k key.txt --since C-1-log-812.tar.gz\n"
            "Exit 0 only when every check passes and every figure matches."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "log",
        type=Path,
        help="the downloaded export: the .tar.gz as downloaded (read in memory, never "
        "unpacked), or a folder holding checkpoint and tile/",
    )
    p.add_argument(
        "--public-key",
        "-k",
        required=True,
        help="the operator's verifier key you pinned (the key text, or a file holding it)",
    )
    p.add_argument(
        "--report",
        "-r",
        type=Path,
        action="append",
        default=[],
        help="a monthly report (HTML or PDF) to recompute, or a year-end statement "
        "(its bytes, checkpoint, year close and credit checked); repeatable",
    )
    p.add_argument(
        "--mine",
        type=Path,
        help="your own failure observations (CSV: job,start,end[,node,gpu,outcome,lost_steps])",
    )
    p.add_argument(
        "--since",
        type=Path,
        help="an older signed checkpoint (a checkpoint file or an older export directory): "
        "check the log extends it and list every change since",
    )
    p.add_argument(
        "--witness-key", action="append", default=[], metavar="VKEY",
        help="a witness you trust (its cosignature/v1 key, or a file holding it): the "
        "log's checkpoint must carry its cosignature; repeatable (docs/audit.md §7)",
    )
    p.add_argument("--quorum", type=int, default=None,
                   help="how many of the --witness-key witnesses must have cosigned "
                   "(default: all)")
    p.add_argument(
        "--terms", type=Path, metavar="FILE",
        help="your copy of the contract (JSON, as signed) or of its terms: its witness "
        "policy (terms.witnesses) must be met by the export's checkpoint, and a log that "
        "records another policy is reported. Without it, the policy recorded in the "
        "log's contract entry (as amended) is required (docs/audit.md §7)",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=MAX_TOTAL,
        help=f"refuse an export holding more than this many bytes (default {MAX_TOTAL})",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="print only problems")
    return p


def say(msg: str) -> None:
    """Print one line of output; every line may quote stored text (a reason, a job id),
    so each goes through the one neutraliser of control and bidi characters."""
    print(safe_text(msg))


class _Out:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.failed = 0

    def ok(self, msg: str) -> None:
        if not self.quiet:
            say(msg)

    def bad(self, msg: str) -> None:
        self.failed += 1
        say(msg)


def _progress(stage: str, done: int, total: int) -> None:
    if sys.stderr.isatty() and stage == "read" and (done == total or done % 256 == 0):
        print(f"\rreading entry bundles {done}/{total}", end="", file=sys.stderr, flush=True)
        if done == total:
            print(file=sys.stderr)


def _check_report(path: Path, log: VerifiedLog, led: Ledger, out: _Out) -> None:
    from yoco_verify.figures import recompute
    from yoco_verify.policy import report_policy_problems
    from yoco_verify.report import (
        check_visible,
        entry_disagrees,
        file_digest,
        issued_entry,
        read_report,
    )

    # First the exact bytes (even of a file that no longer parses): any change anywhere.
    digest = file_digest(path)
    entry: dict[str, Any] | None = None
    try:
        seq, entry = issued_entry(digest, led.bodies)
    except VerifyError as exc:
        out.bad(f"report {path.name}: issued: {exc}")
    if entry is not None and entry.get("report") == STATEMENT:
        _check_statement(path, digest, seq, entry, log, led, out)
        return
    rep = read_report(path)
    b = rep.block
    out.ok(
        f"report {path.name}: {b.get('contract_id')} {b.get('month')}, "
        f"checkpoint {b.get('tree_size')}"
    )
    if entry is not None:
        out.ok(f"  issued: its SHA-256 {digest} is recorded by report entry {seq}")
        for problem in entry_disagrees(entry, b):
            out.bad(f"  issued: {problem}")
    size = b.get("tree_size")
    if not isinstance(size, int) or not 0 < size <= log.size:
        out.bad(
            f"  checkpoint: the report's tree size {size!r} is not in this export (1..{log.size})"
        )
        return
    if b.get("log") != log.origin:
        out.bad(
            f"  checkpoint: the report is of log {b.get('log')!r}, the export of {log.origin!r}"
        )
        return
    root = base64.b64encode(log.prefix_root(size)).decode()
    if b.get("root_hash") != root:
        out.bad(
            f"  checkpoint: the report's root hash {b.get('root_hash')} is not the root of the "
            f"log's first {size} entries ({root}): the report is not over this log"
        )
        return
    out.ok(f"  checkpoint {size}: root {root} matches the log's first {size} entries")
    for problem in report_policy_problems(led, size, b, issued=entry is not None):
        out.bad(f"  witnesses: {problem}")
    sub = led if size == led.size else led.prefix(size)
    try:
        rec = recompute(sub, b)
    except ValueError as exc:
        raise VerifyError(f"{path.name}: cannot recompute: {exc}") from None
    if sub.latest_time is not None:
        as_of = datetime.fromisoformat(str(b["as_of"]))
        if sub.latest_time > as_of:
            out.bad(
                f"  as_of: the report claims figures as of {as_of.isoformat()}, but an entry "
                f"under its checkpoint is dated {sub.latest_time.isoformat()}"
            )
    for problem in check_visible(rep):
        out.bad(f"  visible text: {problem}")
    seen: set[str] = set()
    for row in b.get("rows", []):
        rid = str(row.get("id"))
        seen.add(rid)
        want = rec.rows.get(rid)
        if want is None:
            out.bad(f"  {row.get('label')}: a figure the verifier does not know ({rid})")
            continue
        for i, col in enumerate(("month", "year")):
            stated, mine = str(row.get(col)), want[i]
            name = f"{row.get('label')} ({_LABEL[col]})"
            if stated == mine:
                out.ok(f"  {name}: {stated}  matches")
            else:
                out.bad(f"  {name}: report says {stated!r}, the entries give {mine!r}  DIFFERS")
    for rid in sorted(set(rec.rows) - seen):
        out.bad(f"  {rid}: the entries give {rec.rows[rid]} but the report does not state it")
    values = b.get("values") or {}
    for col, figs in (("month", rec.month), ("year", rec.year)):
        got: dict[str, Any] = values.get(col) or {}
        for key, mine in figs.to_json().items():
            if got.get(key) != mine:
                out.bad(
                    f"  values.{col}.{key}: block says {got.get(key)!r}, "
                    f"the entries give {mine!r}  DIFFERS"
                )
    for problem in rec.credit_problems:
        out.bad(f"  credit: {problem}")


#: The ``report`` field of a year-end statement's entry (a monthly report's is
#: ``monthly-sla``).
STATEMENT = "year-statement"


def _check_statement(path: Path, digest: str, seq: int, entry: dict[str, Any],
                     log: VerifiedLog, led: Ledger, out: _Out) -> None:
    """A year-end statement (no figures block): its bytes are recorded by ``entry``
    (found already); its checkpoint is the root of the log's first entries; the year's
    close under that checkpoint states the figures the entries before it give, and its
    credit follows the rule; the statement shows the close's figures and verdict."""
    from yoco_verify.figures import year_close, year_problems
    from yoco_verify.report import visible_text
    from yoco_verify.shared.billing import display
    from yoco_verify.shared.billing.inforce import in_force

    k, size = entry.get("year"), entry.get("checkpoint_tree_size")
    out.ok(f"statement {path.name}: {entry.get('contract_id')} contract year {k}, "
           f"checkpoint {size}")
    out.ok(f"  issued: its SHA-256 {digest} is recorded by report entry {seq}")
    if not isinstance(k, int) or not isinstance(size, int) or not 0 < size <= log.size:
        out.bad(f"  checkpoint: the statement's tree size {size!r} is not in this export "
                f"(1..{log.size})")
        return
    root = base64.b64encode(log.prefix_root(size)).decode()
    if entry.get("checkpoint_root_hash") != root:
        out.bad(f"  checkpoint: the statement's root hash {entry.get('checkpoint_root_hash')} "
                f"is not the root of the log's first {size} entries ({root})")
        return
    out.ok(f"  checkpoint {size}: root {root} matches the log's first {size} entries")
    sub = led if size == led.size else led.prefix(size)
    close = year_close(sub, k)
    if close is None:
        out.bad(f"  close: no close of contract year {k} under checkpoint {size}")
        return
    inf = in_force(sub.contract, sub.amendments, k)
    figures = close.get("figures") or {}
    try:
        covered, resolved = int(figures["covered_failures"]), int(figures["resolved_failures"])
        met = figures["guarantee_met"]
    except (KeyError, TypeError, ValueError):
        out.bad(f"  close: entry {close['_seq']} states no figures of contract year {k}")
        return
    verdict = display.verdict(resolved, covered, inf.terms.threshold_percent, True)
    problems = year_problems(sub, k, inf, (resolved, covered, met is True))
    for problem in problems:
        out.bad(f"  close: {problem}")
    if not problems:
        out.ok(f"  close: entry {close['_seq']} states contract year {k}'s figures as the "
               f"entries before it give them ({display.rate_text(resolved, covered)}, "
               f"{verdict.word}); its credit follows the rule")
    text = visible_text(path).casefold()
    for label, value in (("covered failures", covered), ("resolved", resolved),
                         (f"contract year {k}:", verdict.word)):
        want = f"{label} {value}".casefold()
        if want in text:
            out.ok(f"  shows {label} {value}  matches")
        else:
            out.bad(f"  visible text: the statement does not show {label} {value!r} as its "
                    "close states it  DIFFERS")


def _check_policy(log: VerifiedLog, led: Ledger, terms: Path | None, out: _Out) -> None:
    """The contract's witness policy on the export's checkpoint: the one the log records
    (its contract entry as amended under the checkpoint) and, with ``--terms``, yours."""
    from yoco_verify.policy import log_policy, read_terms_policy, words

    recorded = log_policy(led, log.size)
    if recorded is None:
        out.ok("witness policy: the contract's terms in the log name none (the checkpoint "
               "rests on the operator's signature alone)")
    else:
        check = recorded.check(log.note)
        line = f"witness policy (the contract's terms in the log): {words(recorded, check)}"
        if check.met:
            out.ok(line)
        else:
            out.bad(f"{line}: the checkpoint does not meet the contract's witness policy")
    if terms is None:
        return
    yours = read_terms_policy(terms)
    check = yours.check(log.note)
    line = f"witness policy (your terms, {terms.name}): {words(yours, check)}"
    if check.met:
        out.ok(line)
    else:
        out.bad(f"{line}: the checkpoint does not meet your witness policy")
    if recorded != yours:
        shown = recorded.describe() if recorded is not None else "none"
        out.bad(f"witness policy: the log records {shown}, your terms say "
                f"{yours.describe()}: the contract in the log is not the one you hold")


def _read_log(args: argparse.Namespace, key: Any) -> tuple[VerifiedLog, Ledger]:
    """The export checked against its signed root, its entries held to their rules and
    replayed.  Millions of objects are made here and none is garbage: the cyclic
    collector, which would walk them all again and again as they pile up, is paused
    meanwhile (reference counting still frees everything no longer used)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        log = open_log(args.log, key, progress=_progress, max_bytes=args.max_bytes)
        led = replay(parse_entries(log.entries))
    finally:
        if was_enabled:
            gc.enable()
    return log, led


def run(argv: Sequence[str] | None = None) -> int:
    """Run the verifier; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["witness"]:  # the witness server (yoco_verify.witness)
        from yoco_verify.witness import run as run_witness

        return run_witness(argv[1:])
    args = _parser().parse_args(argv)
    out = _Out(args.quiet)
    try:
        key = load_key(args.public_key)
        t0 = time.monotonic()
        log, led = _read_log(args, key)
        out.ok(
            f"log {log.origin}: {log.size} entries, every one hashed to the signed root "
            f"{log.root.hex()} (checked in {time.monotonic() - t0:.1f} s)"
        )
        if args.witness_key:  # the customer's witness policy (yoco_verify.witness)
            from yoco_verify.witness import require_cosignatures

            try:
                names = require_cosignatures(log.note, args.witness_key, args.quorum)
            except ValueError as exc:
                raise VerifyError(str(exc)) from None
            out.ok(f"checkpoint cosigned by {len(names)} witness(es) you trust: "
                   f"{', '.join(names) or 'none needed'}")
        _check_policy(log, led, args.terms, out)
        cid = led.contract.contract_id
        if log.origin.rsplit("/", 1)[-1] != cid:
            out.bad(f"log: the checkpoint's origin {log.origin!r} is not contract {cid!r}'s log")
        for path in args.report:
            try:
                _check_report(path, log, led, out)
            except VerifyError as exc:
                out.bad(f"report {path.name}: {exc}")
        if args.mine is not None:
            from yoco_verify.mine import compare, read_observations

            obs = read_observations(args.mine)
            findings = compare(led, obs)
            out.ok(f"mine: {len(obs)} observations, {len(findings)} problem(s)")
            for f in findings:
                out.bad(f"  {f.kind}: {f.message}")
        if args.since is not None:
            from yoco_verify.diff import changes_since, check_consistency, reported_changes

            old = read_checkpoint(since_text(args.since), key, "older checkpoint")
            check_consistency(log, old)
            out.ok(
                f"since checkpoint {old.size}: this log of {log.size} entries extends it "
                "(consistency proof checked)"
            )
            kinds, changes = changes_since(led, old.size)
            listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
            say(f"  appended since: {listed}")
            for c in changes:
                say(f"  entry {c.seq} {c.kind}: {c.message}")
            fixes = reported_changes(led, old.size)
            for fc in fixes:
                say(
                    f"  report {fc.month} (checkpoint {fc.report_size}): {fc.figure} "
                    f"({fc.period}) was {fc.was!r}, the entries now give {fc.now!r}"
                )
            if not fixes:
                say("  no figure of a report issued under the older checkpoint changed")
    except VerifyError as exc:
        say(f"FAILED: {exc}")
        return 1
    if out.failed:
        say(f"FAILED: {out.failed} problem(s)")
        return 1
    say("OK: every check passed and every figure matches")
    return 0


def main() -> None:
    """Console entry point."""
    sys.exit(run())
