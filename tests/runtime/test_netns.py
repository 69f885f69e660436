"""The partition and freeze harness itself (tests/runtime/netns.py): hosts are remote to
one another and to the test, a cut link cuts and a healed one carries again, a frozen
host is stopped and a thawed one runs, and nothing is left behind."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from runtime.nodepool import machine_id
from tests.runtime.netns import Netns, _ip, _state

# A TCP connection from host 1 to a listener on host 0: "ok" or the error.
CONNECT = ("import socket,sys\n"
           "s=socket.socket(); s.settimeout(1.5)\n"
           "try:\n s.connect((sys.argv[1], 29999)); print('ok')\n"
           "except OSError as e: print('error', e)\n")
LISTEN = ("import socket\n"
          "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', 29999)); s.listen(16)\n"
          "while True: s.accept()[0].close()\n")


def test_hosts_are_remote_and_can_be_cut_healed_frozen_and_thawed(
        netns: Callable[[int], Netns], tmp_path: Path) -> None:
    net = netns(2)
    ids = {net.run(k, [sys.executable, "-c", "from runtime.nodepool import machine_id;"
                       "print(machine_id())"]).stdout.strip() for k in (0, 1)}
    assert len(ids) == 2 and machine_id() not in ids  # every host its own machine
    listener = net.popen(0, [sys.executable, "-c", LISTEN], env={}, log=tmp_path / "l.log")

    def connect() -> str:
        return net.run(1, [sys.executable, "-c", CONNECT, net.address(0)]).stdout.strip()

    for _ in range(100):  # the listener starts
        if connect() == "ok":
            break
        time.sleep(0.1)
    assert connect() == "ok"
    net.cut(1)
    assert connect().startswith("error")
    net.heal(1)
    for _ in range(100):  # the bridge port forwards again after its (short) learning
        if connect() == "ok":
            break
        time.sleep(0.1)
    assert connect() == "ok"
    # A host's only route is its switch's subnet: nothing of theirs can leave the machine.
    for ns in net.names:
        routes = _ip("-n", ns, "route", "show", "table", "all").stdout
        assert [ln.split()[0] for ln in routes.splitlines() if "dev eth0" in ln
                and not ln.startswith(("local", "broadcast", "multicast", "fe80", "ff00"))] \
            == ["10.231.0.0/24"], routes
        assert "default" not in routes, routes
    assert listener.pid in net.freeze(0) and _state(listener.pid) == "T"
    net.thaw(0)
    assert _state(listener.pid) in "RS"
    net.close()
    assert listener.wait(timeout=10) != 0  # killed with its host
    assert not any(name in _ip("netns", "list").stdout for name in (net.switch, *net.names))
