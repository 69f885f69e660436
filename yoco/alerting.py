"""The alerts wired into the product: one run (detect, then deliver), the refusal hook.

:func:`run_alerts` is what ``yoco serve``'s scheduler does after each close-due run,
what ``yoco billing close-due`` does after closing (cron, systemd, CronJob) and what
``yoco alerts run`` does: the detector in one transaction under its advisory lock, then
every pending delivery, one transaction each (see :mod:`alerts.detect`,
:mod:`alerts.send`). Safe from several places at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from alerts.config import AlertsConfig, retry_policy_of
from alerts.detect import DetectRun, detect_run
from alerts.refusals import RefusalRecorder
from alerts.send import Delivered, deliver_next, describe

if TYPE_CHECKING:
    import httpx
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

    from yoco.settings import Settings

log = logging.getLogger("yoco.alerts")

#: At most this many deliveries are sent by one run (the rest wait for the next run).
MAX_DELIVERIES_PER_RUN = 1000


def alerts_config(settings: Settings) -> AlertsConfig:
    """The alerts' settings from ``YOCO_ALERTS_*`` (ValueError names a bad one)."""
    return AlertsConfig(
        checkpoint_max_age=timedelta(seconds=settings.alerts_checkpoint_max_age_s),
        retry=retry_policy_of(settings),
        report_emails=settings.alerts_report_emails,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertsRun:
    """One run: the detector's (``detect``) and every delivery it sent."""

    detect: DetectRun | None
    sent: list[Delivered] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Deliveries that failed in this run."""
        return sum(1 for d in self.sent if d.status == "failed")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON of the run."""
        return {
            "detect": self.detect.to_json() if self.detect else None,
            "sent": [describe(d) for d in self.sent],
        }

    def summary(self) -> str:
        """One line for a log or a terminal."""
        if self.detect is not None and not self.detect.ran:
            head = "alerts: another detector run holds the lock (nothing detected)"
        elif self.detect is not None:
            head = f"alerts: {len(self.detect.raised)} new event(s)"
        else:
            head = "alerts:"
        ok = sum(1 for d in self.sent if d.status == "delivered")
        return f"{head}; {ok} delivered, {self.failed} failed"


@contextmanager
def _unit(engine: Engine) -> Iterator[Session]:
    from yoco.database import unit_of_work

    with unit_of_work(engine) as s:
        yield s


def deliver_pending(
    engine: Engine,
    config: AlertsConfig,
    *,
    delivery_ids: list[int] | None = None,
    replay: bool = False,
    clock: Callable[[], datetime] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
    env: Mapping[str, str] | None = None,
    client: httpx.Client | None = None,
    limit: int = MAX_DELIVERIES_PER_RUN,
) -> list[Delivered]:
    """Send pending deliveries (or exactly ``delivery_ids``), one transaction each."""
    sent: list[Delivered] = []
    targets: list[int | None] = list(delivery_ids) if delivery_ids is not None else []
    from reports.issued import document_files

    kwargs: dict[str, Any] = {"policy": config.policy, "sleep": sleep, "jitter": jitter,
                              "env": env, "client": client, "replay": replay,
                              "files": document_files}
    if clock is not None:
        kwargs["clock"] = clock
    while len(sent) < limit:
        if delivery_ids is not None:
            if not targets:
                break
            target = targets.pop(0)
        else:
            target = None
        with _unit(engine) as s:
            d = deliver_next(s, delivery_id=target, **kwargs)
        if d is None:
            if delivery_ids is None:
                break
            continue
        if d.status == "failed":
            log.error("alert delivery %d to %s failed after %d attempt(s): %s (replay with "
                      "`yoco alerts replay %d`)", d.delivery_id, d.destination, d.attempts,
                      d.error, d.delivery_id)
        sent.append(d)
    return sent


def run_alerts(
    engine: Engine,
    config: AlertsConfig,
    *,
    now: datetime | None = None,
    wait: bool = False,
    deliver: bool = True,
    **send: Any,
) -> AlertsRun:
    """Detect (one transaction, advisory-locked), then send what is pending."""
    with _unit(engine) as s:
        det = detect_run(s, now=now or datetime.now(UTC), config=config, wait=wait)
    sent = deliver_pending(engine, config, **send) if deliver else []
    return AlertsRun(detect=det, sent=sent)


def refusal_recorder(engine_of: Callable[[], Engine], source: str) -> RefusalRecorder:
    """A :class:`RefusalRecorder` writing through the engine ``engine_of()`` returns."""

    @contextmanager
    def unit() -> Iterator[Session]:
        with _unit(engine_of()) as s:
            yield s

    return RefusalRecorder(unit, source)
