"""Exactness of the speculative family on tiny random models (fp32).

Greedy: identical tokens to autoregressive decoding for every drafter, γ, policy and the
staged cascade. Sampling: the joint distribution of the first tokens matches the target's
exact distribution (chi-square), and the same test rejects a deliberately broken rule.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from tiny import hf_model, ours_from_hf

from draftsman.core import GenerationConfig
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.proposers.staged import StagedProposer
from draftsman.proposers.suffix import SuffixProposer
from draftsman.sampling import SamplingConfig, probabilities
from draftsman.strategies import step_machine
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.testing import chi_square_pvalue
from draftsman.verification.chain import Verdict


def perturbed_copy(model, scale: float, seed: int):
    """A draft that agrees with the target often but not always."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g))
    return draft


@pytest.fixture(scope="module")
def models():
    target = ours_from_hf(hf_model("llama", seed=0))
    with torch.no_grad():  # peakier distributions, so greedy choices have clear margins
        target.lm_head.weight.mul_(8)
    return {
        "target": target,
        "close": perturbed_copy(target, 0.3, 1),
        "far": perturbed_copy(target, 1.5, 2),
        "tiny": perturbed_copy(target, 0.8, 3),
    }


def run(strategy, prompt, max_new=40, eos=frozenset(), sampling=None):
    config = GenerationConfig(max_new, sampling or SamplingConfig(), eos)
    steps = list(strategy.generate(prompt, config))
    return [t for s in steps for t in s.tokens], steps


def prompts(n=6):
    g = torch.Generator().manual_seed(7)
    # repetitive prompts give the n-gram and lookup drafters something to find
    out = []
    for i in range(n):
        base = torch.randint(0, 97, (5 + i,), generator=g).tolist()
        out.append(base * 3 + base[:2])
    return out


def speculative(models, proposer, gamma=4, policy=None):
    return Speculative(models["target"], proposer, make_policy(gamma, policy))


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("drafter", ["close", "far", "ngram", "prompt-lookup"])
def test_greedy_identical_to_autoregressive(models, gamma, drafter):
    reference = Autoregressive(models["target"])
    proposer = {"ngram": NGramProposer(), "prompt-lookup": PromptLookupProposer()}.get(
        drafter) or DraftModelProposer(models[drafter])
    spec = speculative(models, proposer, gamma)
    accepted = drafted = 0
    for prompt in prompts():
        expected, _ = run(reference, prompt)
        got, steps = run(spec, prompt)
        assert got == expected
        assert sum(s.target_forwards for s in steps) <= len(expected)
        accepted += sum(s.accepted for s in steps)
        drafted += sum(s.drafted for s in steps)
    # plain decoding would pass the identity check too: guesses must have been kept (the
    # accept path ran) and, no drafter being perfect here, refused (the recovery path ran)
    assert 0 < accepted < drafted


@pytest.mark.parametrize("policy", ["heuristic", "acceptance", "cost"])
def test_adaptive_gamma_identical(models, policy):
    reference = Autoregressive(models["target"])
    spec = speculative(models, DraftModelProposer(models["close"]), "auto", policy)
    gammas = set()
    for prompt in prompts():
        expected, _ = run(reference, prompt)
        got, steps = run(spec, prompt)
        assert got == expected
        gammas |= {s.extra["gamma"] for s in steps if not s.prefill}
    assert len(gammas) > 1, "an adaptive policy should change γ"


@pytest.mark.parametrize("sub", ["ngram", "tiny"])
def test_staged_identical(models, sub):
    reference = Autoregressive(models["target"])
    sub_proposer = NGramProposer() if sub == "ngram" else DraftModelProposer(models["tiny"])
    for gamma, sub_gamma in [(2, 2), (4, 3), (6, 1)]:
        staged = Speculative(models["target"],
                             StagedProposer(models["close"], sub_proposer, sub_gamma),
                             make_policy(gamma, None))
        for prompt in prompts(4):
            expected, _ = run(reference, prompt)
            got, steps = run(staged, prompt)
            assert got == expected
            assert sum(s.extra.get("sub_drafted", 0) for s in steps) > 0


def test_staged_bypass_identical(models):
    """Long suffix matches go straight to the target, the rest through the draft model:
    both routes run, and the output is autoregressive decoding's."""
    reference = Autoregressive(models["target"])
    staged = Speculative(models["target"],
                         StagedProposer(models["close"], SuffixProposer(), 3, bypass=4),
                         make_policy("auto", None))
    bypassed = cascaded = 0
    for prompt in prompts(4):
        prompt = prompt + prompt  # a repeated prompt: the suffix drafter finds long matches
        expected, _ = run(reference, prompt)
        got, steps = run(staged, prompt)
        assert got == expected
        bypassed += sum(s.drafted for s in steps if s.extra.get("bypass"))
        cascaded += sum(s.drafted for s in steps if not s.extra.get("bypass"))
    assert bypassed > 0 and cascaded > 0


def test_staged_bypass_reads_a_long_lag_only_once_it_pays(models):
    """A bypassing cascade whose policy never finds the draft's lag worth reading: the draft
    model never runs (not even on the prompt), steps it wanted are reported `declined`, and
    the output is still autoregressive decoding's. With the lag affordable, the draft reads
    the prompt in a forward of its own, timed apart from its guesses."""
    from draftsman.strategies.gamma import CostModelGamma

    class Never(CostModelGamma):
        def model_ready(self, behind):
            return False

    reference = Autoregressive(models["target"])
    prompt = prompts(1)[0] * 3
    expected, _ = run(reference, prompt)
    for policy, drafts in ((Never(), False), (CostModelGamma(), True)):
        policy.calibrate({n: 1.0 + 0.05 * (n - 1) for n in range(1, 14)}, draft_cost=0.2)
        proposer = StagedProposer(models["close"], SuffixProposer(), 3, bypass=2)
        got, steps = run(Speculative(models["target"], proposer, policy), prompt)
        assert got == expected
        assert (sum(s.draft_forwards for s in steps) > 0) == drafts
        if drafts:
            assert any(s.extra.get("catch_up_seconds", 0) > 0 for s in steps)
        else:
            assert proposer.state.fed == [] and any(s.extra.get("declined") for s in steps)


def test_cost_policy_rents_before_reading_a_long_lag():
    """Ski rental: a draft model far behind (the prompt, a long bypassed stretch) may draft
    only once the savings forgone without it (1 - 1/its tokens per forward, per declined
    step) reach what reading the lag costs (c x the curve's cost per row at its widest);
    a lag the curve spans is free; drafting resets the rent; a model that does not pay
    (γ = 0) is never bought."""
    from draftsman.strategies.gamma import CostModelGamma, Feedback

    policy = CostModelGamma(max_gamma=8)
    policy.calibrate({n: 1.0 + 0.05 * (n - 1) for n in range(1, 10)}, draft_cost=0.3)
    assert policy.gamma > 0 and policy.model_ready(9)
    lag = 300
    price = policy.catch_up_cost(lag)
    assert price == pytest.approx(0.3 * 1.4 * lag / 9)
    declined = 0
    while not policy.model_ready(lag):
        policy.update(Feedback(0, 0, False, 0.0, 0, 0.05, declined=True))
        declined += 1
    saving = 1 - 1 / policy._model_rate()
    assert declined == pytest.approx(price / saving, abs=1)
    policy.update(Feedback(3, 2, True, 0.03, 3, 0.05))  # the model drafted: caught up
    assert policy.rent == 0 and not policy.model_ready(lag)
    policy.gamma = 0  # drafting does not pay: no step forgoes anything
    policy.update(Feedback(0, 0, False, 0.0, 0, 0.05, declined=True))
    assert policy.rent == 0


def test_draft_equal_to_target_accepts_everything(models):
    spec = speculative(models, DraftModelProposer(models["target"]), 5)
    expected, _ = run(Autoregressive(models["target"]), prompts()[0])
    got, steps = run(spec, prompts()[0])
    assert got == expected
    decode = [s for s in steps if not s.prefill]
    assert all(s.accepted == s.drafted for s in decode)
    assert sum(s.target_forwards for s in steps) <= 1 + -(-len(expected) // 6) + 1


def test_eos_inside_a_draft_ends_at_the_right_token(models):
    prompt = prompts()[1]
    free, _ = run(Autoregressive(models["target"]), prompt, max_new=40)
    eos_token = free[17]
    cut = free.index(eos_token) + 1
    spec = speculative(models, DraftModelProposer(models["target"]), 6)
    got, steps = run(spec, prompt, max_new=40, eos=frozenset({eos_token}))
    assert got == free[:cut]
    assert steps[-1].finish == "eos"


def test_max_new_tokens_respected_inside_accepted_run(models):
    spec = speculative(models, DraftModelProposer(models["target"]), 8)
    for n in (1, 2, 5, 9):
        got, steps = run(spec, prompts()[2], max_new=n)
        assert len(got) == n and steps[-1].finish == "length"


# ---- sampling: distribution tests ---------------------------------------------------

VOCAB = 5
DRAWS = 3000


@pytest.fixture(scope="module")
def small_vocab():
    target = ours_from_hf(hf_model("llama", seed=11, vocab_size=VOCAB))
    with torch.no_grad():
        target.lm_head.weight.mul_(60)
    draft = perturbed_copy(target, 1.0, 12)
    return target, draft


def exact_joint(model, prompt, n, sampling):
    """P(x_1..x_n | prompt) for every token tuple, by enumeration."""
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=n):
        p = 1.0
        ctx = list(prompt)
        for tok in seq:
            cache = model.new_cache(len(ctx) + 1)
            logits = model(torch.tensor([ctx]), torch.arange(len(ctx))[None], cache).logits
            p *= float(probabilities(logits[0, -1], sampling)[tok])
            ctx.append(tok)
        probs[seq] = p
    return probs


def sampled_counts(strategy, prompt, n, sampling_kwargs, draws=DRAWS):
    counts: dict = {}
    for seed in range(draws):
        toks, _ = run(strategy, prompt, max_new=n, sampling=SamplingConfig(seed=seed,
                                                                            **sampling_kwargs))
        counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
    return counts


SAMPLINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=3, top_p=0.9)]


@pytest.mark.parametrize("sampling_kwargs", SAMPLINGS)
def test_ngram_sampling_distribution_is_the_targets(small_vocab, sampling_kwargs):
    """Deterministic guesses; draft-model chains, trees and cascades are proven with
    coverage and mutations in test_conformance.py."""
    target, _ = small_vocab
    prompt = [1, 3, 2, 1, 3]
    spec = Speculative(target, NGramProposer(order=2), make_policy(3, None))
    expected = exact_joint(target, prompt, 3, SamplingConfig(**sampling_kwargs))
    counts = sampled_counts(spec, prompt, 3, sampling_kwargs)
    assert chi_square_pvalue(counts, expected, DRAWS) > 1e-3


def test_broken_acceptance_rule_is_detected(small_vocab, monkeypatch):
    """Accepting every draft makes the output follow the draft: the same test must fail."""
    target, draft = small_vocab

    def accept_all(drafts, q, p, sampler):
        return Verdict(len(drafts), sampler.draw(p[len(drafts)]), False)

    monkeypatch.setattr(step_machine, "verify_sampling", accept_all)
    prompt = [1, 3, 2, 1, 3]
    spec = Speculative(target, DraftModelProposer(draft), make_policy(3, None))
    expected = exact_joint(target, prompt, 3, SamplingConfig(temperature=1.0))
    counts = sampled_counts(spec, prompt, 3, dict(temperature=1.0))
    assert chi_square_pvalue(counts, expected, DRAWS) < 1e-6


def test_cost_policy_plans_deterministic_guesses_by_match_length():
    """Guesses of a match length that keeps failing are not verified (plain decoding);
    those of a length that keeps succeeding are, as many as pay on the verify cost curve."""
    from draftsman.strategies.gamma import CostModelGamma, Feedback

    policy = CostModelGamma(max_gamma=8, verify_cost={n: 1 + 0.6 * (n - 1) for n in range(1, 10)})
    for _ in range(12):
        policy.update(Feedback(2, 0, True, 0.0, 0, 0.05, key=1))
        policy.update(Feedback(4, 4, False, 0.0, 0, 0.05, key=3))
    assert policy.plan(6, 1) == 0
    assert 2 <= policy.plan(6, 3) <= 6
    assert policy.plan(6, 9) >= 1  # never seen: probed with at least one guess
    assert CostModelGamma().plan(3, None) <= 3


def test_cost_policy_routes_free_guesses_by_what_their_match_length_earned():
    """A cascade's free guesses bypass the draft model where their match length has kept
    paying more than the model's drafting does, and go through the model where it has not
    (`route` 0); unsent guesses are scored against the committed text (shadow_verdict)."""
    from draftsman.strategies.gamma import CostModelGamma
    from draftsman.strategies.step_machine import shadow_verdict

    policy = CostModelGamma(max_gamma=8, verify_cost={n: 1 + 0.05 * (n - 1) for n in range(1, 10)})
    policy.cost, policy.accepts, policy.trials, policy.gamma = 0.3, 8.0, 10.0, 3  # α 0.8
    for _ in range(12):
        policy.learn_key(2, 0, True)  # 2-token matches: first guess always wrong
        policy.learn_key(8, 6, False)  # 8-token matches: long runs kept
    assert policy.route(6, 2) == 0
    assert policy.route(6, 8) == 6
    assert shadow_verdict([5, 6, 7], [5, 6, 9]) == (2, True)
    assert shadow_verdict([5, 6, 7], [5, 6]) == (2, False)  # the step ended: not refused
    assert shadow_verdict([5], [5, 1, 2]) == (1, False)


def test_cost_policy_probes_only_when_probing_is_free():
    """After settling at γ = 0 the policy re-probes with γ = 1 every 8 steps, unless probes
    are off (a draft model would first have to read every token it skipped)."""
    from draftsman.strategies.gamma import CostModelGamma, Feedback

    def run(probe: bool) -> list[int]:
        policy = CostModelGamma(verify_cost={n: float(n) for n in range(1, 14)})
        policy.probe = probe
        policy.update(Feedback(4, 0, True, 0.4, 4, 0.1))  # useless and costly guesses
        seen = []
        for _ in range(20):
            seen.append(policy.next_gamma())
            policy.update(Feedback(0, 0, False, 0.0, 0, 0.1))
        return seen

    assert set(run(probe=False)) == {0}
    assert 1 in run(probe=True)


def test_cost_policy_calibration_chooses_the_first_gamma():
    """Before any step: flat verify cost and a cheap draft -> speculate; a verify cost that
    grows like the tokens verified and a draft at 0.6 of the target -> no γ pays even if
    every guess were accepted -> γ = 0 for good; in between -> γ = 1 to learn α."""
    from draftsman.strategies.gamma import CostModelGamma

    def first_gamma(verify: dict[int, float], cost: float) -> int:
        policy = CostModelGamma(max_gamma=8)
        policy.calibrate(verify, cost)
        return policy.next_gamma()

    flat = {n: 1.0 + 0.02 * (n - 1) for n in range(1, 10)}
    linear = {n: float(n) for n in range(1, 10)}
    steep = {n: 1.0 + 0.75 * (n - 1) for n in range(1, 10)}
    assert first_gamma(flat, 0.1) >= 3
    assert first_gamma(linear, 0.6) == 0
    assert first_gamma(steep, 0.2) == 1  # pays at α = 0.99, not at the prior α = 0.7


def test_a_model_free_drafter_starts_at_no_drafting_cost(monkeypatch):
    """Lookup, n-gram and suffix guesses cost microseconds: their cost policy starts at
    c = 0 (the running estimate learns the rest), not at a draft model's prior 0.3 that
    made a batch controller refuse every fresh request's guesses under load."""
    from draftsman.proposers.prompt_lookup import PromptLookupProposer
    from draftsman.strategies import registry
    from draftsman.strategies.gamma import CostModelGamma

    curve = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 20)}
    monkeypatch.setattr(registry, "verify_cost_curve", lambda engine, n: curve)
    policy = CostModelGamma(max_gamma=8)
    registry._calibrate(policy, None, PromptLookupProposer())
    assert policy.cost == 0.0 and policy.probe


def test_a_draft_that_cannot_pay_is_never_run(models):
    """A calibrated cost policy that rules out every γ decodes plainly: no draft forward,
    no draft time, autoregressive tokens."""
    from draftsman.strategies.gamma import CostModelGamma

    policy = CostModelGamma()
    policy.probe = False
    policy.calibrate({n: float(n) for n in range(1, 14)}, 0.6)
    spec = Speculative(models["target"], DraftModelProposer(models["close"]), policy)
    reference = Autoregressive(models["target"])
    for prompt in prompts(3):
        expected, _ = run(reference, prompt)
        got, steps = run(spec, prompt)
        assert got == expected
        assert sum(s.draft_forwards for s in steps) == 0
        assert all(s.drafted == 0 for s in steps)


def test_reading_the_prompt_is_not_a_cost_per_guess(models, monkeypatch):
    """A draft model reads the prompt once, when first asked for guesses: that time is the
    step's draft time but not the γ policy's cost per guess (it once made a long prompt's
    first guess look many target forwards dear and switched the draft off for good)."""
    proposer = DraftModelProposer(models["close"])
    start = proposer.start
    prompt = prompts(1)[0]
    read: list[list[int]] = []

    def slow_start(prompt_ids, capacity):
        time.sleep(0.3)
        start(prompt_ids, capacity)
        read.append(list(proposer.state.fed))

    monkeypatch.setattr(proposer, "start", slow_start)
    policy = make_policy(2, None)
    seen = []
    update = policy.update
    monkeypatch.setattr(policy, "update", lambda fb: (seen.append(fb), update(fb))[1])
    got, steps = run(Speculative(models["target"], proposer, policy), prompt, max_new=8)
    assert read == [prompt[:-1]]
    assert seen and max(fb.draft_seconds for fb in seen) < 0.3
    assert sum(s.draft_seconds for s in steps) >= 0.3
    assert got == run(Autoregressive(models["target"]), prompt, max_new=8)[0]
