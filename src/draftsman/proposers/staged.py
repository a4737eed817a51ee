"""A drafter that is itself sped up by speculation: sub-drafter -> draft model.

The draft model produces its γ guesses by running speculative decoding against a cheaper
sub-drafter (n-gram, prompt lookup or a smaller model). Its outputs are distributed exactly
as the draft model's own samples, with the draft's probabilities known at every position, so
the target can verify them with ordinary speculative sampling: exact at every stage.

With `bypass` = n, a sub-drafter whose match is at least n tokens long (a copied passage,
where its guesses are as good as the draft model's and cost nothing) may send its guesses
straight to the target, up to the step's `room`, without the draft model: `route` (the
cost model) says how many beat drafting with the model, from what such matches were worth
before, 0 to draft as usual. Guesses not sent go back as the proposal's `shadow`, so their
worth is learnt from the committed text either way. Whether to bypass depends only on the
committed text, so the proposal is a point mass on those guesses and speculative sampling
with a one-hot q (q = None) keeps the target's distribution. The draft model reads the
bypassed tokens the next time it drafts, and without a bypass the prompt at `start`; with
one, the prompt too is read only when the model first drafts, and a long lag only once the
policy's `ready` says it pays (a copied passage never needs the draft at all).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from draftsman.models.base import DecoderLM
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler, greedy_tokens
from draftsman.state import ModelState, reads_greedy_tokens
from draftsman.verification.chain import verify_greedy, verify_sampling


def match_length(proposal: Proposal) -> int:
    """How many tokens of context a deterministic drafter's guesses continue."""
    extra = proposal.extra
    return int(extra.get("match_length", extra.get("match", 0)))


class StagedProposer(Proposer):
    name = "staged"
    uses_model = True
    read_apart = 32  # a lag of more tokens is read in a forward before drafting, timed apart

    def __init__(self, model: DecoderLM, sub: Proposer, sub_gamma: int = 4,
                 bypass: int | None = None) -> None:
        if bypass is not None and sub.uses_model:
            raise ValueError("bypass needs a deterministic sub-drafter, not a model")
        self.model = model
        self.sub = sub
        self.sub_gamma = sub_gamma
        self.bypass = bypass
        self.state: ModelState | None = None

    @property
    def bypasses(self) -> bool:
        return self.bypass is not None

    def use_history(self, history: object | None) -> None:
        self.sub.use_history(history)

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        """Without a bypass the draft model reads the prompt now, a one-time cost (timed as
        `draft_setup`) kept out of the cost per guess, as `DraftModelProposer` does."""
        self.state = ModelState(self.model, capacity, extra_rows=self.sub_gamma + 1)
        self.sub.start(prompt_ids, capacity + self.sub_gamma + 1)
        if self.bypass is None and len(prompt_ids) > 1:
            self.state.feed(list(prompt_ids[:-1]), logits_at=None)

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None, room: int = 0,
                route: Callable[[int, int | None, bool], int] | None = None,
                ready: Callable[[int], bool] | None = None) -> Proposal:
        """`route(guesses, match, model_may_draft)`: how many free guesses to send (see
        `CostModelGamma.route`); `ready(behind)`: whether the draft model, `behind` tokens
        behind `committed`, may draft this step (`CostModelGamma.model_ready`)."""
        state = self.state
        shadow = fast = None
        pending = state.sync(committed, final=False)  # what the draft has not read
        behind = len(pending)
        may_draft = gamma > 0 and (ready is None or ready(behind))
        declined = gamma > 0 and not may_draft  # the model path, wanted but too far behind
        if self.bypass is not None and room > 0:
            fast = self.sub.propose(committed, room, sampler)
            if fast.tokens and match_length(fast) >= self.bypass:
                key = fast.extra.get("match")
                n = len(fast.tokens)
                keep = route(n, key, may_draft) if route else n
                if declined and route:  # refused only if the model would have beaten them
                    declined = route(n, key, True) == 0
                if keep:
                    extra = {**fast.extra, "bypass": True, "declined": declined}
                    return Proposal(fast.tokens[:keep], None, 0, extra)
                shadow = (key, fast.tokens)
        if not may_draft:
            return Proposal([], None, shadow=shadow, extra={"declined": declined})
        catch_up = 0.0
        if behind > self.read_apart:
            # a long lag (the prompt, a long bypassed stretch) is read in a forward of its
            # own, timed apart: the cost per guess the policy learns stays a guess's
            start = time.perf_counter()
            state.feed(pending[:-1], logits_at=None)  # sub.propose left the draft as it was
            catch_up = time.perf_counter() - start
        produced: list[int] = []
        rows: list[torch.Tensor] = []
        greedy = reads_greedy_tokens(state.model, sampler.greedy)
        forwards = sub_forwards = sub_drafted = sub_accepted = sub_rejections = 0
        while len(produced) < gamma:
            context = committed + produced
            # a middle verify yields accepted + 1 tokens: do not draft past what is needed
            sub_gamma = min(self.sub_gamma, gamma - len(produced) - 1)
            if sub_gamma <= 0:
                sub = Proposal([], None)
            elif fast is not None and not produced:
                # the router's guesses for this same context: a model-free drafter's
                # shorter proposal is their prefix, so it is not asked again
                sub = Proposal(fast.tokens[:sub_gamma], None)
            else:
                sub = self.sub.propose(context, sub_gamma, sampler)
            pending = state.sync(context, final=False)  # `produced` is still a guess
            out = state.feed(pending + sub.tokens, logits_at=slice(len(pending) - 1, None),
                             greedy=greedy)
            forwards += 1
            if sampler.greedy:  # the middle model's own picks where it gives them
                picks = out.tokens[0] if greedy else greedy_tokens(out.logits[0])
                verdict = verify_greedy(sub.tokens, picks.tolist())
            else:
                p = sampler.probs(out.logits[0])
                verdict = verify_sampling(sub.tokens, sub.q, p, sampler)
                rows.append(p[: verdict.accepted + 1])
            produced += sub.tokens[: verdict.accepted] + [verdict.next_token]
            sub_forwards += sub.forwards
            sub_drafted += len(sub.tokens)
            sub_accepted += verdict.accepted
            sub_rejections += int(verdict.rejected)
            # no sub.commit here: `produced` is provisional until the target decides, and
            # the sub's next propose rolls its cache back to `context` by itself
        q = torch.cat(rows)[:gamma] if rows else None
        extra = {"sub_drafted": sub_drafted, "sub_accepted": sub_accepted,
                 "sub_rejections": sub_rejections, "sub_forwards": sub_forwards,
                 "catch_up_seconds": catch_up}
        return Proposal(produced[:gamma], q, forwards, extra, shadow)

    def commit(self, committed: list[int]) -> None:
        self.state.sync(committed)
        self.sub.commit(committed)
