"""Predictive pipelined decoding (Yang et al., "Predictive Pipelined Decoding"): exact.

The main worker (this process) runs each token's forward in two parts. After the first d̄ of
d layers it hands the residual stream h_d̄ to k sub-worker processes; sub-worker i reads the
i-th best early guess from h_d̄ (final norm + LM head, or a trained exit head) and runs the
first d - d̄ layers of that guessed token at the next position, while the main worker runs
layers d̄..d and picks the real token x from the final logits. If x is guess i, the main
worker adopts worker i's pass (its hidden state after d - d̄ layers and those layers'
keys/values) and continues it from layer d - d̄; otherwise it starts x from layer 0.
Per token that costs d̄ layer-times instead of d when guessed (Algorithm 2, d̄ >= d/2):

    main     | 0 .. d̄ | d̄ .. d  + head → x_t |  (d-d̄) .. d̄ | d̄ .. d → x_t+1 | ...
    sub i    |         | head, 0 .. d-d̄ on g_i |              | ...
                        ^ guesses sent          ^ x_t == g_i: adopt, skip layers 0 .. d-d̄

Exactness: the real token is always the final layer's choice on the real prefix; an adopted
pass is bit-identical to the one the main worker would have run (see pipelined_worker), so
greedy output equals `autoregressive`, and sampled output equals it draw for draw with the
same seed (one draw per token from the same distribution). Guesses only decide which work
can be reused.

Moving the early head to the sub-workers keeps it off the main worker's critical path: on
small models an LM head costs as much as several layers, and the sub-worker's span
(head + d - d̄ layers) then matches the main worker's (d - d̄ layers + head) at d̄ = d/2.

Steps: one per token, sources "target". `drafted` = 1 when guesses were made for the token
(every token but the last of the budget), `accepted` = 1 when the token was one of them, so
Stats.acceptance_rate is p̂_correct. Step.extra: `match` (1-based worker, 0 = none), and
the main worker's seconds spent sending (`send_s`), waiting for replies (`wait_s`) and
copying an adopted pass (`adopt_s`): the communication overhead; `verify_seconds` is the
main worker's own forward time, `other_seconds` the overhead.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from draftsman.core import Budget, GenerationConfig, Step
from draftsman.errors import InvalidArgumentError, UnsupportedError
from draftsman.models.base import LAST, DecoderLM
from draftsman.models.exit_heads import resolve_exit_head
from draftsman.sampling import Sampler
from draftsman.strategies.base import Strategy, as_batch, check_fits, positions
from draftsman.strategies.options import MethodOptions, option
from draftsman.strategies.pipelined_dist import DistributedPool
from draftsman.strategies.pipelined_worker import PipelinedWorkerError, WorkerPool

if TYPE_CHECKING:
    from draftsman.engine import Engine

__all__ = ["Pipelined", "PipelinedConfig", "PipelinedOptions", "PipelinedWorkerError", "build",
           "close_pools"]


@dataclass(frozen=True)
class PipelinedConfig:
    """k sub-workers, early layer d̄ (None: ⌈d/2⌉), threads per process, wait timeout."""

    workers: int = 1  # k
    exit_layer: int | None = None  # d̄
    threads: int = 1  # per sub-worker
    main_threads: int | None = None  # the main worker's (this process's) threads; None: keep
    timeout: float = 120.0  # longest wait for one reply before the request is aborted
    transport: str = "pipes"  # pipes + shared memory (one machine) or distributed

    def __post_init__(self) -> None:
        for name in ("workers", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"pipelined: {name} must be an integer >= 1, "
                                           f"got {v!r}")
        if self.main_threads is not None and (not isinstance(self.main_threads, int)
                                               or self.main_threads < 1):
            raise InvalidArgumentError(f"pipelined: main_threads must be an integer >= 1, "
                                       f"got {self.main_threads!r}")
        if not self.timeout > 0:
            raise InvalidArgumentError(f"pipelined: timeout must be > 0, got {self.timeout}")
        if self.transport not in TRANSPORTS:
            raise InvalidArgumentError(f"pipelined: transport must be one of "
                                       f"{', '.join(TRANSPORTS)}, got {self.transport!r}")

    def layer(self, model: DecoderLM) -> int:
        d = model.config.num_layers
        d_bar = math.ceil(d / 2) if self.exit_layer is None else self.exit_layer
        if isinstance(d_bar, bool) or not isinstance(d_bar, int) or not d / 2 <= d_bar < d:
            raise InvalidArgumentError(
                f"pipelined: exit_layer must be an integer with d/2 <= exit_layer < d "
                f"({math.ceil(d / 2)}..{d - 1} for this {d}-layer model), got {d_bar!r}")
        if self.workers >= model.config.vocab_size:
            raise InvalidArgumentError("pipelined: more workers than vocabulary entries")
        return d_bar


# ----------------------------------------------------------------------------- pools

TRANSPORTS = ("pipes", "distributed")
_POOLS: dict[tuple, WorkerPool | DistributedPool] = {}


def _pool_for(model: DecoderLM, config: PipelinedConfig, d_bar: int
              ) -> WorkerPool | DistributedPool:
    """One warm pool per (model, k, d̄, threads): spawning costs seconds, so requests
    reuse it (the exit head is sent per request); it closes when the model is
    garbage-collected or at exit."""
    key = (id(model), config.workers, d_bar, config.threads, config.transport)
    pool = _POOLS.get(key)
    if pool is not None and pool.alive():
        pool.timeout = config.timeout
        return pool
    if pool is not None:
        pool.close()
    if config.transport == "distributed":
        close_pools("distributed")  # one torch.distributed group per process
    kind = DistributedPool if config.transport == "distributed" else WorkerPool
    pool = kind(model, config.workers, d_bar, config.threads, config.timeout)
    _POOLS[key] = pool
    weakref.finalize(model, _drop_pool, key)
    return pool


def _drop_pool(key: tuple) -> None:
    pool = _POOLS.pop(key, None)
    if pool is not None:
        pool.close()


def close_pools(transport: str | None = None) -> None:
    """Stop every sub-worker process this process started (of one transport, if named)."""
    for key in list(_POOLS):
        if transport is None or key[-1] == transport:
            _drop_pool(key)


atexit.register(close_pools)


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- strategy


class Pipelined(Strategy):
    name: ClassVar[str] = "pipelined"
    exactness: ClassVar[str] = "exact"

    def __init__(self, model: DecoderLM, config: PipelinedConfig | None = None,
                 head: nn.Module | None = None, head_key: Any = None) -> None:
        """`head`: an exit-head translator (or any module normed hidden -> logits) for the
        early guesses; None uses the model's own LM head. `head_key` names the head (e.g.
        its file and mtime; default its identity). Starts (or reuses) the worker pool."""
        self.model = model
        self.config = config or PipelinedConfig()
        self.exit_layer = self.config.layer(model)
        self.head = head
        self.head_key = None if head is None else (head_key or id(head))
        self.pool = _pool_for(model, self.config, self.exit_layer)

    def close(self) -> None:
        self.pool.close()

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        check_fits(self.model, len(prompt_ids), config)
        if not self.pool.alive():  # closed after a failure, or a worker died in between:
            self.pool = _pool_for(self.model, self.config, self.exit_layer)  # start afresh
        with _threads(self.config.main_threads):
            yield from self._generate(prompt_ids, config)

    def _generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        model, pool = self.model, self.pool
        d, d_bar = model.config.num_layers, self.exit_layer
        d_sub = d - d_bar  # layers a sub-worker runs: [0, d_sub)
        front = range(0, d_bar)
        middle = range(d_sub, d_bar)  # after an adopted pass (empty when d̄ = d/2)
        back = range(d_bar, d)
        cache = pool.start_request(len(prompt_ids) + config.max_new_tokens + 1, self.head,
                                   self.head_key)
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        ids, start = list(prompt_ids), 0
        adopted: tuple[int, torch.Tensor] | None = None  # (worker, hidden after d_sub layers)
        while not budget.done:
            t0 = time.perf_counter()
            n = len(ids)
            pos = positions(start, n)
            adopt_s = 0.0
            if adopted is None:
                h = model(as_batch(ids), pos, cache, layers=front, start=start,
                          logits_at=None).hidden
            else:
                worker, h = adopted
                ta = time.perf_counter()
                pool.adopt(worker, start)
                adopt_s = time.perf_counter() - ta
                if len(middle):
                    h = model(None, pos, cache, layers=middle, hidden_from=h, start=start,
                              logits_at=None).hidden
            t1 = time.perf_counter()
            rnd = pool.dispatch(start + n, h[:, -1:]) if budget.remaining > 1 else None
            t2 = time.perf_counter()
            logits = model(None, pos, cache, layers=back, hidden_from=h, start=start,
                           logits_at=LAST).logits
            token = sampler.pick(logits[0, -1])
            t3 = time.perf_counter()
            tokens = budget.clip([token])
            checked = rnd is not None and not budget.done  # the last token's guesses are moot
            match, worker_s, adopted = 0, 0.0, None
            if checked:
                guesses = pool.guesses(rnd)
                if token in guesses:
                    match = guesses.index(token) + 1
                    hidden, worker_s = pool.result(match, rnd)
                    adopted = (match, hidden)
            t4 = time.perf_counter()
            yield Step(
                tokens, ["target"] * len(tokens),
                drafted=int(checked), accepted=int(match > 0), rejected=checked and not match,
                target_forwards=1, prefill=start == 0,
                verify_seconds=(t1 - t0 - adopt_s) + (t3 - t2),
                other_seconds=(t2 - t1) + (t4 - t3) + adopt_s,
                finish=budget.finish,
                extra={"match": match, "send_s": t2 - t1, "wait_s": t4 - t3,
                       "adopt_s": adopt_s, "worker_s": worker_s},
            )
            start += n
            ids = [token]


# ----------------------------------------------------------------------------- builder


@dataclass(frozen=True)
class PipelinedOptions(MethodOptions):
    """`--method pipelined` options (`k` is another name of `workers`)."""

    aliases: ClassVar[dict[str, str]] = {"k": "workers"}

    exit_layer: int | None = option(None, "d-bar: the layer whose hidden state the sub-workers "
                                          "guess from (d/2 <= exit_layer < d; default ceil(d/2))",
                                    kind=int, minimum=1)
    workers: int = option(1, "k: sub-worker processes, one per guessed token", kind=int,
                          minimum=1)
    exit_head: str = option("auto", "'auto': a trained exit head for exit_layer if one "
                                    "exists; 'shared': the model's LM head; or a file")
    threads: int = option(1, "torch threads per sub-worker", kind=int, minimum=1)
    main_threads: int | None = option(None, "the main worker's threads (default: keep)",
                                      kind=int, minimum=1)
    timeout: float = option(120.0, "longest wait in seconds for one sub-worker reply",
                            kind=float, minimum=0)
    transport: str = option("pipes", "pipes: sub-workers on this machine sharing the "
                                     "weights' memory; distributed: torch.distributed (gloo "
                                     "on the CPU, NCCL on GPUs), local processes or torchrun "
                                     "ranks (`draftsman pipelined-worker`)",
                            choices=TRANSPORTS)

    def needs(self) -> dict[str, str]:
        why = "hidden states of an intermediate layer"
        return {"layer_ranges": why, "hidden_states": why}

    def config(self) -> PipelinedConfig:
        return PipelinedConfig(self.workers, self.exit_layer, self.threads, self.main_threads,
                               self.timeout, self.transport)


def build(engine: Engine, options: PipelinedOptions) -> Strategy:
    """Registry builder: the worker pool for the target, with the exit head `exit_head`."""
    config = options.config()
    model = engine.target.model
    d_bar = config.layer(model)
    if config.transport == "distributed":  # the workers guess with the model's own head
        if options.exit_head not in ("auto", "shared"):
            raise UnsupportedError("pipelined: transport=distributed reads its guesses with "
                                   "the model's own LM head; use exit_head=shared")
        return Pipelined(model, config)
    resolved = resolve_exit_head(model, engine.target.folder, d_bar, options.exit_head)
    if resolved is None:
        return Pipelined(model, config)
    head, path = resolved
    return Pipelined(model, config, head, (str(path), path.stat().st_mtime))
