"""The reference: one target forward per token."""

from __future__ import annotations

from collections.abc import Iterator

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import LAST, DecoderLM
from draftsman.sampling import Sampler
from draftsman.strategies.base import Strategy, as_batch, new_cache, positions


class Autoregressive(Strategy):
    name = "autoregressive"
    exactness = "reference"

    def __init__(self, target: DecoderLM) -> None:
        self.target = target

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        model = self.target
        cache = new_cache(model, len(prompt_ids), config)
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        timer = Timer()
        with timer("verify"):
            logits = model(as_batch(prompt_ids), positions(0, len(prompt_ids)), cache,
                           logits_at=LAST).logits
            token = sampler.pick(logits[0, -1])
        tokens = budget.clip([token])
        yield Step(tokens, ["target"], target_forwards=1, prefill=True,
                   verify_seconds=timer.take()["verify"], finish=budget.finish)
        while not budget.done:
            with timer("verify"):
                logits = model(as_batch([token]), positions(cache.length, 1), cache).logits
                token = sampler.pick(logits[0, -1])
            tokens = budget.clip([token])
            yield Step(tokens, ["target"], target_forwards=1,
                       verify_seconds=timer.take()["verify"], finish=budget.finish)
