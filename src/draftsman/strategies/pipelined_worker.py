"""The process side of the `pipelined` strategy: sub-worker processes and their pool.

k sub-worker processes are started with torch.multiprocessing ("spawn"). The model's
weights are moved to shared memory once (`model.share_memory()`) and handed to every worker,
so all k + 1 processes read the same physical pages; nothing is copied per worker.

Memory shared between the main worker (the calling process) and sub-worker i:

    shared cache   KVCache [L, 1, H_kv, S, D]   written by the main worker only
    lane i         KVCache [d - d̄, 1, H_kv, S, D] written by sub-worker i only

Messages (one duplex pipe per sub-worker; payloads are small: ints and one hidden row):

    main -> i   ("begin", shared, lane, head)    a request starts (None: keep the caches;
                                                  head: (the exit head or None) or KEEP)
                ("job", round, pos, h_d̄)         the residual stream after d̄ layers of the
                                                  main pass at position pos - 1
                ("stop",)
    i -> main   ("ready", pid)
                ("guess", round, token)           the i-th best early token from h_d̄
                ("done", round, h, seconds)       the residual stream after d - d̄ layers of
                                                  that token at position pos
                ("error", round, traceback)

A job: apply the final norm and the (exit) head to h_d̄, take the i-th best token g_i, reply
with it, copy the shared cache's slots [synced, pos) of layers [0, d - d̄) into the lane
(the committed prefix; only the newest slot or two per job), run layers [0, d - d̄) on g_i at
position pos over the lane, and reply with the hidden state.

Race freedom (why no locks are needed):
- When the main worker sends job (round r, pos p) it has finished layers [0, d̄) of every
  slot < p, and d - d̄ <= d̄, so the shared slots a job copies are final; while the job runs
  the main worker writes only slot p - 1 of layers [d̄, d) or slots >= p.
- Lane i is written by sub-worker i only; the main worker reads its slot p (to adopt a
  matched guess) only after "done" for that round, and sends that worker nothing new
  before it has read it. A worker handles its jobs in order, so a job whose guess missed
  may still be running when the next one is queued: it only ever touches its own lane.
- Every message carries the round; rounds only grow, so a late reply to a round the main
  worker has moved past is recognised and dropped.

Exactness: the sub-worker's pass is the same computation the main worker would do for that
token (same layers, same weights, the same cached keys/values in a cache of the same shape,
a one-token forward without mask), so an adopted pass is bit-identical to one the main
worker ran itself, in any dtype, given the same thread count per process.

Failure: a worker that dies (killed, crashed) closes its pipe and its process sentinel
becomes ready; the main worker sees either while waiting, or a broken pipe when sending, and
raises `PipelinedWorkerError` after terminating every worker of the pool. Each wait is also
bounded by a timeout. A worker exits when its pipe to the main process closes, so a killed
main process leaves no orphans behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch import nn

from draftsman.errors import DraftsmanError
from draftsman.models.base import DecoderLM
from draftsman.models.cache import KVCache
from draftsman.models.exit_heads import EarlyPredictor


class PipelinedWorkerError(DraftsmanError):
    """A sub-worker died, failed or stopped answering; the request was aborted."""

    status = 500


@dataclass(frozen=True)
class WorkerSpec:
    index: int  # 1..k: this worker takes the index-th best early guess
    k: int
    exit_layer: int  # d̄
    threads: int


def encode_hidden(h: torch.Tensor) -> tuple[bytes, tuple[int, ...], str]:
    """A hidden row as raw float32 bytes (exact for bf16 / fp16 / fp32)."""
    return h.detach().float().contiguous().numpy().tobytes(), tuple(h.shape), str(h.dtype)


def decode_hidden(payload: tuple[bytes, tuple[int, ...], str]) -> torch.Tensor:
    raw, shape, dtype = payload
    t = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
    return t.to(getattr(torch, dtype.removeprefix("torch.")))


# ----------------------------------------------------------------------------- worker side


KEEP = "keep"  # "begin" without a new head


def worker_main(conn: Connection, model: DecoderLM, spec: WorkerSpec) -> None:
    """Entry point of sub-worker `spec.index` (runs in its own process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when to stop
    torch.set_num_threads(spec.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)

    predictor = EarlyPredictor(model, spec.exit_layer, None)
    shallow = range(0, model.config.num_layers - spec.exit_layer)
    shared: KVCache | None = None
    lane: KVCache | None = None
    synced = 0  # lane slots [0, synced) equal the shared cache's
    rnd = -1
    try:
        conn.send(("ready", os.getpid()))
        while True:
            msg = conn.recv()
            kind = msg[0]
            if kind == "stop":
                return
            if kind == "begin":
                shared = msg[1] if msg[1] is not None else shared
                lane = msg[2] if msg[2] is not None else lane
                if msg[3] != KEEP:
                    predictor = EarlyPredictor(model, spec.exit_layer, msg[3][0])
                synced = 0
                continue
            if kind != "job":
                raise RuntimeError(f"unknown message {kind!r}")
            _, rnd, pos, payload = msg
            t0 = time.perf_counter()
            with torch.inference_mode():
                h = decode_hidden(payload)  # [1, 1, H]
                logits = predictor.logits(h)[0, -1]  # [V]
                guess = int(torch.topk(logits.float(), spec.k).indices[spec.index - 1])
                conn.send(("guess", rnd, guess))
                if synced < pos:  # bring the lane's prefix up to date (layers [0, d - d̄))
                    for layer in shallow:
                        lane.write(layer, synced, shared.k[layer, :, :, synced:pos],
                                   shared.v[layer, :, :, synced:pos])
                ids = torch.tensor([[guess]], dtype=torch.long)
                out = model(ids, torch.tensor([[pos]], dtype=torch.long), lane, layers=shallow,
                            start=pos, logits_at=None)
                synced = pos  # slot pos now holds a guess, not (yet) committed text
                conn.send(("done", rnd, encode_hidden(out.hidden), time.perf_counter() - t0))
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return  # the main process went away: nothing left to do
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", rnd, traceback.format_exc()))


# ----------------------------------------------------------------------------- pool (main side)


@dataclass
class WorkerHandle:
    index: int
    process: Any  # torch.multiprocessing Process
    conn: Connection
    pid: int = 0


class WorkerPool:
    """k sub-worker processes sharing `model`'s weights, plus the caches they work on.

    `start_request` hands out the shared cache for one request; `dispatch` sends a round's
    job to every worker; `guesses` / `result` wait for the replies; `adopt` copies a
    matched worker's keys/values into the shared cache. Any failure closes the whole pool.
    """

    def __init__(self, model: DecoderLM, k: int, exit_layer: int, threads: int = 1,
                 timeout: float = 120.0, start_timeout: float = 300.0) -> None:
        self.model = model
        self.k = k
        self.exit_layer = exit_layer
        self.sub_layers = model.config.num_layers - exit_layer
        self.timeout = timeout
        self.round = 0
        self.closed = False
        self.shared: KVCache | None = None
        self.lanes: list[KVCache] = []
        self.workers: list[WorkerHandle] = []
        self._guesses: dict[int, dict[int, int]] = {}  # round -> worker -> token
        self._done: dict[tuple[int, int], tuple[torch.Tensor, float]] = {}
        self._head_key: Any = None  # the exit head the workers hold (None: shared head)
        # The head last sent, kept alive: an id()-based key then cannot be reused by a new
        # head object while the workers still hold this one.
        self._head: nn.Module | None = None
        model.share_memory()  # weights in shared memory: every worker maps the same pages
        ctx = torch.multiprocessing.get_context("spawn")
        try:
            for i in range(1, k + 1):
                parent, child = ctx.Pipe(duplex=True)
                spec = WorkerSpec(i, k, exit_layer, threads)
                proc = ctx.Process(target=worker_main, args=(child, model, spec),
                                   name=f"draftsman-pipelined-{i}", daemon=True)
                proc.start()
                child.close()
                self.workers.append(WorkerHandle(i, proc, parent))
            for w in self.workers:
                msg = self._recv(w, start_timeout)
                if msg[0] != "ready":
                    raise PipelinedWorkerError(f"pipelined: sub-worker {w.index} did not start")
                w.pid = msg[1]
        except BaseException:
            self.close()
            raise

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def alive(self) -> bool:
        return not self.closed and all(w.process.is_alive() for w in self.workers)

    def close(self, grace: float = 2.0) -> None:
        """Stop every worker: ask, then terminate, then kill; join them all."""
        if self.closed:
            return
        self.closed = True
        for w in self.workers:
            if w.process.is_alive():
                with contextlib.suppress(OSError):
                    w.conn.send(("stop",))
        deadline = time.monotonic() + grace
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(1.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(1.0)
            w.conn.close()

    def _fail(self, message: str) -> PipelinedWorkerError:
        self.close()
        return PipelinedWorkerError(message)

    def _describe_exit(self, w: WorkerHandle) -> str:
        w.process.join(0.5)
        code = w.process.exitcode
        if code is None:
            return "stopped answering"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def _recv(self, w: WorkerHandle, timeout: float | None = None) -> tuple:
        """The next message from worker `w`; raises if it dies, fails or times out."""
        timeout = self.timeout if timeout is None else timeout
        ready = wait([w.conn, w.process.sentinel], timeout)
        if not ready:
            raise self._fail(f"pipelined: sub-worker {w.index} (pid {w.pid}) sent nothing for "
                             f"{timeout:.0f} s; the request was aborted")
        try:
            if w.conn in ready or w.conn.poll():
                msg = w.conn.recv()
            else:
                raise EOFError
        except (EOFError, OSError):
            raise self._fail(f"pipelined: sub-worker {w.index} (pid {w.pid}) "
                             f"{self._describe_exit(w)}; the request was aborted") from None
        if msg[0] == "error":
            raise self._fail(f"pipelined: sub-worker {w.index} failed; the request was "
                             f"aborted:\n{msg[2]}")
        return msg

    def _send(self, w: WorkerHandle, msg: tuple) -> None:
        if w.process.exitcode is not None:
            raise self._fail(f"pipelined: sub-worker {w.index} (pid {w.pid}) "
                             f"{self._describe_exit(w)}; the request was aborted")
        try:
            w.conn.send(msg)
        except OSError:
            raise self._fail(f"pipelined: sub-worker {w.index} (pid {w.pid}) "
                             f"{self._describe_exit(w)}; the request was aborted") from None

    def _check(self) -> None:
        if self.closed:
            raise PipelinedWorkerError("pipelined: the worker pool was closed after a failure")

    # ---- requests ----------------------------------------------------------------------
    def start_request(self, capacity: int, head: nn.Module | None = None,
                      head_key: Any = None) -> KVCache:
        """The (reset) shared cache for a request of up to `capacity` tokens; the workers
        read their guesses with `head` (None: the model's LM head), identified by
        `head_key` so an unchanged head is not sent again."""
        self._check()
        for w in self.workers:
            if w.process.exitcode is not None:
                raise self._fail(f"pipelined: sub-worker {w.index} (pid {w.pid}) "
                                 f"{self._describe_exit(w)}; the request was aborted")
        fresh = self.shared is None or self.shared.capacity < capacity
        if fresh:
            self.shared = self.model.new_cache(capacity)
            self.lanes = []
            for _ in self.workers:
                c = self.model.config
                lane = KVCache(self.sub_layers, c.num_kv_heads, c.head_dim, capacity,
                               dtype=self.model.dtype, device=self.model.device)
                self.lanes.append(lane)
            for c in (self.shared, *self.lanes):
                c.k.share_memory_()
                c.v.share_memory_()
        self.shared.reset()
        self._guesses.clear()
        self._done.clear()
        new_head: Any = KEEP
        if head_key != self._head_key:
            if head is not None:
                head.share_memory()  # sent once as shared-memory handles
            new_head = (head,)
        for w, lane in zip(self.workers, self.lanes, strict=True):
            caches = (self.shared, lane) if fresh else (None, None)
            self._send(w, ("begin", *caches, new_head))
        self._head_key, self._head = head_key, head
        return self.shared

    def dispatch(self, pos: int, hidden: torch.Tensor) -> int:
        """Send every worker the job for position `pos` from h_d̄ [1, 1, H]; returns its round."""
        self._check()
        self.round += 1
        payload = encode_hidden(hidden)
        for w in self.workers:
            self._send(w, ("job", self.round, pos, payload))
        return self.round

    def _pump(self, w: WorkerHandle, want: str, rnd: int) -> None:
        """Read worker `w`'s messages until its `want` reply for round `rnd` arrived."""
        while True:
            if want == "guess" and w.index in self._guesses.get(rnd, {}):
                return
            if want == "done" and (w.index, rnd) in self._done:
                return
            msg = self._recv(w)
            kind, r = msg[0], msg[1]
            if r < rnd:
                continue  # a late reply to a round already decided
            if kind == "guess":
                self._guesses.setdefault(r, {})[w.index] = msg[2]
            elif kind == "done":
                self._done[(w.index, r)] = (decode_hidden(msg[2]), msg[3])

    def guesses(self, rnd: int) -> list[int]:
        """The k early guesses of round `rnd`, best first (waits for them)."""
        for w in self.workers:
            self._pump(w, "guess", rnd)
        got = self._guesses.pop(rnd)
        for r in [r for r in self._guesses if r < rnd]:
            del self._guesses[r]
        return [got[w.index] for w in self.workers]

    def result(self, index: int, rnd: int) -> tuple[torch.Tensor, float]:
        """Worker `index`'s hidden state [1, 1, H] after d - d̄ layers, and its seconds."""
        w = self.workers[index - 1]
        self._pump(w, "done", rnd)
        out = self._done.pop((index, rnd))
        for key in [key for key in self._done if key[1] <= rnd]:
            del self._done[key]
        return out

    def adopt(self, index: int, slot: int) -> None:
        """Copy worker `index`'s keys/values of `slot` (layers [0, d - d̄)) into the shared
        cache. Call only after `result(index, round)` for the round that wrote the slot."""
        lane = self.lanes[index - 1]
        for layer in range(self.sub_layers):
            self.shared.write(layer, slot, lane.k[layer, :, :, slot:slot + 1],
                              lane.v[layer, :, :, slot:slot + 1])
