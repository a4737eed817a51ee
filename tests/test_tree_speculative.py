"""Tree verification of several draft branches: exact like the chain (fp32 tiny models).

Greedy: identical tokens to autoregressive decoding for n-gram and prompt-lookup branches,
fixed and auto branch counts, with and without in-place path compaction (the llama.cpp
way). Sampling: the joint distribution of the first tokens is the target's (chi-square),
and a deliberately broken rule fails the same test.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from test_speculative import (
    DRAWS,
    VOCAB,
    chi_square_pvalue,
    exact_joint,
    prompts,
    run,
    sampled_counts,
)
from tiny import hf_model, ours_from_hf

from draftsman.errors import InvalidArgumentError
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.sampling import Sampler, SamplingConfig
from draftsman.strategies import tree_steps
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.registry import make_strategy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative
from draftsman.trees.draft_tree import DraftTree
from draftsman.verification.tree import TreeVerdict


@pytest.fixture(scope="module")
def models():
    """The target of test_speculative (peaky, so greedy choices have clear margins)."""
    target = ours_from_hf(hf_model("llama", seed=0))
    with torch.no_grad():
        target.lm_head.weight.mul_(8)
    return {"target": target}


@pytest.fixture(scope="module")
def small_vocab():
    target = ours_from_hf(hf_model("llama", seed=11, vocab_size=VOCAB))
    with torch.no_grad():
        target.lm_head.weight.mul_(60)
    return target


def test_branches_merge_into_a_trie_with_the_first_branch_in_order():
    tree = DraftTree.build(9, [[1, 2, 3], [1, 4], [5]], prefix=2)
    assert tree.tokens == [9, 1, 2, 3, 4, 5]
    assert tree.parent == [0, 0, 1, 2, 1, 0]
    assert tree.children[0] == [1, 5] and tree.children[1] == [2, 4]
    assert tree.leaves == [3, 4, 5] and tree.nodes == 5
    assert tree.path_to(4) == [0, 1, 4]
    assert DraftTree.contiguous([0, 1, 2, 3]) == 4 and DraftTree.contiguous([0, 1, 4]) == 2
    mask = tree.layout.mask  # 2 prefix rows, then the nodes: each sees prefix + ancestors
    assert mask.shape == (8, 8) and bool(mask[2:, :2].all())
    assert mask[2 + 4, 2:].tolist() == [True, True, False, False, True, False]
    assert tree.layout.offsets.tolist() == [-2, -1, 0, 1, 2, 3, 2, 1]
    # the target would choose 1 after the root, 4 after node 1, 7 elsewhere
    argmax = [1, 4, 7, 7, 7, 7]
    assert tree.branch_lengths(argmax) == [1, 2, 0]
    assert tree.nodes_of_first(1) == 3 and tree.nodes_of_first(2) == 4


def make_tree_spec(models, drafter, gamma, branches, policy=None):
    proposer = {"ngram": NGramProposer(), "prompt-lookup": PromptLookupProposer()}[drafter]
    planner = BranchPlanner(None, 3, {n: float(n) ** 0.3 for n in range(1, 64)}) \
        if branches == "auto" else BranchPlanner(branches)
    return TreeSpeculative(models["target"], proposer, make_policy(gamma, policy), planner)


@pytest.mark.parametrize("exact_keep", [True, False])
@pytest.mark.parametrize("branches", [2, 3, "auto"])
@pytest.mark.parametrize("drafter", ["ngram", "prompt-lookup"])
def test_greedy_identical_to_autoregressive(models, drafter, branches, exact_keep,
                                            monkeypatch):
    target = models["target"]
    monkeypatch.setattr(type(target), "capabilities",
                        replace(target.capabilities, exact_tree_keep=exact_keep))
    reference = Autoregressive(models["target"])
    trees = later_branch_wins = 0
    for gamma in (1, 3, 6):
        spec = make_tree_spec(models, drafter, gamma, branches)
        for prompt in prompts():
            want, _ = run(reference, prompt)
            got, steps = run(spec, prompt)
            assert got == want, (drafter, branches, gamma)
            trees += sum(s.extra.get("branches", 0) > 1 for s in steps)
            later_branch_wins += sum(s.extra.get("branch", 0) > 0 for s in steps)
    assert trees > 0
    if branches != "auto":  # the compaction of a later branch's path is exercised
        assert later_branch_wins > 0


def test_auto_policy_and_cost_gamma_stay_exact(models):
    reference = Autoregressive(models["target"])
    spec = make_tree_spec(models, "ngram", "auto", "auto")
    for prompt in prompts():
        assert run(spec, prompt)[0] == run(reference, prompt)[0]


@pytest.mark.parametrize("drafter", ["ngram", "prompt-lookup"])
def test_a_one_branch_tree_decides_like_the_chain(models, drafter):
    """Same drafter, same cost-model γ policy: one branch per tree drafts and accepts exactly
    what the chain strategy does, step by step."""
    curve = {n: 0.9 * n for n in range(1, 80)}  # a CPU-like verify cost: γ = 0 is common
    for prompt in prompts():
        drafted = []
        for tree in (False, True):
            proposer = {"ngram": NGramProposer(), "prompt-lookup": PromptLookupProposer()}[
                drafter]
            policy = make_policy("auto", None)
            policy.calibrate(curve)
            spec = TreeSpeculative(models["target"], proposer, policy, BranchPlanner(1)) \
                if tree else Speculative(models["target"], proposer, policy)
            _, steps = run(spec, prompt, max_new=60)
            drafted.append([(s.drafted, s.accepted, s.extra.get("gamma")) for s in steps])
        assert drafted[0] == drafted[1]
        assert any(d for d, _, _ in drafted[0]) and any(g == 0 for _, _, g in drafted[0])


def test_eos_and_length_inside_a_tree_path(models):
    reference = Autoregressive(models["target"])
    prompt = prompts()[3]
    want, _ = run(reference, prompt, max_new=30)
    eos = frozenset({want[6]})
    cut = want[: want.index(want[6]) + 1]
    got, steps = run(make_tree_spec(models, "prompt-lookup", 6, 3), prompt, max_new=30,
                     eos=eos)
    assert got == cut and steps[-1].finish == "eos"
    for n in (1, 2, 7):
        got, steps = run(make_tree_spec(models, "ngram", 5, 2), prompt, max_new=n)
        assert got == want[:n] and steps[-1].finish == "length"


def test_broken_tree_rule_is_detected(small_vocab, monkeypatch):
    """Accepting the first guess at every node makes the output follow the drafter."""
    target = small_vocab

    def accept_first(tokens, children, p, sampler):
        path = [0]
        while children[path[-1]]:
            path.append(children[path[-1]][0])
        return TreeVerdict(path, sampler.draw(p[path[-1]]), False)

    monkeypatch.setattr(tree_steps, "verify_tree_sampling", accept_first)
    prompt = [1, 3, 2, 1, 3]
    spec = TreeSpeculative(target, NGramProposer(order=2), make_policy(2, None),
                           BranchPlanner(3))
    expected = exact_joint(target, prompt, 3, SamplingConfig(temperature=1.0))
    counts = sampled_counts(spec, prompt, 3, dict(temperature=1.0))
    assert chi_square_pvalue(counts, expected, DRAWS) < 1e-6


def test_branch_planner_pays_for_branches_only_when_rows_are_cheap():
    # the drafter's first branch is right half the time, its second the other half
    trees = [DraftTree.build(0, [[1, 2, 3], [4, 5, 6]]), DraftTree.build(0, [[1, 2, 3],
                                                                          [4, 5, 6]])]
    argmaxes = [[1, 2, 3, 9, 9, 9, 9], [4, 9, 9, 9, 5, 6, 8]]  # branch 1 / branch 2 right

    def trained(curve, refeed=False):
        planner = BranchPlanner(None, 2, curve, refeed=refeed, warmup=100)
        for i in range(20):
            assert planner.next_branches() == 2  # warm-up steps probe every branch
            planner.update(trees[i % 2], argmaxes[i % 2], 2)
        return planner

    flat = trained({n: 1.0 for n in range(1, 20)})  # extra rows are free (a GPU)
    assert flat.choice == 2 and flat.rate(2) > flat.rate(1)
    linear = trained({n: float(n) for n in range(1, 20)})  # every row costs a forward
    assert linear.choice == 1
    # each probe that confirmed one branch doubled the wait before the next (capped)
    linear.warmup = 0
    picks = [linear.next_branches() for _ in range(linear.max_wait)]
    assert picks[:-1] == [1] * (linear.max_wait - 1) and picks[-1] == 2
    # re-feeding the second branch's nodes makes it dearer
    assert trained({n: float(n) for n in range(1, 20)}, refeed=True).rate(2) < linear.rate(2)
    fixed = BranchPlanner(3)
    assert [fixed.next_branches() for _ in range(3)] == [3, 3, 3]


def test_lookup_and_ngram_offer_distinct_branches():
    seq = [5, 1, 2, 5, 3, 4, 5, 1, 9, 5]
    sampler = Sampler(SamplingConfig())
    # after "5": latest match first; the oldest one repeats the first guess 1 and is skipped
    lookup = PromptLookupProposer().propose_branches(seq, 2, 3, sampler)
    assert [p.tokens for p in lookup] == [[1, 9], [3, 4]]
    # "5" was followed by 1 twice and by 3 once; each branch continues greedily
    ngram = NGramProposer(order=2).propose_branches(seq, 2, 3, sampler)
    assert [p.tokens for p in ngram] == [[1, 9], [3, 4]]
    assert NGramProposer(order=2).propose_branches(seq, 2, 1, sampler)[0].tokens == [1, 9]


def test_branches_option_is_checked(models):
    def model(name, dtype=None, vocab=None):
        return SimpleNamespace(model=models["target"])

    engine = SimpleNamespace(target=SimpleNamespace(model=models["target"]), model=model,
                             default_draft=lambda: "target")
    assert isinstance(make_strategy("speculative", engine, {"draft": "ngram", "branches": "3"}),
                      TreeSpeculative)
    with pytest.raises(InvalidArgumentError, match="deterministic"):
        make_strategy("speculative", engine, {"draft": "target", "branches": 2})
    with pytest.raises(InvalidArgumentError, match="branches"):
        make_strategy("speculative", engine, {"draft": "ngram", "branches": 0})
