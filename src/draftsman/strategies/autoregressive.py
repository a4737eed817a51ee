"""The reference: one target forward per token."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import LAST, DecoderLM
from draftsman.models.protocol import Cache
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy, check_fits
from draftsman.strategies.step_machine import SpeculativeSteps


class Autoregressive(Strategy):
    name = "autoregressive"
    exactness = "reference"
    batchable = True

    def __init__(self, target: DecoderLM) -> None:
        self.target = target

    def steps(self, prompt_ids: list[int], config: GenerationConfig,
              prefill_chunk: int | None = None,
              new_cache: Callable[[int], Cache] | None = None) -> SpeculativeSteps:
        """This request as a step machine that never guesses (for the batch scheduler)."""
        return SpeculativeSteps(self.target, None, None, prompt_ids, config,
                                prefill_chunk=prefill_chunk, new_cache=new_cache)

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        check_fits(self.target, len(prompt_ids), config)
        state = ModelState(self.target, len(prompt_ids) + config.max_new_tokens + 1)
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        timer = Timer()
        with timer("verify"):
            token = sampler.pick(state.feed(prompt_ids, logits_at=LAST).logits[0, -1])
        tokens = budget.clip([token])
        yield Step(tokens, ["target"], target_forwards=1, prefill=True,
                   verify_seconds=timer.take()["verify"], finish=budget.finish)
        while not budget.done:
            with timer("verify"):
                token = sampler.pick(state.feed([token]).logits[0, -1])
            tokens = budget.clip([token])
            yield Step(tokens, ["target"], target_forwards=1,
                       verify_seconds=timer.take()["verify"], finish=budget.finish)
