"""The `pipelined` strategy's sub-workers over torch.distributed: one process per worker, on
this machine or others, gloo on the CPU and NCCL on GPUs, the same code.

`DistributedPool` has the interface of `pipelined_worker.WorkerPool` (start_request,
dispatch, guesses, result, adopt, close), so `Pipelined` runs unchanged over it; what
differs is that nothing is shared memory. Rank 0 is the main worker, rank i (1..k) takes
the i-th best early guess. Each worker keeps its own copy of the weights and its own cache
of layers [0, d - d̄); the main worker sends, with each job, the keys/values of those layers
for the committed slots the worker has not seen yet (they are final: see the race-freedom
note in pipelined_worker), and a worker sends back, with its hidden state, the keys/values
its guessed token wrote. Every cache therefore holds bit-identical values to the ones the
shared-memory pool would have copied, and greedy output equals autoregressive.

Messages are tensors sent point to point: a header int64[6] = (kind, round, pos, n, a, b),
then the payloads the header announces, in a fixed order:
    SPEC  main -> i   (k, exit_layer, threads)            once, after the group is up
    BEGIN main -> i   pos = capacity                        a request starts (caches reset)
    JOB   main -> i   round, pos, n = new committed slots;  float32 [kv [2, d-d̄, H_kv, n, D],
                      h_d̄ [H]] flattened into one tensor (float32 holds bf16/fp16 exactly)
    STOP  main -> i
    GUESS i -> main   round, a = the guessed token
    DONE  i -> main   round, a = microseconds;  float32 [h [H], kv [2, d-d̄, H_kv, 1, D]]
    ERROR i -> main   n = bytes of the traceback;  uint8[n]
Both sides send without blocking (isend, the tensors kept alive until delivered; messages
between two ranks arrive in the order sent) and receive with a deadline. A worker that dies
or stops answering becomes a `PipelinedWorkerError` naming its rank within `timeout`
seconds, never a hang.

Launch: `DistributedPool(model, k, d̄)` spawns k local processes (`--option workers=k`,
`transport=distributed`); under torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) rank 0 joins the group they name and ranks 1..k run `draftsman
pipelined-worker --target SAME_MODEL` on their machines.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import socket
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from draftsman.errors import InvalidArgumentError, UnsupportedError
from draftsman.models.base import DecoderLM
from draftsman.models.cache import KVCache
from draftsman.models.exit_heads import EarlyPredictor
from draftsman.strategies.pipelined_worker import PipelinedWorkerError

SPEC, BEGIN, JOB, STOP, GUESS, DONE, ERROR = range(1, 8)
HEADER = 6


def torchrun_env() -> bool:
    """Whether this process was started torchrun-style (RANK and WORLD_SIZE set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world: int, device: torch.device, timeout: float,
               init_method: str | None = None) -> None:
    """Join the default process group (env:// when `init_method` is None)."""
    if dist.is_initialized():
        raise UnsupportedError("pipelined: this process is already in a torch.distributed "
                               "group; one distributed pool per process")
    dist.init_process_group(backend_for(device), init_method=init_method or "env://",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))


class Channel:
    """Point-to-point tensors with one peer; `recv` waits at most `timeout` seconds."""

    def __init__(self, peer: int, device: torch.device, timeout: float) -> None:
        self.peer, self.device, self.timeout = peer, device, timeout
        self.pending: list[tuple[Any, torch.Tensor]] = []  # isends in flight, kept alive

    def header(self, kind: int, rnd: int = 0, pos: int = 0, n: int = 0, a: int = 0,
               b: int = 0) -> torch.Tensor:
        return torch.tensor([kind, rnd, pos, n, a, b], dtype=torch.long, device=self.device)

    def post(self, *tensors: torch.Tensor) -> None:
        """Send without waiting (the main worker must never block on a busy worker)."""
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]
        for t in tensors:
            t = t.contiguous()
            self.pending.append((dist.isend(t, self.peer), t))

    def send(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            dist.send(t.contiguous(), self.peer)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype,
             timeout: float | None = None) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(out, self.peer)
        seconds = self.timeout if timeout is None else timeout
        try:
            done = work.wait(datetime.timedelta(seconds=seconds))
        except RuntimeError as exc:  # gloo raises on its deadline, and when the peer is gone
            if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                raise TimeoutError from None
            raise
        if done is False:
            raise TimeoutError
        return out


# ----------------------------------------------------------------------------- worker side


def serve(model: DecoderLM, rank: int, timeout: float) -> None:
    """Worker `rank` of a joined group: answer the main worker (rank 0) until STOP."""
    device = model.device if backend_for(model.device) == "nccl" else torch.device("cpu")
    ch = Channel(0, device, timeout)
    spec = ch.recv((HEADER,), torch.long, timeout=max(timeout, 600)).tolist()
    if spec[0] != SPEC:
        raise RuntimeError(f"pipelined worker {rank}: expected SPEC, got kind {spec[0]}")
    k, exit_layer, threads = spec[1], spec[2], spec[3]
    torch.set_num_threads(threads)
    c = model.config
    d_sub = c.num_layers - exit_layer
    shallow = range(d_sub)
    predictor = EarlyPredictor(model, exit_layer, None)
    lane: KVCache | None = None
    synced = rnd = 0
    try:
        while True:
            head = ch.recv((HEADER,), torch.long, timeout=10 ** 7).tolist()
            kind = head[0]
            if kind == STOP:
                for work, _ in ch.pending:  # every reply delivered before the group goes
                    work.wait(datetime.timedelta(seconds=timeout))
                return
            if kind == BEGIN:
                if lane is None or lane.capacity < head[2]:
                    lane = KVCache(d_sub, c.num_kv_heads, c.head_dim, head[2],
                                   dtype=model.dtype, device=model.device)
                lane.reset()
                synced = 0
                continue
            if kind != JOB:
                raise RuntimeError(f"unknown message kind {kind}")
            _, rnd, pos, n = head[:4]
            shape = (2, d_sub, c.num_kv_heads, n, c.head_dim)
            payload = ch.recv((math.prod(shape) + c.hidden_size,), torch.float32)
            kv = payload[:math.prod(shape)].view(shape).to(model.dtype)
            h = payload[math.prod(shape):]
            t0 = time.perf_counter()
            with torch.inference_mode():
                kv = kv.to(model.device)
                for layer in shallow:  # the committed slots [synced, pos) of layers [0, d-d̄)
                    lane.write(layer, synced, kv[0, layer][None], kv[1, layer][None])
                h = h.to(device=model.device, dtype=model.dtype).view(1, 1, -1)
                logits = predictor.logits(h)[0, -1]
                guess = int(torch.topk(logits.float(), k).indices[rank - 1])
                ch.post(ch.header(GUESS, rnd, pos, 0, guess))
                ids = torch.tensor([[guess]], dtype=torch.long)
                out = model(ids, torch.tensor([[pos]], dtype=torch.long), lane, layers=shallow,
                            start=pos, logits_at=None)
                mine = torch.stack([lane.k[:, 0, :, pos:pos + 1], lane.v[:, 0, :, pos:pos + 1]])
                synced = pos  # slot pos holds a guess: the next job's kv overwrites it
            micros = int((time.perf_counter() - t0) * 1e6)
            # without waiting: the worker is free for the next job while the main worker
            # reads this reply (a blocking send held it until the next round's guesses:
            # 16 ms per token on a 2-core CPU)
            ch.post(ch.header(DONE, rnd, pos, 0, micros), torch.cat(
                [out.hidden.reshape(-1).float(), mine.reshape(-1).float()]).to(device))
    except BaseException:
        text = traceback.format_exc().encode()
        with contextlib.suppress(Exception):
            ch.send(ch.header(ERROR, rnd, 0, len(text)),
                    torch.tensor(list(text), dtype=torch.uint8, device=device))
        raise


def spawned_worker(rank: int, world: int, init_method: str, model: DecoderLM,
                   timeout: float) -> None:
    """Entry of a locally spawned worker: join the group, serve, leave."""
    device = model.device
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        model = model.to(device)
    init_group(rank, world, device, timeout, init_method)
    try:
        serve(model, rank, timeout)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- main side


class DistributedPool:
    """k sub-workers over torch.distributed; the interface of `WorkerPool`."""

    def __init__(self, model: DecoderLM, k: int, exit_layer: int, threads: int = 1,
                 timeout: float = 120.0, start_timeout: float = 300.0) -> None:
        self.model = model
        self.k, self.exit_layer, self.timeout = k, exit_layer, timeout
        self.sub_layers = model.config.num_layers - exit_layer
        self.round = 0
        self.closed = False
        self.shared: KVCache | None = None
        self.processes: list[Any] = []
        self._synced = [0] * k  # committed slots each worker's lane holds
        self._guesses: dict[int, dict[int, int]] = {}
        self._done: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, float]] = {}
        self._kv: dict[int, torch.Tensor] = {}  # worker -> kv of its last DONE
        self._seen = [0] * k  # the last round each worker's DONE arrived for
        device = model.device if backend_for(model.device) == "nccl" else torch.device("cpu")
        self.comm = device
        world = k + 1
        try:
            if torchrun_env():
                if int(os.environ["RANK"]) != 0 or int(os.environ["WORLD_SIZE"]) != world:
                    raise InvalidArgumentError(
                        f"pipelined: with workers={k} the main worker is rank 0 of "
                        f"WORLD_SIZE={world}; got RANK={os.environ['RANK']}, "
                        f"WORLD_SIZE={os.environ['WORLD_SIZE']}")
                init_group(0, world, model.device, start_timeout)
            else:
                method = f"tcp://127.0.0.1:{_free_port()}"
                ctx = torch.multiprocessing.get_context("spawn")
                model.share_memory()  # local workers map the same pages, as with pipes
                for rank in range(1, world):
                    proc = ctx.Process(target=spawned_worker,
                                       args=(rank, world, method, model, timeout),
                                       name=f"draftsman-pipelined-dist-{rank}", daemon=True)
                    proc.start()
                    self.processes.append(proc)
                init_group(0, world, model.device, start_timeout, method)
            self.channels = [Channel(rank, device, timeout) for rank in range(1, world)]
            for ch in self.channels:
                ch.post(ch.header(SPEC, k, exit_layer, threads))
        except BaseException:
            self.close()
            raise

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def alive(self) -> bool:
        return not self.closed and all(p.is_alive() for p in self.processes)

    def close(self, grace: float = 2.0, drain: bool = True) -> None:
        """Stop every worker: read the replies still on their way (`drain`; not after a
        failure, whose peer will never answer), send STOP, wait for its delivery, then leave
        the group."""
        if self.closed:
            return
        if drain:
            with contextlib.suppress(PipelinedWorkerError):  # a failure closed the pool
                for index in range(1, self.k + 1):
                    if self._seen[index - 1] < self.round:
                        self._pump(index, DONE, self.round)
            if self.closed:
                return
        self.closed = True
        for ch in getattr(self, "channels", []):
            with contextlib.suppress(Exception):
                ch.post(ch.header(STOP))
        for ch in getattr(self, "channels", []):  # delivered before the group goes
            for work, _ in ch.pending:
                with contextlib.suppress(Exception):
                    work.wait(datetime.timedelta(seconds=grace))
        deadline = time.monotonic() + grace
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()

    def _fail(self, rank: int, what: str) -> PipelinedWorkerError:
        self.close(drain=False)
        return PipelinedWorkerError(f"pipelined: sub-worker rank {rank} {what}; the request "
                                    "was aborted")

    def _recv(self, index: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        try:
            return self.channels[index - 1].recv(shape, dtype)
        except TimeoutError:
            raise self._fail(index, f"sent nothing for {self.timeout:.0f} s") from None
        except RuntimeError as exc:  # gloo: the peer closed its connection
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self._fail(index, f"is gone ({first})") from None

    def _check(self) -> None:
        if self.closed:
            raise PipelinedWorkerError("pipelined: the worker pool was closed after a failure")

    # ---- requests ----------------------------------------------------------------------
    def start_request(self, capacity: int, head: nn.Module | None = None,
                      head_key: Any = None) -> KVCache:
        self._check()
        if head is not None:
            raise UnsupportedError("pipelined: transport=distributed reads its guesses with "
                                   "the model's own LM head; use exit_head=shared")
        if self.shared is None or self.shared.capacity < capacity:
            self.shared = self.model.new_cache(capacity)
        self.shared.reset()
        self._synced = [0] * self.k
        self._guesses.clear()
        self._done.clear()
        for ch in self.channels:
            ch.post(ch.header(BEGIN, 0, capacity))
        return self.shared

    def dispatch(self, pos: int, hidden: torch.Tensor) -> int:
        self._check()
        self.round += 1
        h = hidden.reshape(-1).float().to(self.comm)
        cache = self.shared
        for i, ch in enumerate(self.channels):
            lo = self._synced[i]
            kv = torch.stack([cache.k[:self.sub_layers, 0, :, lo:pos],
                              cache.v[:self.sub_layers, 0, :, lo:pos]]).reshape(-1).float()
            ch.post(ch.header(JOB, self.round, pos, pos - lo),
                    torch.cat([kv.to(self.comm), h]))
            self._synced[i] = pos
        return self.round

    def _pump(self, index: int, want: int, rnd: int) -> None:
        c = self.model.config
        while True:
            if want == GUESS and index in self._guesses.get(rnd, {}):
                return
            if want == DONE and (index, rnd) in self._done:
                return
            kind, r, _, n, a, _ = self._recv(index, (HEADER,), torch.long).tolist()
            if kind == ERROR:
                text = bytes(self._recv(index, (n,), torch.uint8).tolist()).decode(
                    errors="replace")
                raise self._fail(index, f"failed:\n{text}")
            if kind == GUESS:
                if r >= rnd:
                    self._guesses.setdefault(r, {})[index] = a
            elif kind == DONE:
                self._seen[index - 1] = r
                shape = (2, self.sub_layers, c.num_kv_heads, 1, c.head_dim)
                payload = self._recv(index, (c.hidden_size + math.prod(shape),), torch.float32)
                h = payload[:c.hidden_size]
                kv = payload[c.hidden_size:].view(shape).to(self.model.dtype)
                if r >= rnd:
                    self._done[(index, r)] = (h, kv, a / 1e6)
            else:
                raise self._fail(index, f"sent an unknown message kind {kind}")

    def guesses(self, rnd: int) -> list[int]:
        for index in range(1, self.k + 1):
            self._pump(index, GUESS, rnd)
        got = self._guesses.pop(rnd)
        for r in [r for r in self._guesses if r < rnd]:
            del self._guesses[r]
        return [got[i] for i in range(1, self.k + 1)]

    def result(self, index: int, rnd: int) -> tuple[torch.Tensor, float]:
        self._pump(index, DONE, rnd)
        h, kv, seconds = self._done.pop((index, rnd))
        for key in [key for key in self._done if key[1] <= rnd]:
            del self._done[key]
        self._kv[index] = kv
        hidden = h.to(device=self.model.device, dtype=self.model.dtype).view(1, 1, -1)
        return hidden, seconds

    def adopt(self, index: int, slot: int) -> None:
        kv = self._kv.pop(index).to(self.model.device)
        for layer in range(self.sub_layers):
            self.shared.write(layer, slot, kv[0, layer][None], kv[1, layer][None])
