"""Big Little Decoder on tiny random models (fp32).

The strategy is checked against a naive transcription of the paper's Algorithm 1 that
recomputes every distribution from scratch (no caches), over a grid of thresholds, caps and
distances; the limits (α_FB = 1 -> large model, α_FB = 0 without rollback -> small model),
cache restoration after a rollback, the early-exit variant and the Step accounting.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_speculative import perturbed_copy
from tiny import assert_cache_holds, hf_model, ours_from_hf

from draftsman.core import GenerationConfig
from draftsman.errors import InvalidArgumentError
from draftsman.sampling import SamplingConfig
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.big_little import (
    DISTANCES,
    BigLittle,
    BigLittleConfig,
    BigLittleOptions,
    EarlyExit,
    TwoModels,
)
from draftsman.strategies.options import parse
from draftsman.strategies.registry import make_strategy

INF = math.inf


@pytest.fixture(scope="module")
def models():
    """A 4-layer large model; a perturbed copy that agrees about half the time ("close") and
    an unrelated 2-layer, narrower model ("other"). The LM heads are scaled so the models are
    confident enough for the small one to run several tokens and for rollbacks to happen."""
    large = ours_from_hf(hf_model("llama", seed=0, num_hidden_layers=4))
    other = ours_from_hf(hf_model("llama", seed=5, num_hidden_layers=2, hidden_size=32,
                                  intermediate_size=64))
    with torch.no_grad():
        large.lm_head.weight.mul_(20)
        other.lm_head.weight.mul_(20)
    return {"large": large, "close": perturbed_copy(large, 0.2, 1), "other": other}


def prompts(n: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 97, (4 + 3 * i,), generator=g).tolist() for i in range(n)]


def run(strategy, prompt, max_new=30, sampling=None, eos=frozenset()):
    config = GenerationConfig(max_new, sampling or SamplingConfig(), eos)
    steps = list(strategy.generate(prompt, config))
    return [t for s in steps for t in s.tokens], steps


def bild(models, small="close", **kw) -> BigLittle:
    early_exit = kw.pop("early_exit", None)
    return BigLittle(models["large"], None if early_exit else models[small],
                     BigLittleConfig(**kw), early_exit=early_exit)


# ---- the reference: Algorithm 1, recomputed from scratch at every step --------------------

def fresh_logits(model, tokens, layers=None):
    """Logits [T, V] of a fresh forward (no cache reuse); `layers`: an early exit."""
    cache = model.new_cache(len(tokens) + 1)
    ids, pos = torch.tensor([tokens]), torch.arange(len(tokens))[None]
    if layers is None:
        return model(ids, pos, cache).logits[0]
    with torch.inference_mode():
        return model.head(model(ids, pos, cache, layers=range(layers)).hidden[0])


def reference(small_logits, large_logits, prompt, max_new, fallback, rollback, max_small,
              distance):
    """Greedy BiLD as the module docstring states it, without any cache."""
    review = math.isfinite(rollback)
    cap = max_small or INF
    y, k, rows = list(prompt), 0, []
    while True:
        n_out = len(y) - len(prompt)
        if n_out >= max_new and (not review or k == 0):
            return y[len(prompt):][:max_new]
        if not (review and n_out >= max_new) and k < cap:
            logp = small_logits(y)[-1].float().log_softmax(-1)
            if logp.exp().max() > fallback:
                y.append(int(logp.argmax()))
                rows.append(logp)
                k += 1
                continue
        large = large_logits(y).float().log_softmax(-1)  # row i predicts y[i + 1]
        n = len(y)
        m = k
        if review and k:
            d = DISTANCES[distance](torch.stack(rows), large[n - k - 1:n - 1],
                                    torch.tensor(y[n - k:]))
            over = (d > rollback).nonzero()
            m = int(over[0, 0]) if over.numel() else k
        y = y[:n - k + m] + [int(large[n - k - 1 + m].argmax())]
        k, rows = 0, []


GRID = [  # fallback, rollback, max_small, distance
    (0.0, INF, None, "cross-entropy"),
    (0.0, 2.0, None, "cross-entropy"),
    (0.5, 1.0, 10, "cross-entropy"),
    (0.5, 3.0, 4, "cross-entropy"),
    (0.8, 0.5, 10, "cross-entropy"),
    (0.3, 0.2, 10, "total-variation"),
    (0.6, 0.4, 3, "total-variation"),
    (0.3, 0.5, 10, "kl"),
    (0.9, 2.0, None, "kl"),
    (0.6, INF, 5, "cross-entropy"),
]


@pytest.mark.parametrize("small", ["close", "other"])
@pytest.mark.parametrize("fallback,rollback,max_small,distance", GRID)
def test_matches_reference_algorithm(models, small, fallback, rollback, max_small, distance):
    strategy = bild(models, small, fallback=fallback, rollback=rollback, max_small=max_small,
                    distance=distance)
    for prompt in prompts(2):
        expected = reference(lambda y: fresh_logits(models[small], y),
                             lambda y: fresh_logits(models["large"], y),
                             prompt, 24, fallback, rollback, max_small, distance)
        got, _ = run(strategy, prompt, max_new=24)
        assert got == expected


@pytest.mark.parametrize("fallback,rollback,max_small,distance", GRID[1:6])
def test_early_exit_matches_reference_algorithm(models, fallback, rollback, max_small,
                                                distance):
    strategy = bild(models, fallback=fallback, rollback=rollback, max_small=max_small,
                    distance=distance, early_exit=2)
    for prompt in prompts(2):
        expected = reference(lambda y: fresh_logits(models["large"], y, layers=2),
                             lambda y: fresh_logits(models["large"], y),
                             prompt, 24, fallback, rollback, max_small, distance)
        got, _ = run(strategy, prompt, max_new=24)
        assert got == expected


# ---- the limits ---------------------------------------------------------------------------

@pytest.mark.parametrize("small", ["close", "other"])
@pytest.mark.parametrize("rollback", [INF, 0.0, 2.0])
def test_always_fallback_is_the_large_model(models, small, rollback):
    strategy = bild(models, small, fallback=1.0, rollback=rollback)
    for prompt in prompts():
        expected, _ = run(Autoregressive(models["large"]), prompt)
        got, steps = run(strategy, prompt)
        assert got == expected
        assert all(s.sources == ["large"] for s in steps)


@pytest.mark.parametrize("small", ["close", "other"])
def test_never_fallback_without_rollback_is_the_small_model(models, small):
    strategy = bild(models, small, fallback=0.0, rollback=INF, max_small=None)
    for prompt in prompts():
        expected, _ = run(Autoregressive(models[small]), prompt)
        got, steps = run(strategy, prompt)
        assert got == expected
        assert sum(s.target_forwards for s in steps) == 0
        assert all(s.sources == ["small"] for s in steps)


@pytest.mark.parametrize("distance", ["cross-entropy", "total-variation", "kl"])
def test_zero_rollback_threshold_is_the_large_model(models, distance):
    """Every small token has d > 0, so each is replaced by the large model's choice."""
    strategy = bild(models, "other", fallback=0.0, rollback=0.0, max_small=4,
                    distance=distance)
    for prompt in prompts():
        expected, _ = run(Autoregressive(models["large"]), prompt)
        got, _ = run(strategy, prompt)
        assert got == expected


@pytest.mark.parametrize("rollback", [INF, 1.0])
def test_early_exit_always_fallback_is_the_large_model(models, rollback):
    for layers in (1, 2, 3):
        strategy = bild(models, fallback=1.0, rollback=rollback, early_exit=layers)
        for prompt in prompts():
            expected, _ = run(Autoregressive(models["large"]), prompt)
            got, _ = run(strategy, prompt)
            assert got == expected


def test_early_exit_never_fallback_is_the_shallow_model(models):
    strategy = bild(models, fallback=0.0, rollback=INF, max_small=None, early_exit=2)
    for prompt in prompts():
        y = list(prompt)
        for _ in range(20):
            y.append(int(fresh_logits(models["large"], y, layers=2)[-1].argmax()))
        got, _ = run(strategy, prompt, max_new=20)
        assert got == y[len(prompt):]


# ---- caches after a rollback --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["two-models", "early-exit"])
def test_rollback_restores_both_caches(models, kind):
    prompt = prompts()[1]
    pair = (TwoModels(models["other"], models["large"], 64) if kind == "two-models"
            else EarlyExit(models["large"], 2, 64))
    committed = list(prompt)
    for _ in range(6):  # six small tokens, unchecked
        committed.append(int(pair.small_next(committed).argmax()))
    pair.large_check(committed, 6)  # the large model has now seen all of them
    del committed[len(prompt) + 2:]  # roll back to two kept small tokens, add another
    committed.append(11)
    pair.sync(committed)
    if kind == "two-models":
        assert pair.small.fed == pair.large.fed == committed[:-1]
        assert_cache_holds(pair.small.cache, models["other"], committed[:-1])
        assert_cache_holds(pair.large.cache, models["large"], committed[:-1])
    else:  # one cache, every layer (the deep ones filled by the large pass) restored
        assert pair.fed == committed[:-1] and pair.deep == len(committed) - 1
        assert_cache_holds(pair.cache, models["large"], committed[:-1])
    # and continuing from here gives what a fresh pair gives
    a = pair.small_next(committed)
    fresh = (TwoModels(models["other"], models["large"], 64) if kind == "two-models"
             else EarlyExit(models["large"], 2, 64))
    torch.testing.assert_close(a, fresh.small_next(committed), rtol=1e-5, atol=1e-5)
    committed.append(int(a.argmax()))
    torch.testing.assert_close(pair.large_check(committed, 1),
                               fresh.large_check(committed, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("early_exit", [None, 2])
def test_continuation_after_rollback_equals_fresh_run(models, early_exit):
    """After a step that rolled back, the rest of the output is what a new request on
    prompt + output-so-far produces: nothing of the dropped tokens survives anywhere."""
    strategy = bild(models, "other", fallback=0.3, rollback=1.0, early_exit=early_exit)
    seen = 0
    for prompt in prompts():
        out, steps = run(strategy, prompt, max_new=30)
        done, tried = 0, 0
        for step in steps[:-1]:
            done += len(step.tokens)
            if not step.extra.get("rollbacks") or tried == 3:
                continue
            tried += 1
            rest, _ = run(strategy, prompt + out[:done], max_new=30 - done)
            assert rest == out[done:]
        seen += tried
    assert seen >= 3, "the models should disagree often enough to roll back"


# ---- accounting, EOS, budget --------------------------------------------------------------

@pytest.mark.parametrize("rollback", [INF, 1.0])
@pytest.mark.parametrize("early_exit", [None, 2])
def test_stats_add_up(models, rollback, early_exit):
    strategy = bild(models, "close", fallback=0.4, rollback=rollback, max_small=6,
                    early_exit=early_exit)
    for prompt in prompts():
        out, steps = run(strategy, prompt, max_new=50)
        assert len(out) == 50 and steps[-1].finish == "length"
        assert steps[0].prefill and not any(s.prefill for s in steps[1:])
        assert all(len(s.sources) == len(s.tokens) for s in steps)
        small = sum(s.sources.count("small") for s in steps)
        large = sum(s.sources.count("large") for s in steps)
        assert small + large == len(out) and large > 0 and small > 0
        checks = [s for s in steps if s.target_forwards]
        assert all(s.target_forwards == 1 for s in checks)
        assert large == sum(s.sources.count("large") for s in checks) <= len(checks)
        assert sum(s.extra["fallbacks"] for s in checks) + sum(
            s.extra["trigger"] == "end" for s in checks) == len(checks)
        assert all(s.extra["unchecked"] <= 6 for s in checks)
        rolled = sum(s.extra["rolled_back"] for s in checks)
        rollbacks = sum(s.extra["rollbacks"] for s in checks)
        assert rollbacks == sum(s.rejected for s in steps) <= rolled
        # every small token generated is either in the output or was rolled back
        generated = sum(s.extra["unchecked"] for s in checks) + sum(
            s.sources == ["small"] for s in steps if not s.target_forwards and
            not math.isfinite(rollback))
        if math.isfinite(rollback):
            assert rollbacks > 0
            assert sum(s.drafted for s in steps) == sum(s.accepted for s in steps) + rolled
            assert sum(s.accepted for s in steps) >= small
            assert small + rolled <= generated
        else:
            assert rollbacks == rolled == 0
        # small forwards: one per small token generated plus one per low-confidence handover
        assert sum(s.draft_forwards for s in steps) >= small + rolled
        assert all(s.draft_seconds >= 0 and s.verify_seconds >= 0 for s in steps)


@pytest.mark.parametrize("rollback", [INF, 2.0])
def test_eos_from_either_model_ends_the_output(models, rollback):
    strategy = bild(models, "close", fallback=0.5, rollback=rollback)
    prompt = prompts()[0]
    free, _ = run(strategy, prompt, max_new=30)
    for cut in (0, 7, 18):
        eos = free[cut]
        got, steps = run(strategy, prompt, max_new=30, eos=frozenset({eos}))
        assert got == free[: free.index(eos) + 1]
        assert steps[-1].finish == "eos"


@pytest.mark.parametrize("rollback", [INF, 2.0])
def test_budget_respected(models, rollback):
    strategy = bild(models, "close", fallback=0.2, rollback=rollback, max_small=None)
    full, _ = run(strategy, prompts()[2], max_new=30)
    for n in (1, 2, 5, 13):
        got, steps = run(strategy, prompts()[2], max_new=n)
        assert len(got) == n and steps[-1].finish == "length"
        if not math.isfinite(rollback):
            assert got == full[:n]


# ---- sampling -----------------------------------------------------------------------------

SAMPLINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5, top_p=0.9)]


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("distance", list(DISTANCES))
def test_sampling_reproducible_with_a_seed(models, sampling, distance):
    strategy = bild(models, "other", fallback=0.3, rollback=1.0, distance=distance)
    prompt = prompts()[0]
    outs = []
    for seed in range(3):
        config = SamplingConfig(seed=seed, **sampling)
        a, steps_a = run(strategy, prompt, max_new=20, sampling=config)
        b, steps_b = run(strategy, prompt, max_new=20, sampling=config)
        assert a == b and [s.sources for s in steps_a] == [s.sources for s in steps_b]
        outs.append(tuple(a))
    assert len(set(outs)) > 1, "different seeds should give different samples"


@pytest.mark.parametrize("early_exit", [None, 2])
def test_sampling_always_fallback_is_large_model_sampling(models, early_exit):
    """With α_FB = 1 every token is one draw from the large model, as in autoregressive
    sampling: the same seed gives the same text."""
    strategy = bild(models, "other", fallback=1.0, rollback=1.0, early_exit=early_exit)
    for seed in range(3):
        config = SamplingConfig(temperature=0.9, seed=seed)
        expected, _ = run(Autoregressive(models["large"]), prompts()[1], sampling=config)
        got, _ = run(strategy, prompts()[1], sampling=config)
        assert got == expected


# ---- configuration and registry ----------------------------------------------------------

def from_options(fallback=0.5, rollback=3.0, max_small=10, distance="cross-entropy"):
    """CLI-style values through the shared option parser."""
    values = dict(fallback=fallback, rollback=rollback, max_small=max_small, distance=distance)
    return parse(BigLittleOptions, values, "big-little").config()


def test_config_parsing_and_validation():
    c = from_options("0.4", "off", "off", "tv")
    assert (c.fallback, c.rollback, c.max_small, c.distance) == (0.4, INF, None,
                                                                 "total-variation")
    assert not c.reviews and BigLittleConfig().reviews
    assert from_options(0.9, "inf", 3, "KL").distance == "kl"
    for bad in (dict(fallback=1.5), dict(fallback=-0.1), dict(rollback=-1.0),
                dict(max_small=0), dict(distance="cosine")):
        with pytest.raises(InvalidArgumentError):
            BigLittleConfig(**bad)
    for bad in (dict(fallback="high"), dict(max_small="2.5"), dict(rollback="nan")):
        with pytest.raises(InvalidArgumentError):
            from_options(**bad)


def test_registry_builds_big_little(models):
    small = SimpleNamespace(model=models["close"])
    engine = SimpleNamespace(
        target=SimpleNamespace(model=models["large"]),
        model=lambda spec: small if spec == "small-one" else pytest.fail(spec),
        default_draft=lambda: "small-one",
    )
    s = make_strategy("big-little", engine, {"fallback": "0.7", "rollback": "off",
                                             "max_small": "4", "distance": "ce"})
    assert isinstance(s, BigLittle) and s.small is models["close"]
    assert (s.config.fallback, s.config.rollback, s.config.max_small) == (0.7, INF, 4)
    s = make_strategy("big-little", engine, {"early_exit": "2"})
    assert s.small is None and s.early_exit == 2 and s.exactness == "lossy"
    for bad in ({"early_exit": "4"}, {"early_exit": "0"}, {"draft": "ngram"},
                {"early_exit": 1, "draft": "small-one"}, {"gamma": 3}):
        with pytest.raises(InvalidArgumentError):
            make_strategy("big-little", engine, bad)
