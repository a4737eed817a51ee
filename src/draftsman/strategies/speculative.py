"""Speculative decoding (Leviathan, Kalman, Matias 2023): propose γ, verify in one forward.

Each step: the proposer guesses up to γ tokens after the committed text; the target runs
once over [last committed token, guesses] and speculative sampling (verify.py) keeps a prefix
of the guesses plus one target token. Exact: greedy output equals autoregressive decoding,
sampled output has the target's distribution.
"""

from __future__ import annotations

from collections.abc import Iterator

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import LAST, DecoderLM
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy, check_fits
from draftsman.strategies.gamma import Feedback, GammaPolicy
from draftsman.verification.chain import Verdict, verify_greedy, verify_sampling


def verify_step(state: ModelState, committed: list[int], proposal: Proposal,
                sampler: Sampler) -> Verdict:
    """One target forward over the pending token(s) and the guesses; decide what to keep."""
    # the last committed token, not yet in the cache; `committed` only grows, so this
    # compares just what the previous step appended
    pending = state.sync(committed)
    drafts = proposal.tokens
    logits = state.feed(pending + drafts, logits_at=slice(len(pending) - 1, None)).logits[0]
    if sampler.greedy:  # [γ+1, V] -> the target's choice after each prefix
        return verify_greedy(drafts, logits.argmax(-1).tolist())
    return verify_sampling(drafts, proposal.q, sampler.probs(logits), sampler)


def prefill(state: ModelState, prompt_ids: list[int], sampler: Sampler, budget: Budget,
            timer: Timer) -> Step:
    """The target reads the prompt and picks the first token: the prefill Step."""
    with timer("verify"):
        logits = state.feed(prompt_ids, logits_at=LAST).logits[0, -1]
        first = budget.clip([sampler.pick(logits)])
    return Step(first, ["target"], target_forwards=1, prefill=True,
                verify_seconds=timer.take()["verify"], finish=budget.finish)


class Speculative(Strategy):
    name = "speculative"
    exactness = "exact"

    def __init__(self, target: DecoderLM, proposer: Proposer, policy: GammaPolicy,
                 sources: tuple[str, str] = ("draft", "target")) -> None:
        self.target = target
        self.proposer = proposer
        self.policy = policy
        self.sources = sources

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        check_fits(self.target, len(prompt_ids), config)
        capacity = len(prompt_ids) + config.max_new_tokens + self.policy.max_gamma + 2
        target = ModelState(self.target, capacity)
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        timer = Timer()
        policy = self.policy
        step = prefill(target, prompt_ids, sampler, budget, timer)
        committed = prompt_ids + step.tokens
        yield step
        with timer("draft"):
            self.proposer.use_history(config.history)
            self.proposer.start(prompt_ids, capacity)
        while not budget.done:
            planned = policy.plans_guesses and not self.proposer.uses_model
            wanted = policy.max_gamma if planned else policy.next_gamma()
            gamma = min(wanted, budget.remaining - 1)
            with timer("draft"):
                proposal = (self.proposer.propose(committed, gamma, sampler, policy.stop_below)
                            if gamma > 0 else Proposal([], None))
            key = proposal.extra.get("match") if planned else None
            if planned and proposal.tokens:
                proposal.tokens = proposal.tokens[: policy.plan(len(proposal.tokens), key)]
                gamma = wanted = len(proposal.tokens)
            with timer("verify"):
                verdict = verify_step(target, committed, proposal, sampler)
            new = budget.clip(proposal.tokens[: verdict.accepted] + [verdict.next_token])
            committed += new
            with timer("other"):
                target.sync(committed)
                self.proposer.commit(committed)
            seconds = timer.take()
            drafted = len(proposal.tokens)
            policy.update(Feedback(drafted, verdict.accepted, verdict.rejected,
                                   seconds.get("draft", 0.0), proposal.forwards,
                                   seconds["verify"], key))
            kept_drafts = min(verdict.accepted, len(new))
            yield Step(
                new,
                [self.sources[0]] * kept_drafts + [self.sources[1]] * (len(new) - kept_drafts),
                drafted=drafted,
                accepted=verdict.accepted,
                rejected=verdict.rejected,
                target_forwards=1,
                draft_forwards=proposal.forwards,
                draft_seconds=seconds.get("draft", 0.0),
                verify_seconds=seconds["verify"],
                other_seconds=seconds.get("other", 0.0),
                finish=budget.finish,
                # policy_gamma: the policy's choice before the budget clipped it
                extra={"gamma": gamma, "policy_gamma": wanted, **proposal.extra},
            )
