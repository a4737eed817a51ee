"""Generation in shared forwards: the server's requests decoded together by one scheduler.

`BatchingScheduler` keeps the admission rules of `Scheduler` (worker.py: the 429 bound, a
cancelled or finished request's slot free before its response ends) and replaces the
`parallel` worker threads, each running one request alone, by one thread that runs the step
scheduler (batching/scheduler.py): up to `parallel` requests decode together, one target
forward per step, joining and leaving at step boundaries. Requests whose method cannot share
a forward (big-little, pipelined, tree speculation, parallel prompt decoding) run as before,
one at a time on a worker thread of their own.

KV memory is bounded in tokens: each admitted request reserves prompt + max_tokens + its
largest γ + 2 cache slots until it ends, and a request that would pass `max_kv_tokens` is
refused with 429 like a full queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from draftsman.batching.scheduler import BatchConfig, BatchScheduler, StepReport, Ticket
from draftsman.core import Step
from draftsman.engine import Engine
from draftsman.proposers.history import HistoryStore
from draftsman.server.engine_thread import EngineThread, Hosted
from draftsman.server.worker import Finished, Job, QueueFull, Scheduler

log = logging.getLogger("draftsman.server")

GAMMA_HEADROOM = 18  # slots a request may use past prompt + max_tokens (max γ 16 + 2)


def kv_bytes_per_token(engine: Engine) -> int:
    c = engine.target.config
    element = 4 if str(engine.dtype) == "torch.float32" else 2
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * element


class BatchingScheduler(Scheduler):
    """See the module docstring. `on_step(report)` hears about every batched step."""

    def __init__(self, engine: Engine, *, parallel: int = 1, max_queue: int = 16,
                 history: HistoryStore | None = None, prefill_chunk: int = 128,
                 adaptive: bool = True, prefill_stall: float = 2.0,
                 max_step_cost: float | None = None, max_step_rows: int | None = None,
                 max_kv_tokens: int | None = None, gather: float = 0.0,
                 row_cost: Callable[[int], float] | None = None,
                 on_step: Callable[[StepReport], None] | None = None,
                 engine_thread: EngineThread | None = None) -> None:
        self.batch = BatchScheduler(engine.target.model, BatchConfig(
            max_batch=parallel, prefill_chunk=prefill_chunk, adaptive=adaptive,
            prefill_stall=prefill_stall, max_step_cost=max_step_cost,
            max_step_rows=max_step_rows), row_cost)
        self.max_kv_tokens = max_kv_tokens
        # the longest an idle batch waits, after its first job, for requests still being
        # received (Scheduler.arrival), so that a burst's prompts are read in one step
        # (scheduler.py) rather than one after another beside the first one's decoding;
        # a lone request never waits
        self.gather = gather
        self.kv_reserved = 0
        self.on_step = on_step
        self._alone: queue.Queue[Job | None] = queue.Queue()
        self._tickets: dict[int, tuple[Job, Ticket]] = {}
        # the batch loop runs on engine_thread when given (engine_thread.py)
        super().__init__(engine, parallel=parallel, max_queue=max_queue, history=history,
                         engine_thread=engine_thread)

    def _make_threads(self) -> list[threading.Thread | Hosted]:
        batch = (self.engine_thread.hosted(self._loop) if self.engine_thread else
                 threading.Thread(target=self._loop, name="draftsman-batch", daemon=True))
        return [batch,
                # requests that cannot share a forward, one at a time beside the batch
                threading.Thread(target=self._work, args=(self._alone,),
                                 name="draftsman-worker-alone", daemon=True)]

    # ---- KV memory ----------------------------------------------------------------------
    @staticmethod
    def kv_need(job: Job) -> int:
        return len(job.request.prompt_ids) + job.request.config.max_new_tokens + GAMMA_HEADROOM

    def _reserve(self, job: Job) -> None:
        need = self.kv_need(job)
        if self.max_kv_tokens is not None and self.kv_reserved + need > self.max_kv_tokens:
            raise QueueFull(self._retry_after(), self.capacity,
                            f"KV cache budget: {self.kv_reserved} of {self.max_kv_tokens} "
                            f"tokens reserved, this request needs {need}")
        self.kv_reserved += need

    def _release(self, job: Job) -> None:
        self.kv_reserved -= self.kv_need(job)

    def close(self, timeout: float = 10.0) -> None:
        self._alone.put(None)
        super().close(timeout)

    # ---- the batch thread ---------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            if not self._take_jobs(block=self.batch.idle):
                return
            for job, ticket in list(self._tickets.values()):
                if job.cancelled:
                    self.batch.cancel(ticket)
            if self.batch.idle:
                continue
            try:
                self.batch.step()
            except Exception as exc:  # noqa: BLE001 - a bug outside any one request's work:
                log.exception("batched step failed")  # end every request, keep serving
                self.batch.fail_all(exc)  # each ends with its Finished
            if self.on_step is not None and self.batch.last is not None:
                self.on_step(self.batch.last)
                self.batch.last = None

    def _gathering(self, deadline: float | None) -> bool:
        """Whether to keep waiting for requests still being received."""
        return (deadline is not None and self.arriving > 0
                and time.perf_counter() < deadline)

    def _room(self) -> bool:
        return len(self.batch.active) + self.batch.waiting < self.parallel

    def _take_jobs(self, block: bool) -> bool:
        """Move admitted jobs into the batch while it has room (waiting for one when idle);
        jobs beyond stay queued, and waiting, where a cancel frees them at once. After an
        idle wait, requests still being received join it for up to `gather` seconds. False
        on shutdown."""
        deadline = None
        while block or self._room():
            try:
                if block:
                    job = self._jobs.get()
                elif self._gathering(deadline):  # a request is on its way: a short wait
                    job = self._jobs.get(timeout=0.002)
                else:
                    job = self._jobs.get(block=False)
            except queue.Empty:
                if self._gathering(deadline):
                    continue
                return True
            if block and self.gather > 0:
                deadline = time.perf_counter() + self.gather
            if job is None:
                for _, ticket in list(self._tickets.values()):
                    self.batch.cancel(ticket)
                while not self.batch.idle:
                    self.batch.step()
                return False
            block = False
            if not getattr(job.request.strategy, "batchable", False):
                self._alone.put(job)  # its worker counts it running when it starts
                continue
            if self._start(job):  # else cancelled while waiting: finished and uncounted
                self._join(job)
        return True

    def _join(self, job: Job) -> None:
        job.started_at = time.perf_counter()
        request = job.request
        event_of = self.engine.text_events(request.stops)
        reply: list[int] = []

        def on_step(step: Step) -> None:
            event = event_of(step)
            if job.cancelled:
                return
            job.emit(event)
            reply.extend(event.token_ids)
            if event.finish is not None:
                ticket.finished = True

        def on_end(ticket: Ticket) -> None:
            self._tickets.pop(id(job), None)
            if ticket.error is not None:
                log.error("generation failed", exc_info=ticket.error)
            seconds = time.perf_counter() - (job.started_at or job.enqueued_at)
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * seconds
            self._finish(job, Finished(
                cancelled=job.cancelled, queue_seconds=job.started_at - job.enqueued_at,
                run_seconds=seconds, error=ticket.error), reply)

        try:
            machine = request.strategy.steps(request.prompt_ids, request.config,
                                             self.batch.config.prefill_chunk,
                                             new_cache=self.batch.new_cache)
        except Exception as exc:  # noqa: BLE001 - this request's own error
            log.exception("generation failed")
            self._finish(job, Finished(cancelled=False, queue_seconds=0.0, run_seconds=0.0,
                                       error=exc), [])
            return
        ticket = self.batch.submit(machine, on_step, on_end)
        self._tickets[id(job)] = (job, ticket)
