"""A drafter that is itself sped up by speculation: sub-drafter -> draft model.

The draft model produces its γ guesses by running speculative decoding against a cheaper
sub-drafter (n-gram, prompt lookup or a smaller model). Its outputs are distributed exactly
as the draft model's own samples, with the draft's probabilities known at every position, so
the target can verify them with ordinary speculative sampling: exact at every stage.
"""

from __future__ import annotations

import torch

from draftsman.models.base import DecoderLM
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.verification.chain import verify_greedy, verify_sampling


class StagedProposer(Proposer):
    name = "staged"
    uses_model = True

    def __init__(self, model: DecoderLM, sub: Proposer, sub_gamma: int = 4) -> None:
        self.model = model
        self.sub = sub
        self.sub_gamma = sub_gamma
        self.state: ModelState | None = None

    def use_history(self, history: object | None) -> None:
        self.sub.use_history(history)

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.state = ModelState(self.model, capacity, extra_rows=self.sub_gamma + 1)
        self.sub.start(prompt_ids, capacity + self.sub_gamma + 1)

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        state = self.state
        produced: list[int] = []
        rows: list[torch.Tensor] = []
        forwards = sub_forwards = sub_drafted = sub_accepted = sub_rejections = 0
        while len(produced) < gamma:
            context = committed + produced
            # a middle verify yields accepted + 1 tokens: do not draft past what is needed
            sub_gamma = min(self.sub_gamma, gamma - len(produced) - 1)
            sub = (self.sub.propose(context, sub_gamma, sampler) if sub_gamma > 0
                   else Proposal([], None))
            pending = state.sync(context, final=False)  # `produced` is still a guess
            logits = state.feed(pending + sub.tokens,
                                logits_at=slice(len(pending) - 1, None)).logits[0]
            forwards += 1
            if sampler.greedy:
                verdict = verify_greedy(sub.tokens, logits.argmax(-1).tolist())
            else:
                p = sampler.probs(logits)
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
                 "sub_rejections": sub_rejections, "sub_forwards": sub_forwards}
        return Proposal(produced[:gamma], q, forwards, extra)

    def commit(self, committed: list[int]) -> None:
        self.state.sync(committed)
        self.sub.commit(committed)
