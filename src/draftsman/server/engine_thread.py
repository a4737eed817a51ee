"""One thread for every PyTorch call a server makes: loading, profiles, the batch loop.

The CPU kernels run their parallel regions on OpenMP, whose runtime keeps one team of
threads per calling thread. A forward on the thread that loaded the model runs at full
speed; the same forward on a second thread ran 30% slower here (1.5B q4, AMX Xeon, 2 cores:
80 vs 62 ms a token), because two teams then share the cores and the busy one's helpers
sleep between the ~200 parallel regions of a forward instead of spin-waiting. A server
that loads on one thread and decodes on another pays that on every token; one engine
thread doing both does not.

`EngineThread.call(fn)` runs `fn` there and returns its result (or raises its error);
`EngineThread.hosted(target)` is a `threading.Thread` look-alike (start, is_alive, join)
whose target runs there, for a scheduler's long-running loop. Invariant: calls run one at
a time in submission order, so a hosted loop must be started after the calls it needs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any


class EngineThread:
    def __init__(self, name: str = "draftsman-engine") -> None:
        self._tasks: queue.Queue[tuple[Future, Callable[..., Any], tuple]] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def _serve(self) -> None:
        while True:
            future, fn, args = self._tasks.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the caller, which re-raises it
                future.set_exception(e)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._tasks.put((future, fn, args))
        return future

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.submit(fn, *args).result()

    def hosted(self, target: Callable[[], Any]) -> Hosted:
        return Hosted(self, target)


class Hosted:
    """A loop that runs on an EngineThread, with the part of threading.Thread a scheduler
    uses: start(), is_alive(), join(timeout)."""

    def __init__(self, engine_thread: EngineThread, target: Callable[[], Any]) -> None:
        self._engine_thread = engine_thread
        self._target = target
        self._future: Future | None = None

    def start(self) -> None:
        self._future = self._engine_thread.submit(self._target)

    def is_alive(self) -> bool:
        return self._future is not None and not self._future.done()

    def join(self, timeout: float | None = None) -> None:
        if self._future is not None:
            wait([self._future], timeout)
