"""Speculative decoding (Leviathan, Kalman, Matias 2023): propose γ, verify in one forward.

Each step: the proposer guesses up to γ tokens after the committed text; the target runs
once over [last committed token, guesses] and speculative sampling (verify.py) keeps a prefix
of the guesses plus one target token. Exact: greedy output equals autoregressive decoding,
sampled output has the target's distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import LAST, DecoderLM
from draftsman.models.protocol import Cache
from draftsman.proposers.base import Proposer
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy
from draftsman.strategies.gamma import GammaPolicy
from draftsman.strategies.step_machine import SpeculativeSteps, run_alone


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
    batchable = True  # `steps` gives the step machine the batch scheduler drives

    def __init__(self, target: DecoderLM, proposer: Proposer, policy: GammaPolicy,
                 sources: tuple[str, str] = ("draft", "target")) -> None:
        self.target = target
        self.proposer = proposer
        self.policy = policy
        self.sources = sources

    def steps(self, prompt_ids: list[int], config: GenerationConfig,
              prefill_chunk: int | None = None,
              new_cache: Callable[[int], Cache] | None = None) -> SpeculativeSteps:
        """This request as a step machine (strategies/step_machine.py)."""
        return SpeculativeSteps(self.target, self.proposer, self.policy, prompt_ids, config,
                                sources=self.sources, prefill_chunk=prefill_chunk,
                                new_cache=new_cache)

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        return run_alone(self.steps(prompt_ids, config))
