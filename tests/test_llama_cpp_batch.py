"""The llama.cpp backend batching requests: sequences of one shared context, one
llama_decode per step. In bitwise mode each request's tokens equal its tokens alone; in
fast mode llama.cpp's batched kernels round like any verify; sequences return to the pool."""

from __future__ import annotations

import pytest
from test_llama_cpp import PROMPTS, SMOL, smol, smol_draft  # noqa: F401

from draftsman.batching import scheduler as scheduler_module
from draftsman.batching.scheduler import BatchConfig, BatchScheduler
from draftsman.errors import UnsupportedError

pytestmark = pytest.mark.real

MORE = PROMPTS + ["Explain what a KV cache is.", "def quicksort(xs):"]
METHODS = [dict(method="autoregressive"),
           dict(method="speculative", draft="prompt-lookup", gamma="auto"),
           dict(method="speculative", draft="ngram", gamma=3),
           dict(method="autoregressive")]


def run_batched(engine, requests, chunk=16, **options):
    model = engine.target.model
    scheduler = BatchScheduler(model, BatchConfig(max_batch=len(requests), prefill_chunk=chunk,
                                                  **options),
                               lambda n: 1.0 + 0.05 * (n - 1))
    out = {i: [] for i in range(len(requests))}
    for i, r in enumerate(requests):
        scheduler.submit(r.strategy.steps(r.prompt_ids, r.config, chunk,
                                          new_cache=scheduler.new_cache),
                         lambda s, i=i: out[i].extend(s.tokens))
    shared = 0
    while not scheduler.idle:
        scheduler.step()
        shared = max(shared, scheduler.last.requests if scheduler.last else 0)
    for take in [scheduler.new_cache, *scheduler._draft_pools.values()]:
        pool = take.__self__
        assert len(pool._free) == pool.sequences  # every sequence went back
    return out, shared


def test_bitwise_batched_requests_equal_each_alone(smol):  # noqa: F811
    requests = [smol.prepare(p, max_new_tokens=24, **m) for p, m in zip(MORE, METHODS,
                                                                         strict=True)]
    out, shared = run_batched(smol, requests)
    assert shared == len(requests)
    for i, (prompt, method) in enumerate(zip(MORE, METHODS, strict=True)):
        alone = smol.generate(prompt, max_new_tokens=24, **method)
        assert out[i] == alone.token_ids, method


def test_requests_sharing_a_llama_cpp_draft_draft_together(smol, smol_draft,  # noqa: F811
                                                           monkeypatch):
    """Each request's draft reads and drafts on a sequence of the draft model's own batch
    context, so one draft forward serves every request drafting with it."""
    together = []
    real = scheduler_module.draft_together

    def spy(machines, gammas):
        together.append(sum(g > 0 for g in gammas))
        return real(machines, gammas)

    monkeypatch.setattr(scheduler_module, "draft_together", spy)
    kwargs = dict(method="speculative", draft=smol_draft, gamma=3)
    requests = [smol.prepare(p, max_new_tokens=16, **kwargs) for p in MORE[:3]]
    out, shared = run_batched(smol, requests, share_llama_drafts=True)
    assert shared == 3 and max(together) >= 2  # one draft forward, several requests
    for i, prompt in enumerate(MORE[:3]):
        assert out[i] == smol.generate(prompt, max_new_tokens=16, **kwargs).token_ids


def test_seeded_sampling_in_a_batch_equals_alone(smol):  # noqa: F811
    kwargs = dict(method="speculative", draft="ngram", gamma=2, temperature=0.8, seed=7)
    requests = [smol.prepare(MORE[0], max_new_tokens=16, **kwargs),
                smol.prepare(MORE[1], max_new_tokens=16, method="autoregressive")]
    out, _ = run_batched(smol, requests)
    assert out[0] == smol.generate(MORE[0], max_new_tokens=16, **kwargs).token_ids


def test_fast_mode_batches_too(smol):  # noqa: F811
    """Fast mode: one llama_decode for every request's rows; llama.cpp's batched kernels
    round like any verify, so only the run and the budgets are checked here (the load
    benchmark reports identity and margins)."""
    import draftsman

    fast = draftsman.load(SMOL, backend="llama.cpp", numerics="fast")
    requests = [fast.prepare(p, max_new_tokens=12, **m) for p, m in zip(MORE, METHODS,
                                                                        strict=True)]
    out, shared = run_batched(fast, requests)
    assert shared == len(requests)
    assert all(0 < len(out[i]) <= 12 for i in out)


def test_a_finished_request_returns_its_sequence_at_once(smol):  # noqa: F811
    """A one-sequence pool serves requests one after another: each hands its sequence back
    when it ends, not when garbage collection finds it (its ticket sits in a cycle)."""
    import gc

    gc.disable()
    try:
        scheduler = BatchScheduler(smol.target.model, BatchConfig(max_batch=1))
        for prompt in MORE[:3]:
            r = smol.prepare(prompt, max_new_tokens=4, method="autoregressive")
            ticket = scheduler.submit(r.strategy.steps(r.prompt_ids, r.config,
                                                       new_cache=scheduler.new_cache))
            ticket.on_step = lambda s, t=ticket: t  # a cycle: ticket -> closure -> ticket
            while not scheduler.idle:
                scheduler.step()
    finally:
        gc.enable()


def test_a_batch_cache_holds_no_trees_and_the_pool_is_bounded(smol):  # noqa: F811
    take = smol.target.model.sequence_caches(1)
    cache = take(64)
    cache.set_length(4)
    with pytest.raises(UnsupportedError, match="no trees"):
        cache.keep([2, 3], 1)
    with pytest.raises(Exception, match="all 1 sequences"):
        take(64)
