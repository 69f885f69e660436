"""A generator of realistic, SIMULATED event streams (for the demo and the benchmarks).

Nothing here comes from a real cluster.  Jobs of many sizes run through a
period; failures arrive as a Poisson process at the rates the Meta FAIR
cluster study (HPCA 2025) reports — a mean time to failure near 7.9 hours
for a 1,024-GPU job, i.e. a constant per-GPU rate, so a job of G GPUs fails
every 7.9 × 1024 / G hours on average.  Classes, causes and outcomes follow
a mix typical of a vendor that live-migrates most failures.  Output records
follow the ingestion format (DESIGN section 4), in time order, each failure
before its outcome; event ids are seeded, so a seed gives the same stream.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from billing import risk

MTTF_HOURS_AT_1024 = 7.9
GPU_SIZES = (8, 16, 64, 128, 256, 512, 1024, 2048, 4096)
GPU_WEIGHTS = (20, 15, 20, 12, 10, 8, 8, 4, 3)
# One home for the mix: the risk model prices the guarantee on the same assumptions.
CLASS_MIX = risk.CLASS_MIX
CAUSES = risk.CAUSE_MIX
OUTCOME_MIX = risk.OUTCOME_MIX


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamConfig:
    """What to simulate for one contract."""

    contract_id: str
    start: datetime
    end: datetime
    records: int = 10_000
    seed: int = 1
    parallel_jobs: int = 4
    pending_share: float = 0.01
    correction_share: float = 0.01
    exclusion_share: float = 0.01

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("start and end must be timezone-aware")
        if self.end <= self.start:
            raise ValueError("end must be after start")
        if self.records < 10:
            raise ValueError("records must be at least 10")
        if self.parallel_jobs < 1:
            raise ValueError("parallel_jobs must be at least 1")


def _pick(rng: random.Random, mix: tuple[tuple[str, float], ...]) -> str:
    x = rng.random() * sum(w for _, w in mix)
    for name, w in mix:
        x -= w
        if x < 0:
            return name
    return mix[-1][0]


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _ts(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def simulate(cfg: StreamConfig) -> Iterator[dict[str, object]]:
    """Yield about ``cfg.records`` simulated records for one contract, in time order."""
    rng = random.Random(cfg.seed)
    span = (cfg.end - cfg.start).total_seconds()
    # Plan jobs in parallel lanes, each lane running jobs back to back.
    jobs: list[tuple[datetime, datetime, int, float, str]] = []
    for lane in range(cfg.parallel_jobs):
        t = cfg.start + timedelta(seconds=rng.uniform(0, min(span * 0.05, 86400)))
        n = 0
        while t < cfg.end:
            hours = rng.choice((6, 12, 24, 48, 96, 168, 336))
            end = min(t + timedelta(hours=hours * rng.uniform(0.5, 1.5)), cfg.end)
            gpus = rng.choices(GPU_SIZES, GPU_WEIGHTS)[0]
            step_seconds = round(rng.uniform(0.8, 9.0), 3)
            jobs.append((t, end, gpus, step_seconds, f"job-{lane}-{n}"))
            n += 1
            t = end + timedelta(minutes=rng.uniform(5, 240))
    # Failures per job, then the progress interval that lands near cfg.records.
    events: list[tuple[datetime, int, dict[str, object]]] = []
    order = 0

    def add(t: datetime, rec: dict[str, object]) -> None:
        nonlocal order
        events.append((t, order, rec))
        order += 1

    job_seconds = 0.0
    for start, end, gpus, step_seconds, job_id in jobs:
        job_seconds += (end - start).total_seconds()
        add(start, {"kind": "job_started", "job_id": job_id, "gpus": gpus})
        mttf_h = MTTF_HOURS_AT_1024 * 1024 / gpus
        t = start
        while True:
            t = t + timedelta(hours=rng.expovariate(1 / mttf_h))
            if t >= end:
                break
            cls = _pick(rng, CLASS_MIX)
            cause = rng.choices([c for c, _ in CAUSES[cls]], [w for _, w in CAUSES[cls]])[0]
            step = int((t - start).total_seconds() / step_seconds)
            fid = _uuid(rng)
            node = f"node-{rng.randrange(1, max(2, gpus // 8) + 1):04d}"
            add(
                t,
                {
                    "kind": "failure",
                    "job_id": job_id,
                    "failure_class": cls,
                    "cause": cause,
                    "node": node,
                    "gpu": rng.randrange(8),
                    "step": step,
                    "_id": fid,
                },
            )
            if rng.random() < cfg.pending_share:
                continue
            outcome = _pick(rng, OUTCOME_MIX[cls])
            # Rollbacks lose the steps since the last checkpoint (taken every
            # ~30 min) and idle the whole job while it restarts.
            since_checkpoint = max(1, int(1800 / step_seconds))
            if outcome == "live_migrated":
                recovery, lost = round(rng.uniform(0.08, 4.0), 3), 0
                affected = min(8, gpus)
            elif outcome == "rolled_back":
                recovery = round(rng.uniform(120, 900), 3)
                lost, affected = rng.randrange(1, since_checkpoint + 1), gpus
            else:
                recovery = round(rng.uniform(600, 3600), 3)
                lost, affected = rng.randrange(1, since_checkpoint + 1), gpus
            out_t = t + timedelta(seconds=recovery)
            add(
                out_t,
                {
                    "kind": "outcome",
                    "failure_event_id": fid,
                    "outcome": outcome,
                    "lost_steps": lost,
                    "recovery_seconds": recovery,
                    "step_seconds": step_seconds,
                    "gpus_affected": affected,
                },
            )
            if outcome != "live_migrated" and rng.random() < cfg.correction_share * 10:
                # A later correction: the migration had succeeded after all.
                add(
                    out_t + timedelta(minutes=rng.uniform(5, 600)),
                    {
                        "kind": "outcome",
                        "failure_event_id": fid,
                        "outcome": "live_migrated",
                        "lost_steps": 0,
                        "recovery_seconds": recovery,
                        "step_seconds": step_seconds,
                        "gpus_affected": affected,
                    },
                )
            if rng.random() < cfg.exclusion_share:
                add(
                    out_t + timedelta(hours=rng.uniform(1, 48)),
                    {
                        "kind": "exclusion",
                        "failure_event_id": fid,
                        "reason": "root cause outside the vendor's control (simulated review)",
                        "approved_by": "sla-desk@vendor.example",
                    },
                )
        if end < cfg.end:
            add(
                end,
                {
                    "kind": "job_finished",
                    "job_id": job_id,
                    "step": int((end - start).total_seconds() / step_seconds),
                },
            )
    budget = max(cfg.records - len(events), 1)
    interval = max(job_seconds / budget, 1.0)
    for start, end, _gpus, step_seconds, job_id in jobs:
        n = int((end - start).total_seconds() // interval)
        for i in range(1, n + 1):
            t = start + timedelta(seconds=i * interval)
            if t >= end:
                break
            add(
                t,
                {
                    "kind": "job_progress",
                    "job_id": job_id,
                    "step": int(i * interval / step_seconds),
                    "step_seconds": step_seconds,
                },
            )
    events.sort(key=lambda e: (e[0], e[1]))
    for t, _, rec in events:
        if t >= cfg.end and rec["kind"] != "outcome":
            continue
        body = dict(rec)
        event_id = str(body.pop("_id")) if "_id" in body else _uuid(rng)
        yield {
            "kind": body.pop("kind"),
            "event_id": event_id,
            "contract_id": cfg.contract_id,
            "occurred_at": _ts(t),
            **body,
        }


def expected_failures(gpus: int, hours: float) -> float:
    """Mean number of failures of a ``gpus``-GPU job running ``hours`` (Meta rate)."""
    return hours * gpus / (MTTF_HOURS_AT_1024 * 1024)


__all__ = ["StreamConfig", "expected_failures", "simulate"]
