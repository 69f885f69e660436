"""What a newcomer does while a live generation's groups form (StateTransfer.speculate):
it lays out the state of the member it guesses will send -- and must not wait for a
skeleton that member will never publish.

Seen in a suite run: three workers, two killed in one step, the second seen only after
the first recovery was planned. That generation never formed (a member of it was dead);
its spare, called in, held no state. In the next generation every participant guessed,
from the never-formed generation's members, that this spare was a source: the newcomer
waited for its skeleton for the whole regroup timeout (two minutes) while the others
waited for the newcomer in the vote. Now every participant that will not publish a
skeleton says so at once.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime.transfer import StateTransfer


class _Member:
    """The parts of Membership the transfer's speculation uses."""

    def __init__(self, slot: str, port: int) -> None:
        self.slot = slot
        self.store = dist.TCPStore("127.0.0.1", port, is_master=False,
                                   timeout=timedelta(seconds=30))
        self.regroup_timeout_s = 3600.0  # as good as forever: the wait must end sooner
        self.poll_interval_s = 0.002

    def latest_gen(self) -> int:
        return 2

    def beat(self, _since: float) -> None:
        pass


def _transfer(m: _Member) -> StateTransfer:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    return StateTransfer(membership=m, model=model, optimizer=opt,  # type: ignore[arg-type]
                         device=torch.device("cpu"),
                         state_dict=lambda: {"model": model.state_dict()},
                         load_state_dict=lambda *_a, **_k: None, buffers_per_param=None)


def test_a_guessed_source_without_state_says_so_and_the_newcomer_stops_waiting() -> None:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    # Generation 1 (w3 called in for w0, w1 kept) never formed: w1 had died too.
    # Generation 2: w4 called in for w1. Only w2 holds the state; the guess, from
    # generation 1's members, counts w3 as a source too -- and w4 gets w3.
    plan = P.Plan(gen=2, mode=P.PlanMode.LIVE, members=["w3", "w4", "w2"])
    previous = ["w3", "w1", "w2"]
    w3, w4, w2 = (_Member(s, master.port) for s in ("w3", "w4", "w2"))

    newcomer = _transfer(w4).speculate(plan, previous=previous, has_state=False)
    assert newcomer is not None  # it lays out ahead, from its guessed source w3
    assert _transfer(w3).speculate(plan, previous=previous, has_state=False) is None
    # w2 holds the state but, by the guess, sends to nobody: it publishes nothing either.
    assert _transfer(w2).speculate(plan, previous=previous, has_state=True) is None
    for rank in (0, 2):  # w3, w2: said at once
        master.wait([P.no_skeleton_key(2, rank)], timedelta(seconds=30))

    waiting = threading.Thread(target=newcomer, daemon=True)
    waiting.start()
    waiting.join(timeout=60)
    assert not waiting.is_alive(), "the newcomer still waits for a skeleton nobody sends"


def test_a_guessed_source_with_state_publishes_its_skeleton_and_is_laid_out() -> None:
    # The usual case: w1 killed, w3 called in; w0 and w2 hold the state and the guess is
    # right: w3 lays out where w0's state lands, from the skeleton w0 publishes ahead.
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    plan = P.Plan(gen=2, mode=P.PlanMode.LIVE, members=["w0", "w3", "w2"])
    previous = ["w0", "w1", "w2"]
    w0, w3 = (_Member(s, master.port) for s in ("w0", "w3"))
    receiver = _transfer(w3)
    newcomer = receiver.speculate(plan, previous=previous, has_state=False)
    sender = _transfer(w0).speculate(plan, previous=previous, has_state=True)
    assert newcomer is not None and sender is not None
    sender()
    newcomer()
    assert receiver._rspec is not None  # laid out ahead
    assert not master.check([P.no_skeleton_key(2, 0)])
