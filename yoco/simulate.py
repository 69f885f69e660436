"""A generator of realistic, SIMULATED event streams (for the demo and the benchmarks).

Nothing here comes from a real cluster.  Jobs of many sizes run through a
period; failures arrive as a Poisson process at the rates the Meta FAIR
cluster study (HPCA 2025) reports — a mean time to failure near 7.9 hours
for a 1,024-GPU job, i.e. a constant per-GPU rate, so a job of G GPUs fails
every 7.9 × 1024 / G hours on average.  Classes, causes and outcomes follow
a mix typical of a vendor that live-migrates most failures.  Output records
follow the ingestion format (DESIGN section 4), in time order, each failure
before its outcome; event ids are seeded, so a seed gives the same stream, and a
later window end only adds finished jobs (see :class:`StreamConfig`).
"""

from __future__ import annotations

import math
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
    """What to simulate for one contract.

    The stream is a deterministic function of ``seed`` and ``start`` that ``end`` only
    cuts: each lane's job plan and each job's records come from random generators of
    their own, so a later ``end`` gives the same records plus more, never different
    ones (the same event ids with the same content: re-ingesting is a no-op). Only jobs
    whose every record (follow-ups included) lies before ``end`` are emitted, so every
    emitted job is finished and nothing grows with the clock.

    ``records`` is the target size over the window; ``progress_interval_s``, when given,
    fixes the spacing of ``job_progress`` records instead (what keeps the stream
    independent of ``end``).
    """

    contract_id: str
    start: datetime
    end: datetime
    records: int = 10_000
    seed: int = 1
    parallel_jobs: int = 4
    pending_share: float = 0.01
    correction_share: float = 0.01
    exclusion_share: float = 0.01
    progress_interval_s: float | None = None

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("start and end must be timezone-aware")
        if self.end <= self.start:
            raise ValueError("end must be after start")
        if self.records < 10:
            raise ValueError("records must be at least 10")
        if self.parallel_jobs < 1:
            raise ValueError("parallel_jobs must be at least 1")
        if self.progress_interval_s is not None and not self.progress_interval_s >= 1:
            raise ValueError("progress_interval_s must be at least 1")


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


@dataclass(frozen=True, slots=True)
class _Job:
    start: datetime
    end: datetime
    gpus: int
    step_seconds: float
    job_id: str
    rng_key: str


def _plan(cfg: StreamConfig) -> list[_Job]:
    """Jobs of every lane that start before ``cfg.end`` (each lane runs them back to back)."""
    jobs: list[_Job] = []
    for lane in range(cfg.parallel_jobs):
        rng = random.Random(f"{cfg.seed}:{cfg.contract_id}:lane:{lane}")
        t = cfg.start + timedelta(seconds=rng.uniform(0, 86400))
        n = 0
        while t < cfg.end:
            hours = rng.choice((6, 12, 24, 48, 96, 168, 336))
            end = t + timedelta(hours=hours * rng.uniform(0.5, 1.5))
            gpus = rng.choices(GPU_SIZES, GPU_WEIGHTS)[0]
            step_seconds = round(rng.uniform(0.8, 9.0), 3)
            key = f"{cfg.seed}:{cfg.contract_id}:job:{lane}:{n}"
            jobs.append(_Job(t, end, gpus, step_seconds, f"job-{lane}-{n}", key))
            n += 1
            t = end + timedelta(minutes=rng.uniform(5, 240))
    return jobs


Event = tuple[datetime, int, dict[str, object]]


def _job_events(cfg: StreamConfig, job: _Job, interval: float) -> list[Event]:
    """Every record of one job, from a generator seeded by the job alone."""
    rng = random.Random(job.rng_key)
    events: list[Event] = []

    def add(t: datetime, rec: dict[str, object]) -> None:
        rec.setdefault("_id", _uuid(rng))
        events.append((t, len(events), rec))

    start, end, gpus, step_seconds, job_id = (
        job.start, job.end, job.gpus, job.step_seconds, job.job_id)
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
        # A job cannot lose steps it never made (the ledger refuses it as implausible);
        # clamped after drawing, so the random stream is the same as before.
        lost = min(lost, step)
        # A recovery lies within its job (the ledger refuses one that ends after the
        # job's job_finished, docs/definitions.md): clamped the same way.
        recovery = min(recovery, math.floor((end - t).total_seconds() * 1000) / 1000)
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
    add(
        end,
        {
            "kind": "job_finished",
            "job_id": job_id,
            "step": int((end - start).total_seconds() / step_seconds),
        },
    )
    return events


def simulate(cfg: StreamConfig) -> Iterator[dict[str, object]]:
    """Yield the simulated records of one contract's finished jobs, in time order.

    About ``cfg.records`` records over the window (or progress every
    ``cfg.progress_interval_s``); each job from ``job_started`` to ``job_finished``,
    each failure before its outcome.
    """
    jobs = _plan(cfg)
    if cfg.progress_interval_s is not None:
        interval = cfg.progress_interval_s
    else:
        job_seconds = sum((j.end - j.start).total_seconds() for j in jobs)
        hours = sum((j.end - j.start).total_seconds() / 3600 * j.gpus for j in jobs)
        failures = hours / (MTTF_HOURS_AT_1024 * 1024)
        budget = max(cfg.records - 2 * len(jobs) - 2.2 * failures, 1)
        interval = max(job_seconds / budget, 1.0)
    events: list[tuple[datetime, str, int, dict[str, object]]] = []
    for job in jobs:
        mine = _job_events(cfg, job, interval)
        if max(t for t, _, _ in mine) >= cfg.end:
            continue  # not finished (or not followed up) by the window's end: left out
        events.extend((t, job.job_id, order, rec) for t, order, rec in mine)
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    for t, _, _, rec in events:
        body = dict(rec)
        event_id = str(body.pop("_id"))
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
