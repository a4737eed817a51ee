"""The suffix drafter: its candidates on hand-built sequences and histories, its incremental
index against a rebuild, the history store's scopes and budget, and exactness."""

from __future__ import annotations

import random

import pytest
import torch
from tiny import hf_model, ours_from_hf

from draftsman.core import GenerationConfig
from draftsman.proposers.history import HistoryStore
from draftsman.proposers.suffix import SuffixProposer
from draftsman.sampling import SamplingConfig
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import CostModelGamma, make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative


def drafter(history=None) -> SuffixProposer:
    p = SuffixProposer()
    p.use_history(history)
    p.start([], 0)
    return p


def test_longest_match_wins_over_a_more_frequent_short_one():
    # "7 8" is followed by 1 three times, but "5 6 7 8" (a 4-token match) by 2
    seq = [7, 8, 1, 0, 7, 8, 1, 0, 5, 6, 7, 8, 2, 3, 0, 7, 8, 1, 9, 5, 6, 7, 8]
    got = drafter().propose(seq, 3, None)
    assert got.tokens == [2, 3, 0]
    assert got.extra["match"] == got.extra["match_length"] == 4


def test_branches_ordered_by_frequency_then_recency():
    # after "0 4 5": 6 twice, 9 once (the newest), 3 once (older than 9)
    seq = [0, 4, 5, 6, 0, 4, 5, 3, 0, 4, 5, 6, 0, 4, 5, 9, 0, 4, 5]
    branches = drafter().propose_branches(seq, 2, 3, None)
    assert [b.tokens[0] for b in branches] == [6, 9, 3]
    assert branches[0].extra["support"] == 4
    assert branches[0].extra["confidence"] == pytest.approx(0.5)
    assert drafter().propose(seq, 2, None).tokens == [6, 0]


def test_branches_share_prefixes_and_diverge_deep():
    # "9 1 2" three times (distinct tokens before each), then 3 4 / 3 5 / 3 4
    seq = [20, 9, 1, 2, 3, 4, 21, 9, 1, 2, 3, 5, 22, 9, 1, 2, 3, 4, 23, 9, 1, 2]
    branches = drafter().propose_branches(seq, 3, 3, None)
    assert [b.tokens for b in branches] == [[3, 4, 23], [3, 5, 22], [3, 4, 21]]
    assert [b.extra["confidence"] for b in branches] == pytest.approx([1 / 3] * 3, abs=1e-3)


def test_history_drafts_when_the_sequence_has_no_match():
    store = HistoryStore(1000)
    store.add("a", [40, 41, 42, 43, 44, 45, 46])
    seq = [1, 2, 3, 41, 42]
    assert drafter().propose(seq, 4, None).tokens == []
    got = drafter(store.scope("a")).propose(seq, 4, None)
    assert got.tokens == [43, 44, 45, 46]  # and no further: the sequence ended there


def test_history_and_sequence_pool_their_occurrences():
    store = HistoryStore(1000)
    for _ in range(3):
        store.add("a", [10, 11, 12, 13])
    seq = [10, 11, 14, 0, 10, 11]  # the sequence says 14, the history says 12 three times
    branches = drafter(store.scope("a")).propose_branches(seq, 2, 2, None)
    assert [b.tokens[0] for b in branches] == [12, 14]


def reference_proposals(seq: list[int]) -> list:
    return [(b.tokens, b.extra) for b in drafter().propose_branches(seq, 5, 3, None)]


def test_rollback_matches_a_rebuild():
    rng = random.Random(3)
    live = drafter()
    seq: list[int] = []
    for _ in range(300):
        if seq and rng.random() < 0.3:
            del seq[rng.randrange(max(0, len(seq) - 8), len(seq)):]  # a rejected draft
        seq += [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
        got = [(b.tokens, b.extra) for b in live.propose_branches(seq, 5, 3, None)]
        assert got == reference_proposals(seq)
    fresh = drafter()
    fresh.index.update(seq)
    assert live.index.index == fresh.index.index


def test_scopes_never_leak():
    store = HistoryStore(1000)
    secret = [900, 901, 902, 903, 904, 905]
    store.add("key-a", [1, 2] + secret)
    store.add("key-b", [3, 4, 5, 6])
    seq = [7, 900, 901, 902]
    assert drafter(store.scope("key-a")).propose(seq, 3, None).tokens == [903, 904, 905]
    assert drafter(store.scope("key-b")).propose(seq, 3, None).tokens == []


def test_budget_holds_under_a_flood_and_evicts_least_recently_used_scope():
    rng = random.Random(0)
    store = HistoryStore(5000)
    store.add("kept", [5, 6, 7, 8, 9])
    for i in range(400):
        store.scope("kept")  # a client that keeps coming back
        store.add(f"client-{i % 50}", [rng.randrange(1000) for _ in range(rng.randrange(2, 300))])
        assert store.tokens <= 5000
    assert store.tokens > 4000
    assert store.scopes <= 51
    assert drafter(store.scope("kept")).propose([5, 6, 7], 2, None).tokens == [8, 9]
    assert store.bytes < 5000 * 400  # index included, dead entries compacted
    store.add("huge", list(range(20000)))  # longer than the budget: its tail is kept
    assert store.tokens == 5000 and store.scopes == 1


def test_evicted_positions_are_never_proposed():
    store = HistoryStore(10)
    store.add("a", [1, 2, 3, 4, 5, 6])
    store.add("a", [7, 8, 9, 10, 11, 12])  # evicts the first sequence
    assert store.tokens == 6
    assert drafter(store.scope("a")).propose([0, 1, 2], 3, None).tokens == []


@pytest.fixture(scope="module")
def target():
    model = ours_from_hf(hf_model("llama", seed=0))
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


def run(strategy, prompt, history=None, max_new=40):
    config = GenerationConfig(max_new, SamplingConfig(), history=history)
    steps = list(strategy.generate(prompt, config))
    return [t for s in steps for t in s.tokens], steps


def prompts():
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(5):
        base = torch.randint(0, 97, (5 + i,), generator=g).tolist()
        out.append(base * 3 + base[:2])
    return out


@pytest.mark.parametrize("branches", [1, 3, "auto"])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_identical_to_autoregressive(target, branches, gamma):
    reference = Autoregressive(target)
    store = HistoryStore(10_000)
    drafted = 0
    for prompt in prompts():
        expected, _ = run(reference, prompt)
        policy = make_policy(gamma, None, 8)
        if branches == 1:
            spec = Speculative(target, SuffixProposer(), policy)
        else:
            planner = BranchPlanner(None, 3, {n: float(n) ** 0.3 for n in range(1, 64)}) \
                if branches == "auto" else BranchPlanner(branches)
            spec = TreeSpeculative(target, SuffixProposer(), policy, planner)
        got, steps = run(spec, prompt, store.scope("me"))
        assert got == expected
        drafted += sum(s.drafted for s in steps)
        store.add("me", prompt + got)
    assert drafted > 0


class RowCounter:
    """Wraps a model's forward and records how many token rows each call fed."""

    def __init__(self, model) -> None:
        self.rows: list[int] = []
        self.inner = model.forward
        model.forward = self

    def __call__(self, tokens, *args, **kwargs):
        self.rows.append(tokens.shape[1])
        return self.inner(tokens, *args, **kwargs)


def test_cost_controller_decodes_plainly_when_no_guess_pays(target):
    """A controller that learnt guesses fail verifies none: every step feeds one row."""
    reference = Autoregressive(target)
    prompt = prompts()[2]
    expected, _ = run(reference, prompt)
    policy = CostModelGamma(max_gamma=8)
    policy.calibrate({n: float(n) for n in range(1, 10)})  # every row costs a forward
    policy.by_key = {k: [0.0, 40.0] for k in range(1, 17)}  # and no match length pays
    counter = RowCounter(target)
    try:
        got, steps = run(Speculative(target, SuffixProposer(), policy), prompt)
    finally:
        del target.forward
    assert got == expected
    decode = [s for s in steps if not s.prefill]
    assert all(s.drafted == 0 for s in decode)
    assert counter.rows[1:] == [1] * len(decode)
    assert any("match" in s.extra for s in decode), "the drafter did find matches"
