"""Portal benchmark: dashboard and failures-list latency at 50 concurrent clients.

Usage::

    python bench/portal_bench.py [--records 200000] [--clients 50] [--seconds 30]
        [--workers 2] [--client wrk|python] [--think 1.0] [--per-page] [--keep DIR]

Uses ``DATABASE_URL`` if set, else an embedded PostgreSQL (in ``--keep DIR``, built once
and reused by later runs; else in a temporary folder).  Builds one large contract whose
current contract year holds a full year of SIMULATED records (``yoco.simulate``: 16
parallel jobs of 8–4,096 GPUs failing at the Meta cluster-study rate), starts
``yoco serve --workers N`` on 127.0.0.1 and logs ``--clients`` customer sessions in.

The load generator is ``wrk`` (C; ``apt-get install wrk``) when installed: ``--clients``
open keep-alive connections, one thread, each request carrying one of the sessions'
cookies, half on the dashboard and half on the failures list (pages 1–5, with and
without filters).  Two runs: closed loop (each connection sends its next request as soon
as the answer arrived, no think time), then with a think time drawn uniformly from
0.5–1.5 × ``--think`` seconds before each request (wrk's ``delay()``; the latency is
measured from the send, the think time excluded).  ``--per-page`` adds runs of each page
alone.  ``--client python`` uses the older httpx client instead, which competes with the
server for the CPUs.  Prints p50 / p90 / p99 / p99.9 and the load average next to every
figure.  Goal (DESIGN section 6): p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PASSWORD = "benchmark password"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _database(keep: Path | None) -> tuple[str, object, bool]:
    """(URL, embedded server or None, whether the database is already built).

    With ``keep``, the embedded server's data folder and the data folder live there and
    the database ``pbench`` is reused when a previous run built it.
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from yoco.database import embedded_url, ensure_database, start_embedded

    if os.environ.get("DATABASE_URL"):
        from yoco.settings import normalize_url

        url, server = normalize_url(os.environ["DATABASE_URL"]), None
    else:
        root = keep if keep is not None else Path(tempfile.mkdtemp(prefix="yoco-pbench-"))
        server = start_embedded(root / "pgdata")
        ensure_database(embedded_url(server, "postgres"), "yoco")
        url = embedded_url(server)
    db = "pbench" if keep is not None else f"pbench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        exists = c.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": db}).first()
        built = False
        if exists:
            built = (keep / "built").exists() if keep is not None else False
            if not built:
                c.execute(text(f'DROP DATABASE "{db}"'))
        if not built:
            c.execute(text(f'CREATE DATABASE "{db}"'))
    admin.dispose()
    return make_url(url).set(database=db).render_as_string(hide_password=False), server, built


def logins(url: str) -> dict[str, str]:
    """The roles (created once, as the superuser of ``url``) and each process's login URL."""
    from sqlalchemy.engine import make_url

    from yoco.database import prepare

    db = prepare(url, make_url(url).database or "yoco")
    return {
        "DATABASE_URL": db.url,
        "YOCO_OWNER_DATABASE_URL": db.owner_url,
        "YOCO_PORTAL_DATABASE_URL": db.portal_url,
        "YOCO_SINK_DATABASE_URL": db.sink_url,
    }


def build(url: str, records: int, data_dir: Path) -> dict[str, int]:
    """Migrate, create the contract and a customer user, ingest a year of records."""
    import json

    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from web.accounts import add_user
    from web.security import password_hasher
    from yoco.app import App
    from yoco.database import unit_of_work
    from yoco.settings import Settings
    from yoco.simulate import StreamConfig, simulate

    ctx = App(Settings(**logins(url), YOCO_DATA_DIR=str(data_dir)))
    now = datetime.now(UTC)
    start_day = (now - timedelta(days=364)).date()
    specs, errors = parse_contracts(json.dumps([{
        "contract_id": "BIG-1", "customer": "Bench Corp", "start_date": start_day.isoformat(),
        "currency": "USD", "annual_value": "25000000.00", "term_years": 2,
        "gpu_hour_price": "2.50",
    }]).encode())
    assert not errors
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        add_user(s, password_hasher(), email="bench@corp.example", name="Bench",
                 role="customer", customer="Bench Corp", password=PASSWORD)
    start = datetime(start_day.year, start_day.month, start_day.day, tzinfo=UTC)
    stream = list(simulate(StreamConfig(contract_id="BIG-1", start=start, end=now,
                                        records=records, seed=42, parallel_jobs=16)))
    kinds: dict[str, int] = {}
    for r in stream:
        kinds[str(r["kind"])] = kinds.get(str(r["kind"]), 0) + 1
    t = time.perf_counter()
    for lo in range(0, len(stream), 5000):
        recs, errs = validate_batch(stream[lo : lo + 5000])
        assert not errs, errs[:3]
        with unit_of_work(ctx.engine) as s:
            ingest(s, recs, None, ctx.projectors)
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    print(f"database: {len(stream)} records {kinds} ingested in "
          f"{time.perf_counter() - t:.0f} s", flush=True)
    ctx.close()
    return kinds


async def _login(base: str):
    import httpx

    client = httpx.AsyncClient(base_url=base, timeout=30,
                               limits=httpx.Limits(max_connections=1))
    page = await client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token
    r = await client.post("/login", data={"email": "bench@corp.example", "password": PASSWORD,
                                          "csrf_token": token.group(1), "next": "/"})
    assert r.status_code in (200, 303), r.status_code
    return client


FILTERS = [{}, {"status": "rolled_back"}, {"failure_class": "preemptive"},
           {"cause": "gpu_lost"}, {"status": "resolved", "failure_class": "unplanned"}]


async def run_load(base: str, clients: int, seconds: float, pace: float | None
                   ) -> dict[str, list[float]]:
    """Closed-loop clients (or paced at one request per ``pace`` seconds) for ``seconds``."""
    sessions = [await _login(base) for _ in range(clients)]
    lat: dict[str, list[float]] = {"dashboard": [], "failures": []}
    errors = 0
    stop = time.monotonic() + seconds

    async def client(i: int) -> None:
        nonlocal errors
        rng = random.Random(i)
        c = sessions[i]
        n = 0
        if pace:
            await asyncio.sleep(rng.uniform(0, pace))
        while time.monotonic() < stop:
            began = time.monotonic()
            if n % 2 == 0:
                kind, url, params = "dashboard", "/contracts/BIG-1", {}
            else:
                kind, url = "failures", "/contracts/BIG-1/failures"
                params = {**rng.choice(FILTERS), "page": str(rng.randint(1, 5))}
            t = time.perf_counter()
            r = await c.get(url, params=params)
            ms = (time.perf_counter() - t) * 1000
            if r.status_code != 200:
                errors += 1
            lat[kind].append(ms)
            n += 1
            if pace:
                await asyncio.sleep(max(0.0, pace - (time.monotonic() - began)))

    await asyncio.gather(*(client(i) for i in range(clients)))
    for c in sessions:
        await c.aclose()
    if errors:
        print(f"  {errors} requests did not answer 200")
    return lat


def _report(title: str, lat: dict[str, list[float]], seconds: float) -> None:
    total = sum(len(v) for v in lat.values())
    print(f"{title}: {total} requests in {seconds:.0f} s = {total / seconds:.0f} req/s")
    for kind, values in lat.items():
        if not values:
            continue
        q = statistics.quantiles(values, n=100)
        verdict = "meets" if q[98] < 100 else "misses"
        print(f"  {kind:9s} n={len(values):6d}  p50 {q[49]:7.1f} ms  p90 {q[89]:7.1f} ms  "
              f"p99 {q[98]:7.1f} ms  ({verdict} the goal p99 < 100 ms)")


WRK_SCRIPT = r"""
-- Generated by bench/portal_bench.py: half dashboard, half failures list (pages 1-5,
-- with and without filters), each request with one of the logged-in sessions' cookies.
local cookies = {%(cookies)s}
local paths = {%(paths)s}
local think_lo, think_hi = %(think_lo)d, %(think_hi)d
local n = 0
math.randomseed(%(seed)d + os.time())
request = function()
  n = n + 1
  local path = paths[(n %% #paths) + 1]
  local cookie = cookies[math.random(#cookies)]
  return wrk.format("GET", path, {["Cookie"] = "yoco_session=" .. cookie})
end
if think_hi > 0 then
  delay = function() return math.random(think_lo, think_hi) end
end
local bad = 0
response = function(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("WRK requests=%%d seconds=%%.3f errors=%%d p50=%%.2f p90=%%.2f "
    .. "p99=%%.2f p999=%%.2f max=%%.2f\n",
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status
      + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000, latency.max / 1000))
end
"""


def _paths(kind: str) -> list[str]:
    """The request mix: ``dashboard``, ``failures`` or ``mixed`` (alternating)."""
    from urllib.parse import urlencode

    fails = []
    for flt in FILTERS:
        for page in range(1, 6):
            fails.append("/contracts/BIG-1/failures?" + urlencode({**flt, "page": str(page)}))
    dash = ["/contracts/BIG-1"] * len(fails)
    if kind == "dashboard":
        return dash
    if kind == "failures":
        return fails
    return [p for pair in zip(dash, fails, strict=True) for p in pair]


def session_cookies(base: str, n: int) -> list[str]:
    """Log ``n`` sessions in; their ``yoco_session`` cookie values."""
    async def go() -> list[str]:
        out = []
        for _ in range(n):
            c = await _login(base)
            out.append(c.cookies["yoco_session"])
            await c.aclose()
        return out

    return asyncio.run(go())


def run_wrk(base: str, cookies: list[str], kind: str, clients: int, seconds: float,
            think_ms: tuple[int, int], threads: int) -> dict[str, float]:
    """Run ``wrk`` (open connections = ``clients``); its latency percentiles in ms."""
    script = WRK_SCRIPT % {
        "cookies": ", ".join(f'"{c}"' for c in cookies),
        "paths": ", ".join(f'"{p}"' for p in _paths(kind)),
        "think_lo": think_ms[0], "think_hi": think_ms[1], "seed": 42,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    cmd = ["wrk", f"-t{threads}", f"-c{clients}", f"-d{int(seconds)}s", "--timeout", "10s",
           "-s", f.name, base]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    line = next(x for x in out.splitlines() if x.startswith("WRK "))
    res = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    res["rps"] = res["requests"] / res["seconds"]
    return res


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def _wrk_report(title: str, r: dict[str, float]) -> None:
    verdict = "meets" if r["p99"] < 100 else "misses"
    print(f"  {title:34s} {int(r['requests']):7d} req  {r['rps']:7.1f} req/s  "
          f"p50 {r['p50']:7.1f}  p90 {r['p90']:7.1f}  p99 {r['p99']:7.1f}  "
          f"p99.9 {r['p999']:7.1f} ms  errors {int(r['errors'])}  ({verdict} p99 < 100 ms)  "
          f"[{_load()}]", flush=True)


def main() -> None:
    """Build the database, start the portal, measure, print."""
    import shutil

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=1,
                        help="yoco serve --workers (uvicorn worker processes)")
    parser.add_argument("--client", choices=("wrk", "python"),
                        default="wrk" if shutil.which("wrk") else "python",
                        help="load generator: wrk (C, default when installed) or the "
                        "in-process Python client (competes with the server for the CPUs)")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--think", type=float, default=1.0,
                        help="mean think time of the paced run, seconds (0: skip it)")
    parser.add_argument("--per-page", action="store_true",
                        help="also measure the dashboard and the failures list alone")
    parser.add_argument("--keep", type=Path, default=None,
                        help="folder for the database; reused by later runs (built once)")
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()

    if args.keep is not None:
        args.keep = args.keep.resolve()
        args.keep.mkdir(parents=True, exist_ok=True)
    url, server, built = _database(args.keep)
    data_dir = (args.keep / "data") if args.keep is not None else Path(
        tempfile.mkdtemp(prefix="yoco-pbench-data-"))
    if not built:
        build(url, args.records, data_dir)
        if args.keep is not None:
            (args.keep / "built").write_text("yes\n")
    if args.build_only:
        print(f"database built: {url}")
        return
    port = _free_port()
    env = {**os.environ, **logins(url), "YOCO_DATA_DIR": str(data_dir),
           "YOCO_WEB_SECRET_KEY": "bench"}
    cmd = [sys.executable, "-m", "yoco.cli", "serve", "--port", str(port)]
    if args.workers != 1:
        cmd += ["--workers", str(args.workers)]
    proc = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(600):
            try:
                if httpx.get(base + "/login", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # Warm-up: the year's figures are computed once per process and cached (until
        # the log grows); with several workers, each computes them once.
        t = time.perf_counter()
        asyncio.run(run_load(base, 1, 0.1, None))
        print(f"first dashboard (cold figures cache) took {time.perf_counter() - t:.2f} s")
        print(f"server: yoco serve --workers {args.workers}; client: {args.client}; "
              f"{args.clients} clients; {_load()}", flush=True)
        if args.client == "python":
            asyncio.run(run_load(base, args.clients, 3, None))
            lat = asyncio.run(run_load(base, args.clients, args.seconds, None))
            _report(f"{args.clients} closed-loop clients", lat, args.seconds)
            if args.think:
                lat = asyncio.run(run_load(base, args.clients, args.seconds, args.think))
                _report(f"{args.clients} clients at 1 request / {args.think} s each", lat,
                        args.seconds)
            return
        cookies = session_cookies(base, args.clients)
        run_wrk(base, cookies, "mixed", args.clients, 5, (0, 0), args.wrk_threads)  # warm-up
        kinds = ["mixed", "dashboard", "failures"] if args.per_page else ["mixed"]
        for kind in kinds:
            r = run_wrk(base, cookies, kind, args.clients, args.seconds, (0, 0),
                        args.wrk_threads)
            _wrk_report(f"{kind}, closed loop (no think time)", r)
        if args.think:
            lo, hi = int(args.think * 500), int(args.think * 1500)
            for kind in kinds:
                r = run_wrk(base, cookies, kind, args.clients, args.seconds, (lo, hi),
                            args.wrk_threads)
                _wrk_report(f"{kind}, think {lo}-{hi} ms", r)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if server is not None and args.keep is None:
            server.cleanup()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
