"""The conformance suite: every exact method distribution-exact under sampling, with the
paths it exists for measured, and a deliberately broken rule beside each that must fail.

Tiny Llamas over a 4-token vocabulary (every 5-token window is one of 1024 cells), a
target with a spread-out distribution and a draft that is neither one-hot nor the target.
Expected distributions come from draftsman.testing's float64 reference sampler, itself
checked against transformers' warpers; the top-p boundary convention is pinned with exact
binary masses. Correct rules must pass (p > 0.01 over the window's tests); every mutation
must be rejected at p < 1e-6.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from test_quant import gguf_model, quantised
from test_speculative import perturbed_copy
from tiny import hf_model, ours_from_hf

from draftsman import sampling as sampling_module
from draftsman.kernels.native import byte_records
from draftsman.models.loader import build_model
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.proposers import staged as staged_module
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.proposers.history import HistoryStore
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.proposers.prompt_tokens import PromptTokenDraftProposer
from draftsman.proposers.staged import StagedProposer
from draftsman.proposers.suffix import SuffixProposer
from draftsman.sampling import SamplingConfig, probabilities
from draftsman.strategies import step_machine, tree_steps
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import CostModelGamma, make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative
from draftsman.testing import check_exact, reference_probabilities, target_joint
from draftsman.trees.sparse import PRIOR_ACCURACY, make_trees
from draftsman.verification import chain
from draftsman.verification.prompt_tree import TreeDecoder
from draftsman.verification.tree import TreeVerdict

VOCAB = 4
WINDOW = 5  # prefill token + up to 3 guesses + bonus in the first step
# `make test-exact` raises it for releases (DRAFTSMAN_EXACT_DRAWS=20000)
DRAWS = int(os.environ.get("DRAFTSMAN_EXACT_DRAWS", "2000"))
CHAIN_PROMPT = [1, 3, 2, 1, 3, 0]
# order-2 contexts "0 1" followed by 2, 3 and 0: the n-gram drafter offers three branches
TREE_PROMPT = [0, 1, 2, 0, 1, 3, 0, 1, 0, 2, 0, 1]
T1 = SamplingConfig(temperature=1.0)
CUT = SamplingConfig(temperature=0.8, top_k=3, top_p=0.9)
CHAIN_NEEDS = ["accepted at 1", "accepted at 2", "accepted at 3", "rejected at 1",
               "rejected at 2", "rejected at 3", "bonus"]


def spread_pair():
    """(target, draft) over VOCAB tokens: a spread-out target and a flatter, perturbed draft."""
    target = ours_from_hf(hf_model("llama", seed=11, vocab_size=VOCAB, num_hidden_layers=1))
    with torch.no_grad():
        target.lm_head.weight.mul_(12)  # spread out, not one-hot
    draft = perturbed_copy(target, 0.6, 12)
    with torch.no_grad():
        draft.lm_head.weight.mul_(0.5)  # flatter than the target: rejections everywhere
    return target, draft


@pytest.fixture(scope="module")
def models():
    return spread_pair()


@pytest.fixture(scope="module")
def joints(models):
    target, _ = models
    return {(tuple(prompt), s): target_joint(target, prompt, WINDOW, s)
            for prompt in (CHAIN_PROMPT, TREE_PROMPT) for s in (T1, CUT)}


def report(result, name):
    print(f"\n{name}\n{result.table()}")
    return result


# ----------------------------------------------------------------------------- reference


def test_reference_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        logits = torch.randn(1, 50, generator=g, dtype=torch.float64) * 3
        temperature, top_k, top_p = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8),
                                     (0.5, 10, 0.6)][trial % 4]
        z = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            z = TopKLogitsWarper(top_k)(None, z)
        if top_p < 1:
            z = TopPLogitsWarper(top_p)(None, z)
        want = z.softmax(-1)[0].numpy()
        got = reference_probabilities(logits[0].numpy(), temperature, top_k, top_p)
        np.testing.assert_allclose(got, want, atol=1e-12)
        ours = probabilities(logits[0].float(), SamplingConfig(temperature, top_k, top_p))
        np.testing.assert_allclose(ours.double().numpy(), want, atol=1e-5)


# exact binary masses 1/2, 1/4, 1/8, 1/8: a head of mass exactly top_p = 3/4 is the kept set
BOUNDARY = torch.log(torch.tensor([0.125, 0.5, 0.125, 0.25], dtype=torch.float64))


def flipped_top_p(logits, config):
    """A mutation: top-p drops a token only when the mass before it exceeds top_p."""
    logits = logits.float() / config.temperature
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    above = sorted_probs.cumsum(-1) - sorted_probs
    drop_sorted = above > config.top_p
    logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits.softmax(-1)


@pytest.mark.parametrize("rule", ["ours", "flipped"])
def test_top_p_boundary_convention(rule):
    config = SamplingConfig(temperature=1.0, top_p=0.75)
    want = reference_probabilities(BOUNDARY.numpy(), 1.0, 0, 0.75)
    assert np.allclose(want, [0, 2 / 3, 0, 1 / 3])  # the 1/2 and 1/4 tokens, renormalised
    fn = probabilities if rule == "ours" else flipped_top_p
    got = fn(BOUNDARY.float(), config).double().numpy()
    assert np.allclose(got, want, atol=1e-6) == (rule == "ours")


# ----------------------------------------------------------------------------- chains


def chain_strategy(models, gamma=3):
    target, draft = models
    return Speculative(target, DraftModelProposer(draft), make_policy(gamma, None))


@pytest.mark.parametrize("sampling", [T1, CUT], ids=["t1", "top-k-top-p"])
def test_speculative_draft_model_is_exact(models, joints, sampling):
    result = report(check_exact(chain_strategy(models), CHAIN_PROMPT,
                                joints[(tuple(CHAIN_PROMPT), sampling)], sampling, DRAWS,
                                require=CHAIN_NEEDS), "speculative, draft model, γ = 3")
    assert result.passed(), result.table()


def test_draft_is_not_degenerate(models):
    """The draft's top probability is well below 1 (the old suite's was 1.0 at the median)."""
    _, draft = models
    ctx = torch.tensor([CHAIN_PROMPT])
    logits = draft(ctx, torch.arange(ctx.shape[1])[None], draft.new_cache(8)).logits[0]
    top = probabilities(logits, T1).max(-1).values
    assert float(top.median()) < 0.9


def off_by_one_residual(drafts, q, p, sampler):
    """A mutation: after a rejection at depth i the residual takes the target's distribution
    of depth i + 1 (the per-token rule, otherwise as chain.verify_sampling)."""
    if not drafts:
        return chain.Verdict(0, sampler.draw(p[0]), False)
    u = sampler.uniform(len(drafts))
    for i, x in enumerate(drafts):
        if float(u[i] * q[i, x]) >= float(p[i, x]):
            # (the refused guess itself stays excluded, as in the correct rule)
            residual = (p[i + 1] - q[i]).clamp_min(0).index_fill(0, torch.tensor(x), 0)
            if residual.sum() <= 0:
                residual = p[i + 1].index_fill(0, torch.tensor(x), 0)
            return chain.Verdict(i, sampler.draw(residual / residual.sum()), True)
    return chain.Verdict(len(drafts), sampler.draw(p[len(drafts)]), False)


def bonus_from_draft(drafts, q, p, sampler):
    """A mutation: when every guess is kept, the extra token is drawn from the draft."""
    verdict = chain.verify_sampling(drafts, q, p, sampler)
    if verdict.rejected or q is None or not drafts:
        return verdict
    return chain.Verdict(verdict.accepted, sampler.draw(q[-1]), False)


@pytest.mark.parametrize("mutation", [off_by_one_residual, bonus_from_draft],
                         ids=["off-by-one-residual", "bonus-from-draft"])
def test_chain_mutations_are_rejected(models, joints, monkeypatch, mutation):
    monkeypatch.setattr(step_machine, "verify_sampling", mutation)
    result = report(check_exact(chain_strategy(models), CHAIN_PROMPT,
                                joints[(tuple(CHAIN_PROMPT), T1)], T1, DRAWS),
                    f"mutation {mutation.__name__}")
    assert result.p_min < 1e-6, result.table()


# ----------------------------------------------------------------------------- trees


def tree_strategy(models, branches=3):
    target, _ = models
    return TreeSpeculative(target, NGramProposer(order=2), make_policy(2, None),
                           BranchPlanner(branches))


@pytest.mark.parametrize("sampling", [T1, CUT], ids=["t1", "top-k-top-p"])
def test_tree_with_three_branches_is_exact(models, joints, sampling):
    result = report(check_exact(tree_strategy(models), TREE_PROMPT,
                                joints[(tuple(TREE_PROMPT), sampling)], sampling, DRAWS,
                                require=["branches >= 2", "branches >= 3",
                                         "sibling after rejection", "accepted at 1",
                                         "rejected at 1", "bonus"]),
                    "tree speculation, 3 branches")
    assert result.passed(), result.table()


def sibling_not_cleared(tokens, children, p, sampler):
    """A mutation: a refused guess leaves the residual unless it was the first child."""
    path = [0]
    while True:
        node = path[-1]
        residual = p[node].clone()
        for i, child in enumerate(children[node]):
            mass = float(residual.sum())
            if float(sampler.uniform(1)[0]) * mass < float(residual[tokens[child]]):
                path.append(child)
                break
            if i == 0:
                residual[tokens[child]] = 0.0
        else:
            return TreeVerdict(path, sampler.draw(residual / residual.sum()),
                               bool(children[node]))


def test_tree_mutation_is_rejected(models, joints, monkeypatch):
    monkeypatch.setattr(tree_steps, "verify_tree_sampling", sibling_not_cleared)
    result = report(check_exact(tree_strategy(models), TREE_PROMPT,
                                joints[(tuple(TREE_PROMPT), T1)], T1, DRAWS),
                    "mutation: sibling not cleared")
    assert result.p_min < 1e-6, result.table()


# ----------------------------------------------------------------------------- staged


def staged_strategy(models):
    target, draft = models
    return Speculative(target, StagedProposer(draft, NGramProposer(order=2), sub_gamma=2),
                       make_policy(3, None))


def test_staged_cascade_is_exact(models, joints):
    result = report(check_exact(staged_strategy(models), CHAIN_PROMPT,
                                joints[(tuple(CHAIN_PROMPT), T1)], T1, DRAWS,
                                require=["stage-1 accepted", "stage-1 rejected",
                                         "accepted at 1", "accepted at 2", "rejected at 1",
                                         "rejected at 2", "bonus"]),
                    "staged: n-gram -> draft -> target")
    assert result.passed(), result.table()


def test_staged_mutation_is_rejected(models, joints, monkeypatch):
    """A mutation: the target checks the staged guesses against the draft's distributions
    one position late (stage 2 against the wrong q). (One-hot q would not be a bug: random
    guesses checked as deterministic ones are still exact.)"""
    def wrong_q(proposal):
        if proposal.q is not None and len(proposal.tokens) > 1:
            proposal.q = torch.cat([proposal.q[:1], proposal.q[:-1]])
        return proposal

    result = staged_mutation(monkeypatch, wrong_q, staged_strategy(models), CHAIN_PROMPT, joints,
                             "mutation: stage 2 against the wrong distribution")
    assert result.p_min < 1e-6, result.table()


def staged_mutation(monkeypatch, mutate, strategy, prompt, joints, name):
    """`check_exact` of `strategy` with every staged proposal passed through `mutate`."""
    original = StagedProposer.propose

    def mutated(self, *args, **kwargs):
        return mutate(original(self, *args, **kwargs))

    monkeypatch.setattr(staged_module.StagedProposer, "propose", mutated)
    return report(check_exact(strategy, prompt, joints[(tuple(prompt), T1)], T1, DRAWS), name)


def test_harness_rejects_a_wrong_sampler(models, joints, monkeypatch):
    """The harness itself has power: a target sampled at the wrong temperature fails."""
    real = sampling_module.probabilities
    monkeypatch.setattr(sampling_module, "probabilities",
                        lambda logits, config: real(logits * 1.3, config))
    result = check_exact(chain_strategy(models), CHAIN_PROMPT,
                         joints[(tuple(CHAIN_PROMPT), T1)], T1, 1000)
    assert result.p_min < 1e-6, result.table()


# ----------------------------------------------------------------------------- model-free


def test_prompt_lookup_is_exact(models, joints):
    """Deterministic guesses copied from the prompt: accepted and refused at every depth."""
    target, _ = models
    strategy = Speculative(target, PromptLookupProposer(), make_policy(3, None))
    result = report(check_exact(strategy, TREE_PROMPT, joints[(tuple(TREE_PROMPT), T1)], T1,
                                DRAWS, require=CHAIN_NEEDS), "speculative, prompt lookup")
    assert result.passed(), result.table()


def test_suffix_with_history_is_exact(models, joints):
    """Guesses copied from the client's earlier sequences (the history scope): an earlier
    reply that continued this prompt with the target's most likely tokens."""
    target, _ = models
    store = HistoryStore(1000)
    likely = max(joints[(tuple(CHAIN_PROMPT), CUT)].items(), key=lambda kv: kv[1])[0]
    store.add("user", [2, 2] + CHAIN_PROMPT + list(likely) + [1, 1])
    strategy = Speculative(target, SuffixProposer(), make_policy(3, None))
    result = report(check_exact(strategy, CHAIN_PROMPT, joints[(tuple(CHAIN_PROMPT), CUT)],
                                CUT, DRAWS, require=["accepted at 1", "accepted at 2",
                                                     "rejected at 1", "rejected at 2"],
                                history=store.scope("user")),
                    "speculative, suffix drafter over a history")
    assert result.passed(), result.table()


# ----------------------------------------------------------------------------- γ mid-run


class PinnedCostGamma(CostModelGamma):
    """The cost-model controller with the draft's cost pinned: the tiny draft costs what the
    target does, so the measured cost would turn guessing off; a real draft is cheaper."""

    def update(self, fb):
        cost = self.cost
        super().update(fb)
        self.cost = cost


def test_cost_model_gamma_changing_mid_run_is_exact(models, joints):
    """The cost-model controller re-chooses γ every step from the acceptance so far: the
    length of the next guess depends on earlier verdicts, never on future draws."""
    target, draft = models
    policy = PinnedCostGamma(gamma=3, max_gamma=4)
    policy.calibrate({k: 1.0 + 0.02 * (k - 1) for k in range(1, 6)}, draft_cost=0.05)
    strategy = Speculative(target, DraftModelProposer(draft), policy)
    result = report(check_exact(strategy, CHAIN_PROMPT, joints[(tuple(CHAIN_PROMPT), T1)],
                                T1, DRAWS, require=["gamma changed", "accepted at 1",
                                                    "accepted at 2", "rejected at 1",
                                                    "rejected at 2", "bonus"]),
                    "speculative, cost-model γ")
    assert result.passed(), result.table()


class BypassingGamma(PinnedCostGamma):
    """Routes every long match past the draft. Which route a step takes is the policy's
    choice from the history; any such choice must keep the output exact, and this one
    makes both routes frequent in the window."""

    def route(self, guesses, key, model=True):
        return guesses


def bypass_strategy(models):
    """A cascade whose n-gram guesses after a 2-token context skip the draft (cost-model
    γ, as `bypass` needs), those after one token going through it."""
    target, draft = models
    policy = BypassingGamma(gamma=2, max_gamma=3)
    policy.calibrate({k: 1.0 + 0.02 * (k - 1) for k in range(1, 6)}, draft_cost=0.05)
    return Speculative(target, StagedProposer(draft, NGramProposer(order=3), sub_gamma=2,
                                              bypass=2), policy)


def test_staged_bypass_is_exact(models, joints):
    result = report(check_exact(bypass_strategy(models), TREE_PROMPT,
                                joints[(tuple(TREE_PROMPT), T1)], T1, DRAWS,
                                require=["bypass", "stage-1 accepted", "stage-1 rejected",
                                         "accepted at 1", "accepted at 2", "rejected at 1",
                                         "bonus"]),
                    "staged with bypass: long matches straight to the target")
    assert result.passed(), result.table()


def test_staged_bypass_mutation_is_rejected(models, joints, monkeypatch):
    """A mutation: the bypassed guesses are checked as if drawn from a flat draft (the
    middle model's rows passed along), not as the point masses they are."""
    def flat_q(proposal):
        if proposal.extra.get("bypass"):
            proposal.q = torch.full((len(proposal.tokens), VOCAB), 1.0 / VOCAB)
        return proposal

    result = staged_mutation(monkeypatch, flat_q, bypass_strategy(models), TREE_PROMPT, joints,
                             "mutation: bypassed guesses against a flat q")
    assert result.p_min < 1e-6, result.table()


# ----------------------------------------------------------------------------- prompt tokens


def test_prompt_token_draft_is_exact(models, joints):
    """Parallel prompt decoding's exact rule under sampling: the draft decodes with its own
    prompt tokens (deterministic guesses) and the target verifies by speculative sampling.
    (Plain parallel prompt decoding samples by typical acceptance, declared lossy.)"""
    target, draft = models
    prompts = PromptTokens.from_vocabulary(draft, 3, 1, seed=2)
    decoder = TreeDecoder(draft, prompts, make_trees("dynamic", PRIOR_ACCURACY, 3, 8).states)
    strategy = Speculative(target, PromptTokenDraftProposer(decoder), make_policy(3, None))
    result = report(check_exact(strategy, CHAIN_PROMPT, joints[(tuple(CHAIN_PROMPT), T1)],
                                T1, DRAWS, require=CHAIN_NEEDS),
                    "speculative, draft with prompt tokens")
    assert result.passed(), result.table()


# ----------------------------------------------------------------------------- quantised


@pytest.mark.parametrize("kind,kernel", [("q4", "packed"), ("q8", "packed"), ("q8", "onednn"),
                                         ("q8", "records")])
def test_quantised_targets_are_exact(monkeypatch, kind, kernel):
    """A q4 / q8 target on its batch-invariant kernels: the rows of a verify forward are the
    one-token forward's, so speculative sampling draws the quantised model's own tokens.
    Vocabulary 97 under top-k 3: the expected joint walks the 81 cells of 4 tokens."""
    if kernel == "records" and not byte_records():
        pytest.skip("no AVX-512 VNNI on this CPU: no Q8_0 records")
    monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", kernel)
    config, state, blocks = gguf_model("llama", seed=0, lm_scale=4.0)
    target = quantised(config, state, blocks, kind=kind)
    draft = perturbed_copy(build_model(config, state, torch.float32), 0.04, 5)
    prompt = [5, 17, 3, 44, 12, 9, 60, 2]
    sampling = SamplingConfig(temperature=1.0, top_k=3)
    expected = target_joint(target, prompt, 4, sampling)
    assert len(expected) == 81
    strategy = Speculative(target, DraftModelProposer(draft), make_policy(2, None))
    # a quarter of the draws: these forwards cost ~10x the 4-token models'
    result = report(check_exact(strategy, prompt, expected, sampling, DRAWS // 4,
                                require=["accepted at 1", "accepted at 2", "rejected at 1",
                                         "rejected at 2", "bonus"]),
                    f"speculative on a {kind} target ({kernel})")
    assert result.passed(), result.table()
