"""A smaller model of the same vocabulary drafts autoregressively."""

from __future__ import annotations

from collections.abc import Callable

import torch

from draftsman.models.base import LAST, DecoderLM
from draftsman.models.protocol import Cache
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler, greedy_tokens
from draftsman.state import ModelState


def probability(logits: torch.Tensor, token: int) -> float:
    """softmax(logits)[token] from one log-sum-exp, without normalising the vocabulary."""
    logits = logits.float()
    return float((logits[token] - logits.logsumexp(-1)).exp())


class DraftModelProposer(Proposer):
    name = "draft-model"
    uses_model = True

    def __init__(self, model: DecoderLM) -> None:
        self.model = model
        self.state: ModelState | None = None
        # where the draft's cache comes from, when not from the model itself: a batch
        # scheduler lends a sequence of a shared context (llama.cpp), so that requests
        # drafting with this model draft together (batching/drafting.py)
        self.new_cache: Callable[[int], Cache] | None = None

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        """Read the prompt now, once: a one-time cost like the target's prefill (timed as
        `draft_setup`), which the first guesses must not carry into the cost per guess the
        γ policy learns (a 1,500-token prompt made one guess look 16 target forwards dear
        and switched the draft off for good)."""
        cache = self.new_cache(capacity) if self.new_cache is not None else None
        self.state = ModelState(self.model, capacity, cache=cache)
        if len(prompt_ids) > 1:  # all but the last: a propose always has a token to feed
            self.state.feed(list(prompt_ids[:-1]), logits_at=None)

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        state = self.state
        # provisional: a cascade (staged) drafts after guesses it may still drop; commit()
        # is where the text becomes final. >= 1 token: the target's last choice is never fed
        pending = state.sync(committed, final=False)
        if stop_below is None:
            return self._propose_on_device(pending, gamma, sampler)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        forwards = 0
        for _ in range(gamma):
            logits = state.feed(pending, logits_at=LAST).logits[0, -1]
            forwards += 1
            if sampler.greedy:
                token = int(greedy_tokens(logits))
                confidence = probability(logits, token)
            else:
                q = sampler.probs(logits)
                token = sampler.draw(q)
                rows.append(q)
                confidence = float(q[token])
            tokens.append(token)
            pending = [token]
            if confidence < stop_below:
                break  # the draft is unsure: verify now instead of drafting further
        q_all = torch.stack(rows) if rows else None
        return Proposal(tokens, q_all, forwards)

    def _propose_on_device(self, pending: list[int], gamma: int, sampler: Sampler
                           ) -> Proposal:
        """γ tokens drafted without reading any back until the end (one transfer): each is
        fed to the draft as a device tensor. Same tokens and draws as the host loop."""
        state = self.state
        if gamma <= 0:
            return Proposal([], None, 0)
        drafted: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        logits = state.feed(pending, logits_at=LAST).logits[0, -1]
        for i in range(gamma):
            if sampler.greedy:
                token = greedy_tokens(logits)
            else:
                q = sampler.probs(logits)
                token = sampler.draw_tensor(q)
                rows.append(q)
            drafted.append(token)
            if i + 1 < gamma:
                logits = state.feed_unread(token.view(1), logits_at=LAST).logits[0, -1]
        tokens = torch.stack(drafted).tolist() if drafted else []
        state.settle(tokens[:-1])  # the last token is drafted, not fed
        q_all = torch.stack(rows) if rows else None
        return Proposal(tokens, q_all, gamma)

    def commit(self, committed: list[int]) -> None:
        self.state.sync(committed)
