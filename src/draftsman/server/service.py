"""The server's shared state: settings, the engine, the scheduler that generates, metrics,
and the checks every request passes before it is queued (routes in app.py call these)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from draftsman.core import Stats
from draftsman.engine import Engine
from draftsman.engine import Request as EngineRequest
from draftsman.profiling import verify_cost_curve
from draftsman.proposers.history import HistoryStore
from draftsman.server.auth import ANONYMOUS, ApiKeys
from draftsman.server.batch_worker import GAMMA_HEADROOM, BatchingScheduler, kv_bytes_per_token
from draftsman.server.engine_thread import EngineThread
from draftsman.server.metrics import Metrics
from draftsman.server.schemas import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    bad_request,
    now,
)
from draftsman.server.worker import Finished, Job, Scheduler, Tally, pin_models
from draftsman.strategies.default_method import DEFAULT
from draftsman.strategies.registry import METHODS, method_options

log = logging.getLogger("draftsman.server")

# engine.prepare keywords: a method option may not shadow them
RESERVED_OPTIONS = frozenset({"prompt", "method", "max_new_tokens", "temperature", "top_k",
                              "top_p", "seed", "stop", "chat", "history"})


@dataclass
class ServerSettings:
    """What `draftsman serve` was started with.

    `method` / `options` are the defaults a request gets when its `draftsman` extension does
    not name another method (options it names are merged over the defaults). `drafts` are
    the companion models loaded at start-up; no other model is ever loaded by a request.
    """

    model_name: str
    method: str = "autoregressive"
    options: dict[str, Any] = field(default_factory=dict)
    drafts: list[str] = field(default_factory=list)
    parallel: int = 1
    max_queue: int = 16
    max_tokens_cap: int = 2048
    max_prompt_tokens: int | None = None  # None: the model's context
    default_max_tokens: int = 16  # /v1/completions without max_tokens, as OpenAI
    default_draft: str | None = None
    api_keys: list[str] = field(default_factory=list)  # none: no authentication
    history_tokens: int = 1_000_000  # earlier prompts and replies kept for drafting, in all
    batch: bool = True  # decode requests together where the backend can (ragged_batches)
    prefill_chunk: int = 128  # prompt tokens a joining request reads per step
    prefill_stall: float = 2.0  # ... cut so a step costs at most this x the decode rows'
    max_step_cost: float | None = None  # guesses cut so a shared step costs at most this x
    max_step_rows: int | None = None  # a row budget for every shared step (chunk, guesses)
    max_kv_tokens: int | None = None  # KV slots all requests may reserve; None: parallel x ctx
    gather_ms: float = 50.0  # an idle batch waits up to this for requests being received
    adaptive: bool = True  # the load-adaptive controller chooses gamma=auto guesses


def load_resident(engine: Engine, settings: ServerSettings) -> None:
    """Load the companion models once and pin the engine to them (`pin_models`): each draft
    whole and as the default method narrows it (a recorded default may be a cascade with
    `draft_vocab`). Requests never load models."""
    method, options = settings.method, settings.options
    if method == DEFAULT:
        method, options, _ = engine.resolve_method(method, options)
    narrowed = getattr(method_options(method, options), "draft_vocab", None)
    vocabs = frozenset({None, narrowed})
    for spec in settings.drafts:
        for vocab in vocabs:
            engine.model(spec, None, vocab)
    pin_models(engine, settings.drafts, settings.default_draft, vocabs)


@dataclass
class Call:
    """Book-keeping of one HTTP request to a generation endpoint."""

    endpoint: str
    t0: float = field(default_factory=time.perf_counter)
    method: str = "unknown"  # a registered method name once known (bounded label values)
    recorded: bool = False


@dataclass
class Prepared:
    request: EngineRequest
    method: str
    options: dict[str, Any]


class Server:
    """State shared by the routes: engine, scheduler, metrics, settings."""

    def __init__(self, engine: Engine, settings: ServerSettings, *,
                 engine_thread: EngineThread | None = None) -> None:
        """`engine_thread`: the thread the engine was loaded on, where the batch loop (or,
        unbatched, worker 0) runs (engine_thread.py); without it they get threads of their
        own."""
        self.engine = engine
        self.settings = settings
        self.engine_thread = engine_thread
        self.created = now()
        load_resident(engine, settings)
        self.context = engine.target.config.max_position_embeddings
        self.max_prompt_tokens = min(settings.max_prompt_tokens or self.context, self.context)
        self.keys = ApiKeys(settings.api_keys)
        self.history = HistoryStore(settings.history_tokens)
        self.metrics = Metrics()
        self.scheduler = self._scheduler()
        self.metrics.watch_history(self.history)
        self.metrics.watch_queue(lambda: self.scheduler.waiting,
                                 lambda: self.scheduler.running, self.scheduler.capacity)
        self.model_names = {settings.model_name, engine.target.name}
        self._background: set[asyncio.Task] = set()
        self._check_defaults()

    def _scheduler(self) -> Scheduler:
        """Batched where the backend can share forwards, else one worker thread each."""
        settings, engine = self.settings, self.engine
        if not (settings.batch and engine.target.model.capabilities.has("ragged_batches")):
            return Scheduler(engine, parallel=settings.parallel, max_queue=settings.max_queue,
                             history=self.history, engine_thread=self.engine_thread)
        curve = verify_cost_curve(engine, 64) if settings.adaptive else {}
        # at most `parallel` requests hold a cache, each at most the context; a smaller
        # --max-kv-tokens is enforced at admission (429)
        kv_tokens = min(settings.max_kv_tokens or 2**62,
                        settings.parallel * (self.context + GAMMA_HEADROOM))
        if settings.max_step_rows is not None and curve:
            log.info("shared steps of at most %d rows: %.2f times a one-row forward on this "
                     "machine's cost curve", settings.max_step_rows,
                     curve.get(settings.max_step_rows, float(settings.max_step_rows)))
        log.info("batching up to %d requests per forward; KV cache bounded at %d tokens "
                 "(%.0f MiB)", settings.parallel, kv_tokens,
                 kv_tokens * kv_bytes_per_token(engine) / 2**20)
        return BatchingScheduler(
            engine, parallel=settings.parallel, max_queue=settings.max_queue,
            history=self.history, prefill_chunk=settings.prefill_chunk,
            prefill_stall=settings.prefill_stall, max_step_cost=settings.max_step_cost,
            max_step_rows=settings.max_step_rows,
            adaptive=settings.adaptive, max_kv_tokens=settings.max_kv_tokens,
            gather=settings.gather_ms / 1e3,
            row_cost=(lambda n: curve.get(n, float(n))) if curve else None,
            on_step=self.metrics.batch_step, engine_thread=self.engine_thread)

    def _check_defaults(self) -> None:
        """Fail at start-up, not on the first request, when the default method is unusable."""
        self.engine.prepare([0], method=self.settings.method, max_new_tokens=1,
                            **self.settings.options)

    # ---- validation ------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves "
                                f"{self.settings.model_name!r}", code="model_not_found",
                           param="model")

    def method_and_options(self, body: CompletionRequest | ChatCompletionRequest
                           ) -> tuple[str, dict[str, Any]]:
        ext = body.draftsman
        requested = {k: v for k, v in (ext.options if ext else {}).items() if v is not None}
        shadowed = sorted(RESERVED_OPTIONS & set(requested))
        if shadowed:
            raise bad_request(f"set {', '.join(shadowed)} as top-level field(s), not in "
                              "the draftsman object", param="draftsman")
        method = ext.method if ext and ext.method else self.settings.method
        if method == self.settings.method:
            return method, {**self.settings.options, **requested}
        if method == DEFAULT:  # what `draftsman generate` runs by default on this engine
            method, requested, _ = self.engine.resolve_method(DEFAULT, requested)
        return method, requested

    def max_new_tokens(self, body: CompletionRequest | ChatCompletionRequest,
                       prompt_tokens: int) -> int:
        """The request's max_tokens, or a default that fits the context; never above the cap."""
        cap = self.settings.max_tokens_cap
        asked = body.requested_max_tokens()
        if asked is None:
            default = self.settings.default_max_tokens if isinstance(
                body, CompletionRequest) else cap
            return max(1, min(default, cap, self.context - prompt_tokens))
        if asked < 1:
            raise bad_request(f"max_tokens must be >= 1, got {asked}", param="max_tokens")
        if asked > cap:
            raise bad_request(f"max_tokens {asked} exceeds this server's limit of {cap}",
                              param="max_tokens")
        return asked

    def encode(self, body: CompletionRequest | ChatCompletionRequest) -> list[int]:
        if isinstance(body, ChatCompletionRequest):
            ids = self.engine.encode_prompt(body.template_messages())
        else:
            prompt = body.single_prompt()
            if isinstance(prompt, list):
                vocab = self.engine.target.config.vocab_size
                bad = [t for t in prompt if not 0 <= t < vocab]
                if bad:
                    raise bad_request(f"token id {bad[0]} is outside the vocabulary "
                                      f"(0..{vocab - 1})", param="prompt")
            ids = self.engine.encode_prompt(prompt, chat=False)
        if len(ids) > self.max_prompt_tokens:
            raise ApiError(413, f"the prompt has {len(ids)} tokens; this server accepts at "
                                f"most {self.max_prompt_tokens}", code="prompt_too_long",
                           param="messages" if isinstance(body, ChatCompletionRequest)
                           else "prompt")
        return ids

    def prepare(self, body: CompletionRequest | ChatCompletionRequest, call: Call,
                scope: str = ANONYMOUS) -> Prepared:
        """Everything that can fail before generation (runs in a helper thread)."""
        self.check_model(body.model)
        body.unsupported_fields()
        method, options = self.method_and_options(body)
        if method in METHODS:
            call.method = method
        method_options(method, options)  # fail on a bad option before tokenising
        ids = self.encode(body)
        top_k = 0 if body.top_k in (None, -1) else body.top_k  # -1: off, as in vLLM
        request = self.engine.prepare(
            ids, method=method, max_new_tokens=self.max_new_tokens(body, len(ids)),
            temperature=body.temperature, top_k=top_k, top_p=body.top_p, seed=body.seed,
            stop=body.stop_strings(), history=self.history.scope(scope), **options)
        return Prepared(request, method, options)

    # ---- outcomes --------------------------------------------------------------------
    def record_request(self, call: Call, status: int) -> None:
        if not call.recorded:
            call.recorded = True
            self.metrics.request(call.endpoint, call.method, status,
                                 time.perf_counter() - call.t0)

    def record_generation(self, call: Call, prepared: Prepared, job: Job, tally: Tally
                          ) -> None:
        """Record the generation once its job has finished (drains events not yet read)."""
        if tally.finished is not None:
            self._record_generation(call, prepared, tally)
            return

        async def drain() -> None:
            async for item in job.items():
                if isinstance(item, Finished):
                    tally.finished = item
                else:
                    tally.add(item)
            self._record_generation(call, prepared, tally)

        task = asyncio.get_running_loop().create_task(drain())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _record_generation(self, call: Call, prepared: Prepared, tally: Tally) -> None:
        finished = tally.finished
        assert finished is not None
        reason = ("error" if finished.error is not None else tally.finish
                  or ("cancelled" if finished.cancelled else "length"))
        stats = Stats.from_steps(tally.steps)
        self.metrics.generation(call.method, prompt_tokens=len(prepared.request.prompt_ids),
                                steps=stats, reason=reason,
                                queue_seconds=finished.queue_seconds, ttft=tally.ttft,
                                run_seconds=finished.run_seconds)
        log.info("%s %s: %d+%d tokens, %s, %.1f tok/s, tau %s, alpha %s", call.endpoint,
                 call.method, len(prepared.request.prompt_ids), stats.new_tokens, reason,
                 stats.new_tokens / finished.run_seconds if finished.run_seconds else 0.0,
                 fmt(stats.tau), fmt(stats.alpha))


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
