"""Several requests' draft models drafting together: one ragged draft forward per guess.

Alone, a request drafting γ guesses with a draft model runs γ draft forwards of one row
(after catching up on what the target committed). In a batch, the requests that share a
draft model run them together: forward i holds row i of every request still drafting, so a
step of n requests with γ guesses each costs γ draft forwards of about n rows, not n·γ.

Each request's tokens and draws are those of `DraftModelProposer.propose` alone: the same
rows reach its own cache (models/ragged.py), it picks with its own sampler in the same
order, and it stops at the same guess (its γ, or its confidence under `stop_below`).

On llama.cpp a ragged forward needs every sequence in one batch context, so the scheduler
lends each request drafting with such a model a sequence of that model's own context
(`lend_draft_caches`, before the drafter starts); its prompt read runs there too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from draftsman.models.ragged import RaggedCaches, Segment
from draftsman.proposers.base import Proposal
from draftsman.proposers.draft_model import DraftModelProposer, probability
from draftsman.sampling import greedy_tokens
from draftsman.strategies.step_machine import SpeculativeSteps


def batchable_drafter(machine: SpeculativeSteps) -> bool:
    """A plain draft-model drafter on a model that can share forwards: with caches of its
    own (torch), or with a sequence the scheduler lent it from the draft model's shared
    context (llama.cpp: `lend_draft_caches`); one started on a cache of its own drafts
    alone."""
    proposer = machine.proposer
    if type(proposer) is not DraftModelProposer \
            or not proposer.model.capabilities.has("ragged_batches"):
        return False
    if getattr(proposer.model, "sequence_caches", None) is None:
        return True
    state = proposer.state
    return (proposer.new_cache is not None if state is None
            else getattr(state.cache, "pool", None) is not None)


def lend_draft_caches(machine: SpeculativeSteps,
                      pools: dict[int, Callable[[int], object]], sequences: int) -> None:
    """A request drafting with a model whose batched caches come from a pool (llama.cpp)
    gets its draft cache from that model's pool of this scheduler (made on first use,
    `sequences` sequences), so its drafts can share forwards; before its drafter starts."""
    proposer = machine.proposer
    model = getattr(proposer, "model", None)
    take = getattr(model, "sequence_caches", None)
    if type(proposer) is not DraftModelProposer or take is None or proposer.state is not None:
        return
    if id(model) not in pools:
        pools[id(model)] = take(sequences)
    proposer.new_cache = pools[id(model)]


class _Drafting:
    """One request's drafting in progress."""

    def __init__(self, machine: SpeculativeSteps, gamma: int) -> None:
        self.machine = machine
        self.gamma = gamma
        self.state = machine.proposer.state
        # provisional, as in DraftModelProposer.propose: commit() makes the text final
        self.feed = self.state.sync(machine.committed, final=False)
        self.tokens: list[int] = []
        self.rows: list[torch.Tensor] = []
        self.stopped = False

    @property
    def drafting(self) -> bool:
        return not self.stopped and len(self.tokens) < self.gamma

    def pick(self, logits: torch.Tensor) -> None:
        """The next guess from the draft's logits [V] after the rows just fed."""
        sampler, stop_below = self.machine.sampler, self.machine.policy.stop_below
        if sampler.greedy:
            token = int(greedy_tokens(logits))
            confidence = probability(logits, token) if stop_below is not None else 1.0
        else:
            q = sampler.probs(logits)
            token = sampler.draw(q)
            self.rows.append(q)
            confidence = float(q[token])
        self.tokens.append(token)
        self.feed = [token]
        if stop_below is not None and confidence < stop_below:
            self.stopped = True  # the draft is unsure: verify now instead of drafting on

    def proposal(self) -> Proposal:
        q = torch.stack(self.rows) if self.rows else None
        return Proposal(self.tokens, q, len(self.tokens))


def draft_together(machines: Sequence[SpeculativeSteps], gammas: Sequence[int]) -> float:
    """Draft `gammas[i]` guesses for machines[i] (all sharing one draft model) and hand each
    its proposal (`take`); returns the wall seconds spent."""
    t0 = time.perf_counter()
    work = [_Drafting(m, g) for m, g in zip(machines, gammas, strict=True) if g > 0]
    model = work[0].machine.proposer.model if work else None
    while any(d.drafting for d in work):
        active = [d for d in work if d.drafting]
        segments = [Segment(d.state.cache, len(d.state.fed), len(d.feed)) for d in active]
        ids = torch.tensor([[t for d in active for t in d.feed]], dtype=torch.long)
        pos = torch.tensor([[len(d.state.fed) + j for d in active for j in range(len(d.feed))]],
                           dtype=torch.long)
        last, end = [], 0
        for d in active:
            end += len(d.feed)
            last.append(end - 1)
        logits = model(ids, pos, RaggedCaches(segments),
                       logits_at=torch.tensor(last, dtype=torch.long)).logits[0]
        for d, row in zip(active, logits, strict=True):
            d.state.record(d.feed)
            d.state.forwards += 1
            d.pick(row)
    seconds = time.perf_counter() - t0
    for m, g in zip(machines, gammas, strict=True):
        if g > 0:
            continue
        m.take(Proposal([], None))
    for d in work:
        # the last guess is drafted, not fed: roll the draft back to before it, as alone
        d.machine.take(d.proposal())
    return seconds
