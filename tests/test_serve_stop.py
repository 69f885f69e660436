"""`yoco serve` stops on SIGTERM even when the handler's SystemExit is lost.

Python runs a signal handler between two bytecodes of the main thread, wherever it is;
inside a garbage-collection callback its exception is reported as "Exception ignored"
and dropped. A loaded CI run saw exactly that: a SIGTERM sent while `yoco serve` was still
starting (before uvicorn had put its own handler in place) raised its SystemExit inside
SQLAlchemy's weakref callback, and the server then ran on. The handler now notes the
request first, and the server checks the note at every tick. In-process: no server
process, no signal -- the handler is called where its exception is dropped, and the
server is run on a thread with the note already set or set while it serves.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from typing import Any

import pytest
import uvicorn

from yoco.cli_web import _sigterm_handler, _stoppable_server


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: lifespan accepted, every request a 204."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _server(stop: threading.Event) -> Any:
    return _stoppable_server(
        uvicorn.Config(_app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"),
        stop)


def test_the_handler_notes_the_stop_even_where_its_exit_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    handler = _sigterm_handler(stop)
    with pytest.raises(SystemExit) as exc:
        handler(15, None)
    assert exc.value.code == 0 and stop.is_set()

    # Where the failure happened: inside a weakref callback, whose exception Python
    # hands to sys.unraisablehook and drops.
    stop = threading.Event()
    handler = _sigterm_handler(stop)
    dropped: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)

    class Tracked:
        pass

    obj = Tracked()
    ref = weakref.ref(obj, lambda _r: handler(15, None))
    del obj
    gc.collect()
    assert ref() is None
    assert [type(u.exc_value) for u in dropped] == [SystemExit]  # lost, as in CI...
    assert stop.is_set()  # ...but noted


def test_a_stop_noted_before_the_server_starts_still_stops_it() -> None:
    stop = threading.Event()
    stop.set()
    server = _server(stop)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the server did not stop"
    assert server.started  # it came up, saw the note at its first tick, shut down


def test_a_stop_noted_while_it_serves_stops_it() -> None:
    stop = threading.Event()
    server = _server(stop)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        thread.join(0.1)
    assert server.started
    assert thread.is_alive()  # serving: nothing asked it to stop
    stop.set()
    thread.join(60)
    assert not thread.is_alive(), "the server did not stop"
