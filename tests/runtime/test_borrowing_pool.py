"""The shared host pool of spare borrowing (runtime.borrowing) on a real TCPStore: the
policy (who may lend, in which order), one job per host at any time (compare-and-set),
and bad input refused without a change."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from runtime import protocol as P
from runtime.borrowing import HostRecord, PoolClient, parse_endpoint
from runtime.errors import ConfigError
from runtime.supervisor import LaunchConfig

EXAMPLE = "examples/mlp_train.py"


@pytest.fixture
def pool() -> Iterator[str]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    yield f"127.0.0.1:{store.port}"
    del store


def _host(name: str, job: str, priority: int, *, role: str = "train",
          rank: int = 1) -> HostRecord:
    return HostRecord(name=name, job=job, priority=priority, endpoint="127.0.0.1:1",
                      rank=rank, role=role, nproc=1)


def test_only_lower_priority_jobs_lend_lowest_first_spare_hosts_before_training_hosts(
        pool: str) -> None:
    c = PoolClient(pool)
    for rec in (_host("a1", "a", 5), _host("b1", "b", 1), _host("b2", "b", 1, role="spare"),
                _host("c1", "c", 9), _host("h1", "high", 10)):
        c.register(rec)
    assert c.names() == ["a1", "b1", "b2", "c1", "h1"]
    claim = lambda: c.claim(job="high", priority=10, endpoint="127.0.0.1:2", rank=2)  # noqa: E731
    got = [claim() for _ in range(5)]
    # Lowest priority first; its spare host before its training host; never its own
    # host (h1), never a job of equal or higher priority.
    assert [g.name if g else None for g in got] == ["b2", "b1", "a1", "c1", None]
    rec = c.get("b2")
    assert rec is not None and rec[1].state == "lending"
    assert rec[1].borrower == {"job": "high", "priority": 10, "endpoint": "127.0.0.1:2",
                               "rank": 2}
    # A job of priority 5 finds nothing left below it; an equal priority never borrows.
    assert c.claim(job="mid", priority=5, endpoint="x:1", rank=1) is None


def test_a_host_is_claimed_by_one_job_only_under_a_race(pool: str) -> None:
    PoolClient(pool).register(_host("l1", "low", 0))
    won: list[str] = []

    def borrower(job: str) -> None:
        got = PoolClient(pool).claim(job=job, priority=5, endpoint="127.0.0.1:3", rank=1)
        if got is not None:
            won.append(job)

    threads = [threading.Thread(target=borrower, args=(f"j{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    got = PoolClient(pool).get("l1")
    assert got is not None and got[1].borrower is not None
    assert got[1].borrower["job"] == won[0] and got[1].v == 1


def test_an_ended_job_lends_nothing_and_a_resume_refreshes_its_record(pool: str) -> None:
    c = PoolClient(pool)
    c.register(_host("e1", "done", 0))
    c.update("e1", lambda r: HostRecord(**{**_asdict(r), "home_ended": True}))
    assert c.claim(job="x", priority=3, endpoint="h:1", rank=1) is None
    c.register(_host("e1", "done", 2))  # the same job again (--resume): refreshed
    got = c.get("e1")
    assert got is not None and not got[1].home_ended and got[1].priority == 2
    assert c.names() == ["e1"]


def test_bad_input_is_refused_and_changes_nothing(pool: str) -> None:
    c = PoolClient(pool)
    c.register(_host("d1", "one", 0))
    before = c.get("d1")
    with pytest.raises(ConfigError, match="already in the pool for job one"):
        c.register(_host("d1", "two", 0))
    assert c.get("d1") == before and c.names() == ["d1"]
    for bad in ("nohost", "h:", ":1", "h:0", "h:70000", "h:x"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_endpoint(bad)
    with pytest.raises(ValueError, match="unknown host state"):
        HostRecord(**{**_asdict(_host("z", "j", 0)), "state": "gone"})
    with pytest.raises(ValueError, match="borrower"):
        HostRecord(**{**_asdict(_host("z", "j", 0)), "state": "lent"})
    with pytest.raises(ConfigError, match="cannot reach the pool"):
        PoolClient("127.0.0.1:1", timeout_s=0.5)
    with pytest.raises(ConfigError, match="needs a multi-node job"):
        LaunchConfig(script=EXAMPLE, pool=pool)
    assert not dist.TCPStore(*parse_endpoint(pool), is_master=False).check(
        [P.pool_host_key("z")])


def _asdict(r: HostRecord) -> dict[str, object]:
    return {k: getattr(r, k) for k in HostRecord.__slots__}  # type: ignore[attr-defined]
