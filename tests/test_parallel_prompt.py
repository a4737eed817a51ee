"""Parallel prompt decoding: greedy output identical to autoregressive decoding for every tree
shape, typical acceptance marked lossy, the draft-model combination, training and resume."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_pair

from draftsman.core import GenerationConfig
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.proposers.prompt_tokens import PromptTokenDraftProposer
from draftsman.sampling import SamplingConfig
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.parallel_prompt import ParallelPrompt
from draftsman.strategies.speculative import Speculative
from draftsman.trees.layout import TreeSpec
from draftsman.trees.sparse import PRIOR_ACCURACY, make_trees, trim
from draftsman.verification.prompt_tree import TreeDecoder

PROMPT = [5, 17, 3, 44, 12, 9, 60, 2]


def run(strategy, prompt=PROMPT, n=40, **sampling) -> list[int]:
    config = GenerationConfig(n, SamplingConfig(**sampling))
    return [t for s in strategy.generate(prompt, config) for t in s.tokens]


def per_state(spec: TreeSpec, m: int) -> dict[int, TreeSpec]:
    return {k: trim(spec, k) for k in range(m + 1)}


SHAPES = {
    "size-1": lambda m: per_state(TreeSpec(((),), (0,)), m),
    "root-prompts-only": lambda m: per_state(TreeSpec(((),), (m,)), m),
    "chain": lambda m: per_state(TreeSpec.chain(m, m), m),
    "width-1": lambda m: per_state(TreeSpec.build([((), m), ((0,), 1), ((0, 0), 1)]), m),
    "wide-depth-1": lambda m: per_state(
        TreeSpec.build([((), 1)] + [((r,), 1) for r in range(6)]), m),
    "dynamic-8": lambda m: make_trees("dynamic", PRIOR_ACCURACY, m, 8).states,
    "dynamic-24": lambda m: make_trees("dynamic", PRIOR_ACCURACY, m, 24).states,
    "static-16": lambda m: make_trees("static", PRIOR_ACCURACY, m, 16).states,
    "random-20": lambda m: make_trees("random", PRIOR_ACCURACY, m, 20, seed=3).states,
}


# Shapes that never verify a guess: "size-1" carries no prompt tokens (no guesses at all),
# "root-prompts-only" guesses but has no candidate nodes to check them on. Both must run as
# plain decoding; every other shape must accept guesses (and refuse some), or the identity
# check would pass on the all-miss path alone.
NO_GUESSES = {"size-1", "root-prompts-only"}

# qwen2 and gpt2 tie their embeddings: at the default init scale the tiny models only echo
# the last token (24 copies of one token, which no random guess ever matches); a larger init
# scale gives them varied output. qwen2 runs with 2 embeddings per prompt token.
CASES = ([(shape, "llama", 1) for shape in sorted(SHAPES)]
         + [(shape, "qwen2", 2) for shape in ("width-1", "chain", "dynamic-24")]
         + [(shape, "gpt2", 1) for shape in ("width-1", "random-20")])
FAMILY_INIT = {"qwen2": dict(initializer_range=0.2), "gpt2": dict(initializer_range=0.2)}


@pytest.mark.parametrize("shape,family,epts", CASES)
def test_greedy_identical_to_autoregressive(shape, family, epts):
    _, model = tiny_pair(family, **FAMILY_INIT.get(family, {}))
    ref = run(Autoregressive(model), n=24)
    assert len(set(ref)) > 4, ref  # a varied reference, not one token echoed
    prompts = PromptTokens.from_vocabulary(model, 3, epts, seed=1)
    steps = list(ParallelPrompt(TreeDecoder(model, prompts, SHAPES[shape](3))).generate(
        PROMPT, GenerationConfig(24, SamplingConfig())))
    assert [t for s in steps for t in s.tokens] == ref
    accepted, drafted = sum(s.accepted for s in steps), sum(s.drafted for s in steps)
    if shape in NO_GUESSES:
        assert drafted == 0
    else:
        assert 0 < accepted < drafted, (accepted, drafted)


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_decode_steps_keep_the_tree_size_budget(size):
    # a step without guesses (its accepted node carried no prompt rows) must run state 0's
    # tree, not the prefill's root with all m prompt tokens: that would cost more rows than
    # the hardware-aware size allowed for
    _, model = tiny_pair("llama")
    prompts = PromptTokens.from_vocabulary(model, 3, 2, seed=1)
    trees = make_trees("dynamic", PRIOR_ACCURACY, 3, size, epts=2).states
    steps = list(ParallelPrompt(TreeDecoder(model, prompts, trees)).generate(
        PROMPT, GenerationConfig(24, SamplingConfig())))
    assert max(s.extra["rows"] for s in steps[1:]) <= size


def test_deep_acceptance_with_oracle_guesses():
    """Guesses that contain the true continuation at various ranks are accepted, the cache
    stays consistent, and the output is still identical."""
    _, model = tiny_pair("llama", seed=2)
    ref = run(Autoregressive(model), n=60)
    prompts = PromptTokens.from_vocabulary(model, 3, 1)
    trees = make_trees("dynamic", PRIOR_ACCURACY, 3, 24).states
    dec = TreeDecoder(model, prompts, trees, topk=8)
    cache = model.new_cache(200)
    res = dec.step(cache, list(PROMPT), None)
    out = [res.next_token]
    gen = torch.Generator().manual_seed(0)
    forwards = 0
    while len(out) < 60:
        k = res.state
        guesses = torch.randint(0, 97, (k, dec.topk), generator=gen)
        for d in range(k):  # plant the truth at a random rank (sometimes absent)
            if len(out) + d < len(ref) and torch.rand(1, generator=gen) < 0.8:
                r = int(torch.randint(0, 3, (1,), generator=gen))
                guesses[d][guesses[d] == ref[len(out) + d]] = 96 - d
                guesses[d, r] = ref[len(out) + d]
        res = dec.step(cache, [out[-1]], guesses)
        forwards += 1
        out += res.accepted + [res.next_token]
        assert cache.length == len(PROMPT) + len(out) - 1
    assert out[:60] == ref
    assert forwards < 45  # guesses were actually accepted


def sharp_model(seed: int = 4):
    """A tiny model with peaked next-token distributions (random ones are near uniform,
    which leaves prompt tokens nothing to learn)."""
    _, model = tiny_pair("llama", seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


def greedy_texts(model, count: int, n: int = 40) -> list[list[int]]:
    out = []
    for i in range(count):
        prompt = [i, (7 * i) % 97, 3]
        out.append(prompt + run(Autoregressive(model), prompt=prompt, n=n))
    return out


def test_training_reduces_heldout_loss_and_resumes(tmp_path):
    from draftsman.training.prompt_tokens import TrainConfig, train

    model = sharp_model()
    seqs = greedy_texts(model, 16)
    cfg = TrainConfig(steps=24, lr=0.01, insertions=12, eval_every=24, checkpoint_every=6)
    full, history = train(model, seqs[:12], seqs[12:], cfg, tmp_path / "a", progress=False)
    assert history[-1]["loss"] < 0.8 * history[0]["loss"]
    # interrupt after 14 steps (last checkpoint at 12), then resume: identical embeddings
    half = TrainConfig(**cfg.__dict__)
    import draftsman.training.prompt_tokens as tp

    calls = {"n": 0}
    real = tp.distill_forward

    def stop_after_20(*a, **k):
        calls["n"] += 1
        if calls["n"] > 14:
            raise KeyboardInterrupt
        return real(*a, **k)

    tp.distill_forward = stop_after_20
    try:
        with pytest.raises(KeyboardInterrupt):
            train(model, seqs[:12], seqs[12:], half, tmp_path / "b", progress=False)
    finally:
        tp.distill_forward = real
    resumed, _ = train(model, seqs[:12], seqs[12:], half, tmp_path / "b", progress=False)
    torch.testing.assert_close(resumed.embeddings, full.embeddings)
    loaded = PromptTokens.load(tmp_path / "b")
    torch.testing.assert_close(loaded.embeddings, full.embeddings)
    loaded.check(model)


def test_trained_prompt_tokens_identical_and_accepted(tmp_path):
    from draftsman.training.prompt_tokens import TrainConfig, train

    model = sharp_model()
    seqs = greedy_texts(model, 24)
    cfg = TrainConfig(steps=60, lr=0.01, insertions=16, eval_every=0, checkpoint_every=0)
    prompts, _ = train(model, seqs[:20], seqs[20:], cfg, tmp_path / "pt", progress=False)
    for shape in ("chain", "dynamic-24", "size-1"):
        strat = ParallelPrompt(TreeDecoder(model, prompts, SHAPES[shape](3)))
        for prompt in ([1, 7, 3], PROMPT):
            ref = run(Autoregressive(model), prompt=prompt, n=40)
            steps = list(strat.generate(prompt, GenerationConfig(40, SamplingConfig())))
            assert [t for s in steps for t in s.tokens] == ref
            if shape == "dynamic-24":
                assert len(steps) < 35  # guesses are being accepted


def test_sampling_uses_typical_acceptance_and_is_marked_lossy():
    _, model = tiny_pair("qwen2")
    prompts = PromptTokens.from_vocabulary(model, 3, 1)
    strat = ParallelPrompt(TreeDecoder(model, prompts, SHAPES["dynamic-8"](3)))
    config = GenerationConfig(30, SamplingConfig(temperature=0.8, seed=7))
    steps = list(strat.generate(PROMPT, config))
    assert sum(len(s.tokens) for s in steps) == 30
    assert steps[-1].extra["lossy"] and steps[-1].extra["acceptance"] == "typical"
    again = [t for s in strat.generate(PROMPT, config) for t in s.tokens]
    assert again == [t for s in steps for t in s.tokens]  # seeded


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_prompt_token_draft_with_speculative(temperature):
    _, target = tiny_pair("llama", seed=5)
    _, draft = tiny_pair("llama", seed=5, num_hidden_layers=1)
    prompts = PromptTokens.from_vocabulary(draft, 3, 1)
    dec = TreeDecoder(draft, prompts, SHAPES["dynamic-8"](3))
    spec = Speculative(target, PromptTokenDraftProposer(dec), make_policy(4, None, 12))
    ref = run(Autoregressive(target), n=40, temperature=temperature, seed=3)
    out = run(spec, n=40, temperature=temperature, seed=3)
    if temperature == 0:
        assert out == ref
    assert len(out) == 40
