"""Generation off the event loop: a bounded queue in front of `parallel` worker threads.

Generation is CPU-bound PyTorch, so it never runs on the asyncio loop. `Scheduler.submit`
admits a prepared `Request` (or refuses it with 429 when `parallel + max_queue` requests are
already admitted), a worker thread runs `engine.run(request)` and hands every `Event` to the
request's asyncio queue with `call_soon_threadsafe`, then a final `Finished`.

Invariants:
- every admitted job ends with exactly one `Finished` on its queue, whatever happens
  (completed, cancelled while waiting, cancelled while running, failed, shut down);
- `waiting + running` counts admitted jobs that have not finished, so the 429 bound is
  exact; a job cancelled while waiting leaves the count at once, not when a worker pops it,
  and a running job leaves it before its `Finished` is emitted, so before its response ends;
- a cancelled running job stops at its next step: the worker checks the flag between
  events and closes the engine's iterator, which frees the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from draftsman.core import Stats, Step
from draftsman.engine import Engine, Event, Request
from draftsman.errors import ModelNotFoundError
from draftsman.proposers.history import HistoryStore, Scope
from draftsman.server.engine_thread import EngineThread, Hosted
from draftsman.server.schemas import ApiError

log = logging.getLogger("draftsman.server")

WAITING, RUNNING, DONE, CANCELLED = "waiting", "running", "done", "cancelled"


@dataclass
class Finished:
    """The last item on a job's queue. `error` is set when generation raised."""

    cancelled: bool
    queue_seconds: float
    run_seconds: float
    error: BaseException | None = None


class Job:
    """One admitted request: its events arrive on `items()`; `cancel()` is idempotent."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop,
                 on_cancel: Callable[[Job], None]) -> None:
        self.request = request
        self.loop = loop
        self.state = WAITING
        self.enqueued_at = time.perf_counter()
        self.started_at: float | None = None
        self._queue: asyncio.Queue[Event | Finished] = asyncio.Queue()
        self._cancel = threading.Event()
        self._on_cancel = on_cancel

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        if not self._cancel.is_set():
            self._cancel.set()
            self._on_cancel(self)

    def emit(self, item: Event | Finished) -> None:
        """Called from a worker thread; drops the item if the loop is gone (shutdown)."""
        try:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # event loop closed
            self._cancel.set()

    async def items(self) -> AsyncIterator[Event | Finished]:
        """Events in order, then the `Finished` item; nothing after it."""
        while True:
            item = await self._queue.get()
            yield item
            if isinstance(item, Finished):
                return


@dataclass
class Tally:
    """What the client has been sent so far: text, tokens, steps, timing of the first token."""

    started: float = field(default_factory=time.perf_counter)
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    steps: list[Step] = field(default_factory=list)
    finish: str | None = None
    first_token_at: float | None = None
    finished: Finished | None = None

    def add(self, event: Event) -> None:
        self.steps.append(event.step)
        self.text.append(event.text)
        self.tokens += len(event.token_ids)
        if event.token_ids and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if event.finish is not None:
            self.finish = event.finish

    @property
    def cancelled(self) -> bool:
        return self.finished is not None and self.finished.cancelled and self.finish is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    def stats(self, method: str, options: dict[str, Any]) -> dict[str, Any]:
        """The `draftsman` object of a response: method, acceptance and speed."""
        s = Stats.from_steps(self.steps)
        run = self.finished.run_seconds if self.finished else 0.0
        return {
            "method": method,
            "options": options,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "alpha": s.alpha,
            "acceptance_rate": s.acceptance_rate,
            "tau": s.tau,
            "gamma": s.mean_gamma,
            "target_forwards": s.target_forwards,
            "draft_forwards": s.draft_forwards,
            "new_tokens": s.new_tokens,
            "seconds": run,
            "tokens_per_second": s.new_tokens / run if run > 0 else 0.0,
            "queue_seconds": self.finished.queue_seconds if self.finished else 0.0,
            "time_to_first_token": self.ttft,
            "finish": self.finish,
        }


class QueueFull(ApiError):
    def __init__(self, retry_after: int, capacity: int, why: str = "") -> None:
        busy = why or f"{capacity} requests admitted"
        super().__init__(429, f"the server is busy ({busy}); retry in {retry_after} s",
                         code="rate_limit_exceeded", headers={"Retry-After": str(retry_after)})


class Scheduler:
    """Admission control plus `parallel` workers sharing one engine. Worker 0 runs on
    `engine_thread` when given (the thread that loaded the engine: its forwards run at
    in-process speed, server/engine_thread.py), the others on daemon threads of their own."""

    def __init__(self, engine: Engine, *, parallel: int = 1, max_queue: int = 16,
                 history: HistoryStore | None = None,
                 engine_thread: EngineThread | None = None) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.engine_thread = engine_thread
        self.history = history  # each finished request's prompt and reply go there
        self.parallel = parallel
        self.max_queue = max_queue
        self.waiting = 0
        self.running = 0
        self.arriving = 0  # requests received and being prepared, not yet submitted
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._all: set[Job] = set()  # admitted and not finished
        self._closed = False
        self._mean_seconds = 1.0  # moving average of run time, for Retry-After
        self._threads = self._make_threads()

    def _make_threads(self) -> list[threading.Thread | Hosted]:
        threads: list[threading.Thread | Hosted] = [
            threading.Thread(target=self._work, name=f"draftsman-worker-{i}", daemon=True)
            for i in range(self.parallel)]
        if self.engine_thread is not None:
            threads[0] = self.engine_thread.hosted(self._work)
        return threads

    # ---- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, cancel admitted ones (each stops at its next step), join."""
        with self._lock:
            self._closed = True
            pending = list(self._all)
        for job in pending:
            job.cancel()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))

    @property
    def healthy(self) -> bool:
        return not self._closed and all(t.is_alive() for t in self._threads)

    @property
    def capacity(self) -> int:
        return self.parallel + self.max_queue

    # ---- admission ---------------------------------------------------------------------
    @contextlib.contextmanager
    def arrival(self) -> Iterator[None]:
        """Around a request's preparation and submission: while any is inside, the batch
        knows more work is on its way (batch_worker.py's gather)."""
        with self._lock:
            self.arriving += 1
        try:
            yield
        finally:
            with self._lock:
                self.arriving -= 1

    def submit(self, request: Request) -> Job:
        """Admit `request` or raise QueueFull (429) / ApiError 503 when shutting down."""
        job = Job(request, asyncio.get_running_loop(), self._cancelled)
        with self._lock:
            if self._closed:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if self.waiting + self.running >= self.capacity:
                raise QueueFull(self._retry_after(), self.capacity)
            self._reserve(job)
            self.waiting += 1
            self._all.add(job)
        self._jobs.put(job)
        return job

    def _reserve(self, job: Job) -> None:
        """Admission beyond the request count (under the lock); raise QueueFull to refuse."""

    def _release(self, job: Job) -> None:
        """Undo `_reserve` (under the lock), when the job leaves the count."""

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: queued work spread over the workers."""
        ahead = self.waiting + self.running
        return max(1, min(60, math.ceil(self._mean_seconds * ahead / self.parallel)))

    def _cancelled(self, job: Job) -> None:
        with self._lock:
            if job.state != WAITING:
                return  # running: the worker stops at the next step; done: nothing to do
            job.state = CANCELLED
            self.waiting -= 1
            self._all.discard(job)
            self._release(job)
        job.emit(Finished(cancelled=True, queue_seconds=time.perf_counter() - job.enqueued_at,
                          run_seconds=0.0))

    # ---- workers -----------------------------------------------------------------------
    def _work(self, jobs: queue.Queue[Job | None] | None = None) -> None:
        """Run the jobs of `jobs` (default: the admission queue) one at a time until None."""
        jobs = self._jobs if jobs is None else jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            if not self._start(job):
                continue  # cancelled while waiting: already finished and uncounted
            finished, reply = None, []
            try:
                finished, reply = self._run(job)
            finally:
                self._finish(job, finished or Finished(cancelled=True, queue_seconds=0.0,
                                                       run_seconds=0.0), reply)

    def _start(self, job: Job) -> bool:
        """Count a waiting job as running; False if it was cancelled while waiting."""
        with self._lock:
            if job.state != WAITING:
                return False
            job.state = RUNNING
            self.waiting -= 1
            self.running += 1
        return True

    def _finish(self, job: Job, finished: Finished, reply: list[int]) -> None:
        """Free the job's slot, then end its response: the slot is free before the client
        can see the end, so a request sent right after it is never refused for this one
        (exact 429 bound). Then remember the exchange for history drafters."""
        with self._lock:
            job.state = DONE
            self.running -= 1
            self._all.discard(job)
            self._release(job)
        job.emit(finished)
        scope = job.request.config.history
        if self.history is not None and finished.error is None and isinstance(scope, Scope):
            # after the client has its answer: remembering costs it no latency
            self.history.add(scope.name, job.request.prompt_ids + reply)

    def _run(self, job: Job) -> tuple[Finished, list[int]]:
        """Generate until done or cancelled; returns the `Finished` to emit (the caller
        emits it after freeing the slot) and the reply's tokens."""
        job.started_at = time.perf_counter()
        queued = job.started_at - job.enqueued_at
        error: BaseException | None = None
        reply: list[int] = []
        try:
            events = self.engine.run(job.request)
            try:
                for event in events:
                    if job.cancelled:
                        break  # closing the iterator stops generation at this step
                    job.emit(event)
                    reply += event.token_ids
            finally:
                events.close()
        except Exception as exc:  # reported to the client; the worker keeps serving
            log.exception("generation failed")
            error = exc
        seconds = time.perf_counter() - job.started_at
        self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * seconds
        return Finished(cancelled=job.cancelled, queue_seconds=queued, run_seconds=seconds,
                        error=error), reply


def pin_models(engine: Engine, drafts: list[str], default_draft: str | None,
               vocabs: frozenset[int | None] = frozenset({None})) -> None:
    """Freeze the engine's companion models to those loaded at start-up.

    After this, a request naming a model that is not resident (`draftsman.draft` = some path)
    or a `draft_vocab` the drafts were not loaded with (`vocabs`; None: the whole vocabulary)
    gets 404 instead of making the server read or download weights mid-request; a method
    that needs a draft and is given none uses the server's `--draft` (`default_draft`).
    Implemented by shadowing two bound methods on this engine instance only.
    """
    resident = {engine.target.name, *drafts}
    load = engine.model
    fallback = engine.default_draft

    def model(spec: str, dtype=None, vocab: int | None = None):
        if spec not in resident:
            raise ModelNotFoundError(
                f"model {spec!r} is not loaded in this server; available drafts: "
                f"{', '.join(drafts) or 'none'} (and the drafters ngram, prompt-lookup, suffix)")
        if dtype is not None and engine.companion_dtype(dtype) != engine.companion_dtype():
            raise ModelNotFoundError(
                f"model {spec!r} is loaded in this server as {engine.companion_dtype()}, "
                f"not {dtype}")
        if vocab not in vocabs:
            loaded = ", ".join("its whole vocabulary" if v is None else f"draft_vocab={v}"
                               for v in sorted(vocabs, key=lambda v: -1 if v is None else v))
            raise ModelNotFoundError(f"model {spec!r} is loaded in this server with {loaded}, "
                                     f"not draft_vocab={vocab}")
        return load(spec, None, vocab)

    def default() -> str:
        return default_draft if default_draft is not None else fallback()

    engine.model = model  # type: ignore[method-assign]
    engine.default_draft = default  # type: ignore[method-assign]
