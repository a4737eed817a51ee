"""Many requests, one forward: ragged forwards, the step scheduler and its controller.

Each request's output must be what it is alone: greedy token-identical in float32 (the
tiny models' margins are far above the BLAS's row-order rounding), seeded sampling
identical draw for draw when its γ is its own, and distribution-exact under a changing
batch with the load-adaptive controller choosing γ (with a broken rule beside it that must
fail). Joining, leaving, cancelling, starvation and a failing request are tested on the
scheduler directly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_conformance import (
    CHAIN_NEEDS,
    CHAIN_PROMPT,
    T1,
    TREE_PROMPT,
    VOCAB,
    WINDOW,
    sibling_not_cleared,
    spread_pair,
)
from test_speculative import perturbed_copy
from tiny import tiny_pair

from draftsman.batching.controller import Offer, allocate, expected_gains
from draftsman.batching.scheduler import BatchConfig, BatchScheduler
from draftsman.core import GenerationConfig
from draftsman.errors import UnsupportedError
from draftsman.models.ragged import RaggedCaches, Segment
from draftsman.models.static_step import StaticModel
from draftsman.proposers.base import Proposal
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.proposers.staged import StagedProposer
from draftsman.proposers.suffix import SuffixProposer
from draftsman.sampling import SamplingConfig
from draftsman.strategies import step_machine, tree_steps
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import CostModelGamma, make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative
from draftsman.testing import check_exact, target_joint
from draftsman.testing.in_batch import InBatch
from draftsman.verification.chain import Verdict

# ------------------------------------------------------------------ ragged forwards


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_ragged_forward_equals_each_sequence_alone(family):
    _, model = tiny_pair(family)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (5, 9, 3)]
    news = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (1, 4, 20)]
    alone, caches = [], []
    for p, new in zip(prompts, news, strict=True):
        for target in (alone, caches):
            cache = model.new_cache(40)
            model(torch.tensor([p]), torch.arange(len(p))[None], cache)
            if target is alone:  # 20 rows alone take SDPA; in the batch they must too
                pos = torch.arange(len(p), len(p) + len(new))[None]
                alone.append((model(torch.tensor([new]), pos, cache).logits[0], cache))
            else:
                caches.append(cache)
    segments = [Segment(c, len(p), len(n)) for c, p, n in zip(caches, prompts, news,
                                                              strict=True)]
    ids = torch.tensor([sum(news, [])])
    pos = torch.tensor([[len(p) + j for p, n in zip(prompts, news, strict=True)
                         for j in range(len(n))]])
    out = model(ids, pos, RaggedCaches(segments)).logits[0]
    torch.testing.assert_close(out, torch.cat([a for a, _ in alone]), rtol=1e-5, atol=1e-5)
    for (_, ref), mine in zip(alone, caches, strict=True):
        assert mine.length == ref.length
        torch.testing.assert_close(mine.k[:, :, :, :ref.length], ref.k[:, :, :, :ref.length])


def test_ragged_forward_refuses_what_it_cannot_do():
    _, model = tiny_pair("llama")
    caches = RaggedCaches([Segment(model.new_cache(8), 0, 2)])
    with pytest.raises(UnsupportedError, match="ragged"):
        model(torch.tensor([[1, 2]]), torch.tensor([[0, 1]]), caches, layers=range(1))
    with pytest.raises(ValueError, match="at least one row"):
        RaggedCaches([Segment(model.new_cache(8), 0, 0)])


# ------------------------------------------------------------------ the controller

def test_controller_with_one_request_is_the_cost_model_gamma():
    """One request: the controller's choice equals CostModelGamma's own best γ."""
    for curve in ({n: 1 + 0.05 * (n - 1) for n in range(1, 40)},
                  {n: 1 + 0.6 * (n - 1) for n in range(1, 40)},
                  {n: float(n) for n in range(1, 40)}):
        for alpha in (0.3, 0.6, 0.9):
            policy = CostModelGamma(max_gamma=12, verify_cost=curve)
            policy.cost = 0.02
            best = policy._best_gamma(alpha, 12)
            counts = allocate([Offer([alpha] * 12, 0.02)], 1, 1.0, lambda n, c=curve: c[n])
            assert counts == [best], (curve[2], alpha)


def test_controller_by_hand():
    """Two requests on v(n) = 1 + 0.25 (n - 1): request A's guesses (α 0.9) are worth
    0.9, 0.81, ...; B's (α 0.2) 0.2, 0.04. Rate with k rows of A only: (2 + Σ) / v(2 + k):
    k=0: 2/1.25 = 1.6; k=1: 2.9/1.5 = 1.933; k=2: 3.71/1.75 = 2.12; k=3: 4.439/2 = 2.2195;
    k=4: 5.095/2.25 = 2.264; k=5: 5.686/2.5 = 2.274; k=6: 6.217/2.75 = 2.261. Best: A 5, B 0
    (B's 0.2 would give (5.686 + 0.2) / 2.75 = 2.14)."""
    def cost(n):
        return 1 + 0.25 * (n - 1)

    assert expected_gains([0.9, 0.9]) == pytest.approx([0.9, 0.81])
    counts = allocate([Offer([0.9] * 8), Offer([0.2] * 8)], 2, 2.0, cost)
    assert counts == [5, 0]
    # where each extra row costs a whole forward, no guess pays under load
    assert allocate([Offer([0.9] * 8)] * 4, 4, 4.0, lambda n: float(n)) == [0, 0, 0, 0]
    # a flat curve keeps every guess
    assert allocate([Offer([0.9] * 3)] * 2, 2, 2.0, lambda n: 1.0) == [3, 3]
    # a step bounded at 1.75 one-row forwards: v(2 + k) <= 1.75 keeps k <= 2 of A's
    assert allocate([Offer([0.9] * 8), Offer([0.2] * 8)], 2, 2.0, cost, 1.75) == [2, 0]
    assert allocate([Offer([0.9] * 8), Offer([0.2] * 8)], 2, 2.0, cost, 2.5) == [5, 0]


class Eager(NGramProposer):
    """Proposes every guess it is asked for (token 7): wrong guesses stay exact."""

    def propose(self, committed, gamma, sampler, stop_below=None):
        return Proposal([7] * gamma, None)


def eager_speculative(target, monkeypatch):
    """A maker of speculative strategies whose every guess (token 7) the controller values
    at 0.95 and whose cost policy plans every guess it gets, on v(n) = 1 + 0.1 (n - 1)."""
    monkeypatch.setattr(CostModelGamma, "plan", lambda self, n, key=None, free=False: n)
    monkeypatch.setattr(step_machine.SpeculativeSteps, "guess_acceptance", lambda self: 0.95)

    def make():
        policy = make_policy("auto", None, 6)
        policy.calibrate({n: 1 + 0.1 * (n - 1) for n in range(1, 40)})
        return Speculative(target, Eager(order=2), policy)

    return make


def test_guesses_keep_a_shared_step_within_its_bound(pair, monkeypatch):
    """Two requests that let the controller choose, each guess valued at 0.95, on
    v(n) = 1 + 0.1 (n - 1): with prefill_stall 1.2 no step where both decode runs more than 4
    rows (v(4) = 1.3 <= 1.2 v(2) = 1.32), and each output is still its own alone; with no
    bound (the default) the same requests verify more (the bound is what cut them)."""
    target, _ = pair
    make = eager_speculative(target, monkeypatch)

    config = GenerationConfig(12, SamplingConfig())
    widest = {}
    for bound in (1.2, None):
        scheduler = BatchScheduler(target, BatchConfig(max_batch=2, max_step_cost=bound),
                                   lambda n: 1 + 0.1 * (n - 1))
        got = {i: [] for i in range(2)}
        for i, prompt in enumerate(PROMPTS[:2]):
            scheduler.submit(make().steps(prompt, config),
                             lambda s, out=got[i]: out.extend(s.tokens))
        rows = []
        while not scheduler.idle:
            scheduler.step()
            if len(scheduler.last.gammas) == 2:  # both decoding
                rows.append(scheduler.last.rows)
        widest[bound] = max(rows)
        for i, prompt in enumerate(PROMPTS[:2]):
            assert got[i] == alone(make, prompt, config)
    assert widest[1.2] <= 4 < widest[None]


def test_a_row_budget_bounds_every_shared_step(pair, monkeypatch):
    """max_step_rows 5, two eager requests (every guess valued 0.95) and a joining prompt:
    no step shared by two or more requests runs more than 5 rows; beside one decoding
    request a prompt is read in chunks of 4 (the budget minus the pending row), not one
    token at a time, nor the 10 rows prefill_stall 2.0 allows on this curve; each output is
    still its own alone."""
    target, _ = pair
    make = eager_speculative(target, monkeypatch)

    config = GenerationConfig(12, SamplingConfig())
    scheduler = BatchScheduler(target, BatchConfig(max_batch=3, prefill_chunk=16,
                                                   max_step_rows=5),
                               lambda n: 1 + 0.1 * (n - 1))
    got = {i: [] for i in range(3)}
    scheduler.submit(make().steps(PROMPTS[0], config), lambda s: got[0].extend(s.tokens))
    scheduler.step()
    assert scheduler.last.rows == len(PROMPTS[0])  # alone: the whole prompt, no budget
    chunks = []
    for i in (1, 2):
        scheduler.submit(make().steps(PROMPTS[i], config), lambda s, i=i: got[i].extend(s.tokens))
    while not scheduler.idle:
        scheduler.step()
        report = scheduler.last
        if report is None:
            continue
        if report.requests > 1:
            assert report.rows <= 5, report
        if report.requests == 2 and len(report.gammas) == 1 and not report.guesses:
            chunks.append(report.rows - 1)
    assert 4 in chunks
    for i in range(3):
        assert got[i] == alone(make, PROMPTS[i], config)


# ------------------------------------------------------------------ greedy identity

@pytest.fixture(scope="module")
def pair():
    hf, target = tiny_pair("llama", seed=3)
    draft = perturbed_copy(target, 0.3, 5)
    return target, draft


def factories(target, draft):
    """Every batchable kind of request: plain, n-gram (fixed γ), prompt lookup (cost
    model: the controller may trim it), a draft model (fixed γ and cost model)."""
    flat = {n: 1.0 + 0.02 * (n - 1) for n in range(1, 80)}

    def auto(proposer):
        policy = make_policy("auto", None, 8)
        policy.calibrate(flat)
        return Speculative(target, proposer, policy)

    return [lambda: Autoregressive(target),
            lambda: Speculative(target, NGramProposer(order=2), make_policy(3, None)),
            lambda: auto(PromptLookupProposer()),
            lambda: Speculative(target, DraftModelProposer(draft), make_policy(4, None)),
            lambda: auto(DraftModelProposer(draft))]


PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9], [3],
           [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13], [40, 41, 40, 41, 40]]


def alone(make, prompt, config):
    return [t for s in make().generate(list(prompt), config) for t in s.tokens]


def test_batched_greedy_equals_each_request_alone_and_guesses_pay(pair):
    check_batched_greedy(*pair)


def test_a_bypassing_cascade_in_a_batch_equals_it_alone(pair):
    """Staged cascades that send long suffix matches straight to the target, three at once
    under the controller (offered as free guesses, their cap bounding the draft's γ):
    each output is its own alone, and matches did bypass the draft."""
    target, draft = pair

    def cascade():
        policy = make_policy("auto", None, 8)
        policy.calibrate({n: 1.0 + 0.02 * (n - 1) for n in range(1, 80)})
        policy.bypassing = True
        return Speculative(target, StagedProposer(draft, SuffixProposer(), 3, bypass=2),
                           policy)

    steps = batched_equals_alone(target, [cascade] * 3, PROMPTS[:3])
    assert any(s.extra.get("bypass") for request in steps.values() for s in request)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_greedy_equals_each_request_alone_on_cuda(pair):
    """The server's batched path on a GPU: ragged forwards on CUDA tensors."""
    check_batched_greedy(*(copy.deepcopy(m).to("cuda") for m in pair))


def check_batched_greedy(target, draft) -> None:
    steps = batched_equals_alone(target, factories(target, draft), PROMPTS)
    assert sum(s.accepted for i in (1, 2, 3, 4) for s in steps[i]) > 10  # guesses were kept
    assert any(s.rejected for i in (3, 4) for s in steps[i])  # and refused


def batched_equals_alone(target, makers, prompts) -> dict[int, list]:
    """Every request decoded together (greedy) equals it alone; their Steps by request."""
    config = GenerationConfig(24, SamplingConfig())
    scheduler = BatchScheduler(target, BatchConfig(max_batch=len(makers), prefill_chunk=4),
                               lambda n: 1.0 + 0.02 * (n - 1))
    outputs = {i: [] for i in range(len(makers))}
    steps = {i: [] for i in range(len(makers))}
    for i, (make, prompt) in enumerate(zip(makers, prompts, strict=True)):
        scheduler.submit(make().steps(prompt, config, 4),
                         lambda s, i=i: (outputs[i].extend(s.tokens), steps[i].append(s)))
    most = 0
    while not scheduler.idle:
        scheduler.step()
        most = max(most, scheduler.last.requests if scheduler.last else 0)
    assert most == len(makers)  # they really shared forwards
    for i, (make, prompt) in enumerate(zip(makers, prompts, strict=True)):
        assert outputs[i] == alone(make, prompt, config), i
    return steps


def tree_request(target, proposer, branches):
    planner = BranchPlanner(None, 3, {n: 1.0 + 0.02 * (n - 1) for n in range(1, 64)}) \
        if branches == "auto" else BranchPlanner(branches)
    return TreeSpeculative(target, proposer, make_policy(3, None), planner)


def test_batched_trees_equal_each_request_alone(pair):
    """Tree speculation shares the forward: each tree's rows carry their own mask and
    positions in the ragged batch, and the accepted path is compacted in its own cache."""
    target, draft = pair
    makers = [lambda: tree_request(target, NGramProposer(order=2), 3),
              lambda: tree_request(target, PromptLookupProposer(), "auto"),
              *factories(target, draft)[:3]]
    assert all(m().batchable for m in makers)
    prompts = [[5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6], *PROMPTS[1:4]]
    prompts.insert(1, [7, 3, 7, 4, 7, 3, 7, 4, 7])
    steps = batched_equals_alone(target, makers, prompts)
    assert any(s.extra.get("branches", 0) >= 2 for s in steps[0])  # real trees were batched
    assert sum(s.accepted for i in (0, 1) for s in steps[i]) > 5


def auto_tree(target, curve):
    """A three-branch n-gram tree whose depth the cost model plans (the controller may trim
    it), on cost curve `curve`."""
    policy = make_policy("auto", None, 4)
    policy.calibrate(curve)
    return TreeSpeculative(target, NGramProposer(order=2), policy, BranchPlanner(3))


@pytest.mark.parametrize("slope", [0.0, 1.0])
def test_trees_under_load_are_trimmed_by_the_controller(pair, monkeypatch, slope):
    """Beside another request, a tree that lets the controller choose is priced as its first
    branch: on a flat curve (every guess valued 0.95) the whole tree stays, where every row
    costs a forward the controller cuts it to nothing (the tree's own policy, calibrated
    flat, would guess). Either way each output is its own alone (greedy)."""
    target, draft = pair
    monkeypatch.setattr(step_machine.SpeculativeSteps, "guess_acceptance", lambda self: 0.95)
    curve = {n: 1 + slope * (n - 1) for n in range(1, 80)}
    flat = {n: 1.0 for n in range(1, 80)}
    makers = [lambda: auto_tree(target, flat), factories(target, draft)[2]]
    assert makers[0]().steps([1, 2], GenerationConfig(4)).adaptive
    prompts = [[5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6], [7, 3, 7, 4, 7, 3, 7, 4, 7]]
    config = GenerationConfig(16, SamplingConfig())
    # prompts read whole (a large stall), so both decode together from the start
    scheduler = BatchScheduler(target, BatchConfig(max_batch=2, prefill_stall=100.0),
                               lambda n: curve[n])
    got, steps = {0: [], 1: []}, []
    for i, (make, prompt) in enumerate(zip(makers, prompts, strict=True)):
        scheduler.submit(make().steps(prompt, config),
                         lambda s, i=i: (got[i].extend(s.tokens), i or steps.append(s)))
    shared = []
    while not scheduler.idle:
        scheduler.step()
        if len(scheduler.last.gammas) == 2:
            shared.append(scheduler.last.guesses)
    for i, (make, prompt) in enumerate(zip(makers, prompts, strict=True)):
        assert got[i] == alone(make, prompt, config), i
    if slope:
        assert shared and not any(shared)  # no guess paid: none verified while both decoded
    else:
        assert any(s.extra.get("branches", 0) >= 2 for s in steps)  # whole trees kept


class ThreeBranches(NGramProposer):
    """Three fixed branches of `gamma` guesses each (any guesses verify exactly)."""

    def propose_branches(self, committed, gamma, branches, sampler):
        return [Proposal([7 + b] * gamma, None) for b in range(min(branches, 3))]


def test_a_trimmed_tree_is_its_first_branchs_chain(pair, monkeypatch):
    target, _ = pair
    monkeypatch.setattr(CostModelGamma, "plan", lambda self, n, key=None, free=False: n)
    tree = auto_tree(target, {n: 1.0 for n in range(1, 80)})
    tree.proposer = ThreeBranches(order=2)
    machine = tree.steps([5, 6, 7, 5, 6, 8], GenerationConfig(8))
    scheduler = BatchScheduler(target, BatchConfig(max_batch=1))
    scheduler.submit(machine)
    scheduler.step()  # the prompt
    machine.propose()
    first = list(machine._branches[0].tokens)
    assert len(machine._branches) >= 2 and machine.offered() == len(first) >= 2
    machine.trim(len(first))  # all of the first branch: the whole tree stays
    assert len(machine._branches) >= 2
    machine.trim(1)
    assert machine.proposal.tokens == first[:1] and machine.offered() == 1
    assert machine.rows().mask is None  # a chain


def test_a_tree_on_a_backend_without_ragged_trees_runs_alone(pair):
    target, _ = pair
    tree = tree_request(target, NGramProposer(order=2), 2)
    assert tree.batchable
    tree.target = StaticModel(target)  # a backend that does not declare ragged_trees
    assert not tree.batchable


def test_requests_join_and_leave_mid_stream(pair):
    target, draft = pair
    makers = factories(target, draft)
    scheduler = BatchScheduler(target, BatchConfig(max_batch=3, prefill_chunk=5))
    configs = [GenerationConfig(n, SamplingConfig()) for n in (30, 6, 12, 9)]
    got = {i: [] for i in range(4)}
    joins = {0: [0, 1], 3: [2], 7: [3]}  # step index -> requests joining then
    for step in range(200):
        for i in joins.get(step, []):
            scheduler.submit(makers[i + 1]().steps(PROMPTS[i], configs[i], 5),
                             lambda s, i=i: got[i].extend(s.tokens))
        if step > 8 and scheduler.idle:
            break
        scheduler.step()
    for i in range(4):
        assert got[i] == alone(makers[i + 1], PROMPTS[i], configs[i]), i


def test_cancel_one_request_leaves_the_others_untouched(pair):
    target, draft = pair
    makers = factories(target, draft)
    config = GenerationConfig(20, SamplingConfig())
    scheduler = BatchScheduler(target, BatchConfig(max_batch=3))
    got = {i: [] for i in range(3)}
    ended = []
    tickets = [scheduler.submit(makers[i]().steps(PROMPTS[i], config),
                                lambda s, i=i: got[i].extend(s.tokens), ended.append)
               for i in range(3)]
    for _ in range(3):
        scheduler.step()
    scheduler.cancel(tickets[1])
    seen = len(got[1])
    while not scheduler.idle:
        scheduler.step()
    assert len(got[1]) == seen and seen < 20  # nothing after the cancel
    assert tickets[1] in ended and tickets[1].cancelled and len(ended) == 3
    for i in (0, 2):
        assert got[i] == alone(makers[i], PROMPTS[i], config)


def test_a_long_generation_does_not_starve_a_new_short_one(pair):
    """Bound: a request joining a full batch waits for one slot; one that joins with room
    commits its first token within ceil(prompt / chunk) steps and finishes within that
    plus max_new steps, however long the others run."""
    target, _ = pair
    scheduler = BatchScheduler(target, BatchConfig(max_batch=2, prefill_chunk=4),
                               lambda n: 1 + 0.02 * (n - 1))  # a chunk of 4 stalls little
    long = Autoregressive(target).steps(list(range(1, 30)), GenerationConfig(150), 4)
    scheduler.submit(long)
    for _ in range(10):
        scheduler.step()
    short_prompt, short_new = list(range(30, 41)), 5
    done_at = []
    ticket = scheduler.submit(Autoregressive(target).steps(short_prompt,
                                                           GenerationConfig(short_new), 4))
    for step in range(1, 100):
        scheduler.step()
        if ticket.done:
            done_at.append(step)
            break
    assert done_at and done_at[0] <= -(-len(short_prompt) // 4) + short_new
    assert not long.done  # the long one was still going


def test_a_failing_request_gets_its_own_error_and_nothing_else_changes(pair, monkeypatch):
    target, draft = pair
    makers = factories(target, draft)
    config = GenerationConfig(16, SamplingConfig())

    class Broken(NGramProposer):
        def propose(self, committed, gamma, sampler, stop_below=None):
            if len(committed) > 12:
                raise RuntimeError("drafter broke")
            return super().propose(committed, gamma, sampler, stop_below)

    scheduler = BatchScheduler(target, BatchConfig(max_batch=3))
    got = {i: [] for i in range(3)}
    bad = scheduler.submit(Speculative(target, Broken(order=2), make_policy(3, None)).steps(
        PROMPTS[0], config), lambda s: got[1].extend(s.tokens))
    for i in (0, 2):
        scheduler.submit(makers[i]().steps(PROMPTS[i], config),
                         lambda s, i=i: got[i].extend(s.tokens))
    while not scheduler.idle:
        scheduler.step()
    assert isinstance(bad.error, RuntimeError) and "drafter broke" in str(bad.error)
    for i in (0, 2):
        assert got[i] == alone(makers[i], PROMPTS[i], config)


def test_a_backend_without_ragged_forwards_is_refused(pair):
    from draftsman.models.static_step import StaticModel

    with pytest.raises(UnsupportedError, match="ragged_batches"):
        BatchScheduler(StaticModel(pair[0]))


# ------------------------------------------------------------------ sampling

def test_seeded_sampling_draws_do_not_depend_on_the_batch(pair):
    """A request's draws come from its own generator in its own order: with its γ its own
    (fixed), its sampled tokens in a changing batch equal its tokens alone, seed by seed."""
    target, draft = pair
    make = factories(target, draft)[3]  # draft model, fixed γ 4
    company = factories(target, draft)[2]
    harness = InBatch(target, make, company, vocab=97)
    for seed in range(6):
        config = GenerationConfig(12, SamplingConfig(1.0, seed=seed))
        mine = [t for s in harness.generate(PROMPTS[0], config) for t in s.tokens]
        assert mine == alone(make, PROMPTS[0], config), seed


@pytest.fixture(scope="module")
def small():
    return spread_pair()


def batched_draft_case(target, draft):
    """The draft-model chain of the conformance suite, under the cost-model controller, in
    a batch others join and leave, on a nearly flat cost curve (guesses pay, γ varies)."""
    def make():
        policy = make_policy("auto", None, 3)
        policy.calibrate({n: 1 + 0.02 * (n - 1) for n in range(1, 40)}, 0.05)
        return Speculative(target, DraftModelProposer(draft), policy)

    return InBatch(target, make, make, vocab=VOCAB,
                   row_cost=lambda n: 1 + 0.02 * (n - 1))


def test_sampling_in_a_changing_batch_is_the_targets_distribution(small):
    target, draft = small
    expected = target_joint(target, CHAIN_PROMPT, WINDOW, T1)
    result = check_exact(batched_draft_case(target, draft), CHAIN_PROMPT, expected, T1,
                         draws=1500, require=CHAIN_NEEDS)
    print(result.table())
    assert result.passed(), result.table()


def batched_tree_case(target):
    """The conformance suite's three-branch tree, in a batch others join and leave."""
    return InBatch(target, lambda: tree_request(target, NGramProposer(order=2), 3),
                   lambda: Speculative(target, NGramProposer(order=2), make_policy(2, None)),
                   vocab=VOCAB)


def test_sampling_a_tree_in_a_changing_batch_is_the_targets_distribution(small):
    target, _ = small
    expected = target_joint(target, TREE_PROMPT, WINDOW, T1)
    result = check_exact(batched_tree_case(target), TREE_PROMPT, expected, T1, draws=1200,
                         require=["branches >= 2", "branches >= 3", "sibling after rejection",
                                  "accepted at 1", "rejected at 1", "bonus"])
    print(result.table())
    assert result.passed(), result.table()


def test_a_broken_tree_rule_in_a_batch_is_caught(small, monkeypatch):
    """Negative control: a refused guess leaves its mass in the residual unless it was
    the first child (the conformance suite's tree mutation), in the batched machine."""
    monkeypatch.setattr(tree_steps, "verify_tree_sampling", sibling_not_cleared)
    target, _ = small
    expected = target_joint(target, TREE_PROMPT, WINDOW, T1)
    result = check_exact(batched_tree_case(target), TREE_PROMPT, expected, T1,
                         draws=600)  # p = 2e-15 at 600 draws
    assert result.p_min < 1e-6, result.table()


def test_a_broken_rule_in_a_batch_is_caught(small, monkeypatch):
    """Negative control: keep the drafts' tokens but draw the next token from the draft's
    distribution (the bonus-from-the-draft bug): the same test must reject it."""
    target, draft = small
    real = step_machine.verify_sampling

    def bonus_from_draft(drafts, q, p, sampler):
        verdict = real(drafts, q, p, sampler)
        if drafts and q is not None and verdict.accepted == len(drafts):
            return Verdict(verdict.accepted, sampler.draw(q[-1]), False)
        return verdict

    monkeypatch.setattr(step_machine, "verify_sampling", bonus_from_draft)
    expected = target_joint(target, CHAIN_PROMPT, WINDOW, T1)
    result = check_exact(batched_draft_case(target, draft), CHAIN_PROMPT, expected, T1,
                         draws=500)  # 1500 draws gave p = 1e-78
    assert result.p_joint < 1e-6, result.table()


def test_requests_sharing_a_draft_model_draft_together(pair):
    """Three draft-model requests: their guesses come from shared draft forwards (fewer
    forwards than guesses drafted), and each output is still its own alone."""
    target, draft = pair
    make = factories(target, draft)[3]  # draft model, fixed γ 4
    calls = []
    real = type(draft).forward

    class Counting(type(draft)):
        def forward(self, *args, **kwargs):
            calls.append(1)
            return real(self, *args, **kwargs)

    draft.__class__ = Counting
    try:
        config = GenerationConfig(20, SamplingConfig())
        scheduler = BatchScheduler(target, BatchConfig(max_batch=3), lambda n: 1.0)
        got = {i: [] for i in range(3)}
        steps = []
        for i in range(3):
            scheduler.submit(make().steps(PROMPTS[i], config),
                             lambda s, i=i: (got[i].extend(s.tokens), steps.append(s)))
        while not scheduler.idle:
            scheduler.step()
        shared = len(calls)
    finally:
        draft.__class__ = Counting.__mro__[1]
    drafted_forwards = sum(s.draft_forwards for s in steps)
    assert shared < 0.6 * drafted_forwards, (shared, drafted_forwards)
    for i in range(3):
        assert got[i] == alone(make, PROMPTS[i], config)


def test_a_prompt_chunk_shrinks_while_others_decode(pair):
    """On a machine where every row costs a forward, a joining prompt is read one token per
    step beside a decoding request (the step costs at most prefill_stall x its decode rows),
    and in whole chunks when nobody decodes."""
    target, _ = pair
    scheduler = BatchScheduler(target, BatchConfig(max_batch=2, prefill_chunk=8,
                                                   prefill_stall=2.0), lambda n: float(n))
    first = Autoregressive(target).steps(list(range(1, 20)), GenerationConfig(40), 8)
    scheduler.submit(first)
    scheduler.step()
    assert scheduler.last.rows == 8  # alone: a whole chunk
    while first.prefilling:
        scheduler.step()
    scheduler.step()
    second = Autoregressive(target).steps(list(range(30, 40)), GenerationConfig(4), 8)
    scheduler.submit(second)
    scheduler.step()
    assert scheduler.last.rows == 2  # one decode row + one prompt token: v(2) <= 2 v(1)


def test_joining_prompts_are_read_together_while_nobody_decodes(pair):
    """Prompts that join while nobody decodes each read a whole chunk in the same step (no
    one waits on them); once one decodes, a single prompt's chunk shares each step."""
    target, _ = pair
    scheduler = BatchScheduler(target, BatchConfig(max_batch=3, prefill_chunk=8),
                               lambda n: float(n))
    prompts = [list(range(1, 12)), list(range(20, 26)), list(range(30, 45))]
    machines = [Autoregressive(target).steps(p, GenerationConfig(4), 8) for p in prompts]
    for m in machines:
        scheduler.submit(m)
    scheduler.step()
    assert scheduler.last.requests == 3 and scheduler.last.rows == 8 + 6 + 8
    assert [m.prefilled for m in machines] == [8, 6, 8]
    scheduler.step()  # the second request decodes now: one prompt's chunk beside it, cut
    assert scheduler.last.requests == 2  # to one row by prefill_stall on this linear curve
    assert [m.prefilled for m in machines] == [9, 6, 8]


def test_fail_all_ends_every_request_and_the_scheduler_goes_on(pair):
    target, draft = pair
    scheduler = BatchScheduler(target, BatchConfig(max_batch=1))
    ended = []
    for prompt in PROMPTS[:2]:  # one active, one joining
        scheduler.submit(Autoregressive(target).steps(prompt, GenerationConfig(8)),
                         on_end=ended.append)
    scheduler.step()
    scheduler.fail_all(RuntimeError("bug"))
    assert len(ended) == 2 and all(isinstance(t.error, RuntimeError) for t in ended)
    assert scheduler.idle
    got = []
    scheduler.submit(Autoregressive(target).steps(PROMPTS[2], GenerationConfig(5)),
                     lambda s: got.extend(s.tokens))
    while not scheduler.idle:
        scheduler.step()
    assert len(got) == 5
