"""Where the test suite's CPU goes, by kind of process: the README's test command run under
the kernel's process accounting.

    python bench/suite_cpu.py                      # bash scripts/test, the whole suite
    python bench/suite_cpu.py -- -m "not slow"     # arguments after -- go to pytest

Every process that ends while it runs -- pytest's workers, the runtime's `yoco run`
hosts, zygotes and workers, PostgreSQL's backends, Chromium -- leaves one record with its
user and system CPU (BSD process accounting, ``acct(2)``: root only, and the kernel must
have it, as Debian's has). A record holds only a 16-byte command name, so a sampler reads
each new process's command line from ``/proc`` every 0.3 s to tell them apart (a process
that lives less than that is classed by its command name alone). Accounting is
machine-wide: whatever else runs meanwhile is counted too, so run it on an otherwise idle
machine. The figures are quoted in docs/benchmarks.md ("The test suite").
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ``struct acct_v3`` (linux/acct.h): flag, version, tty, exit code, uid, gid, pid, ppid,
#: begin time, elapsed (float), then eight ``comp_t`` (utime, stime, mem, io, rw, minflt,
#: majflt, swaps) and the command name.
_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_AHZ = 100  # the unit of v3's times
_AFORK = 0x01  # forked, never exec'd


def _comp(c: int) -> int:
    """A ``comp_t``: 13-bit mantissa, 3-bit base-8 exponent."""
    return (c & 0x1FFF) << (3 * (c >> 13))


def _acct(path: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(None if path is None else path.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"acct({path!r}): {os.strerror(err)}")


class _Sampler(threading.Thread):
    """Reads the command line of every process it has not seen (by pid and start time)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.cmdlines: dict[int, str] = {}
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.3):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
                    start = stat.rsplit(")", 1)[1].split()[19]
                    if self._seen.get(pid) == start:
                        continue
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                except (OSError, IndexError):
                    continue
                self._seen[pid] = start
                self.cmdlines[int(pid)] = raw.replace(b"\0", b" ").decode(errors="replace")[:300]

    def stop(self) -> None:
        self._stop.set()
        self.join()


#: Chromium's processes rename their main thread, which the record's command name shows.
_CHROMIUM_THREADS = {"HangWatcher", "PerfettoTrace", "Chrome_ChildIOT", "CrBrowserMain",
                     "VizCompositorTh", "chrome_crashpad"}


def classify(comm: str, cmd: str, forked: bool) -> str:
    """The kind of a process, from its command name and (where sampled) command line."""
    if comm.startswith("postgres"):
        return "PostgreSQL"
    if ("chrom" in comm or "chrome" in cmd or "headless_shell" in cmd
            or comm in _CHROMIUM_THREADS or comm.startswith("ThreadPool")):
        return "Chromium"
    if "playwright/driver/node" in cmd:
        return "Playwright's driver (node)"
    if comm in ("cc1plus", "cc1", "g++", "gcc", "as", "ld", "collect2", "cc"):
        return "C compiler (inductor)"
    if "exec(eval(sys.stdin" in cmd:
        return "pytest-xdist worker (the tests that run in-process)"
    if "runtime.zygote" in cmd:
        return "zygote started by a test process" + (", forked: its workers" if forked else "")
    if "yoco.cli_runtime" in cmd and " run " in cmd:
        return "yoco run" + (" (forked: its zygote and workers)" if forked else "")
    if "yoco.cli" in cmd or "/bin/yoco" in cmd:
        return "yoco CLI (other commands: serve, demo, ingest ...)"
    if "torch.distributed.run" in cmd:
        return "torchrun (the peer)"
    if "mypy" in cmd or comm == "mypy":
        return "mypy"
    if "ruff" in cmd or comm == "ruff":
        return "ruff"
    words = cmd.split()
    if any(Path(w).name == "pytest" for w in words[:3]) or words[1:3] == ["-m", "pytest"]:
        return "pytest (the controller)"
    if "python" in comm or "python" in cmd:
        script = next((Path(w).name for w in words[1:] if w.endswith(".py")), None)
        if script:
            return f"python {script}"
        if len(words) > 2 and words[1] == "-m":
            return f"python -m {words[2]}"
        if " -c " in f" {cmd} ":
            return "python -c (test helpers: supervisors, senders)"
        return "python (other)"
    return comm or "?"


def report(acct_file: Path, cmdlines: dict[int, str], top: int) -> str:
    """The table: CPU seconds by kind of process, biggest first."""
    data = acct_file.read_bytes()
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    total = 0.0
    count = 0
    for off in range(0, len(data) - _V3.size + 1, _V3.size):
        rec = _V3.unpack_from(data, off)
        flag, version, pid = rec[0], rec[1], rec[6]
        if version != 3:
            continue
        user, system = _comp(rec[10]) / _AHZ, _comp(rec[11]) / _AHZ
        comm = rec[18].split(b"\0")[0].decode(errors="replace")
        kind = classify(comm, cmdlines.get(pid, ""), bool(flag & _AFORK))
        a = agg[kind]
        a[0] += 1
        a[1] += user
        a[2] += system
        total += user + system
        count += 1
    lines = [f"{total:8.1f} CPU-s in {count} processes", "     CPU-s  procs    user  system  kind"]
    for kind, (n, user, system) in sorted(agg.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:top]:
        lines.append(f"  {user + system:8.1f} {int(n):6d} {user:7.1f} {system:7.1f}  {kind}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the suite under process accounting and print where its CPU went."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Root only (acct(2)); machine-wide: run it alone.")
    ap.add_argument("--top", type=int, default=25, help="kinds of process shown (25)")
    ap.add_argument("pytest_args", nargs="*", help="given to scripts/test, after --")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("error: process accounting (acct(2)) needs root", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="yoco-suite-cpu-") as tmp:
        acct_file = Path(tmp) / "acct"
        acct_file.touch()
        try:
            _acct(str(acct_file))
        except OSError as exc:
            print(f"error: cannot turn process accounting on: {exc}", file=sys.stderr)
            return 2
        sampler = _Sampler()
        sampler.start()
        start = time.monotonic()
        load = Path("/proc/loadavg").read_text().split()[:3]
        try:
            rc = subprocess.call(["bash", str(ROOT / "scripts" / "test"), *args.pytest_args],
                                 cwd=ROOT)
        finally:
            _acct(None)
            sampler.stop()
        wall = time.monotonic() - start
        print(f"\nbash scripts/test exited {rc} after {wall / 60:.0f} min {wall % 60:02.0f} s "
              f"(load average {' '.join(load)} before; {os.cpu_count()} cores: "
              f"{wall * (os.cpu_count() or 1):.0f} CPU-s available)")
        print(report(acct_file, sampler.cmdlines, args.top))
    return rc


if __name__ == "__main__":
    sys.exit(main())
