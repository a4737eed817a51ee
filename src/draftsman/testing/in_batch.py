"""Run a strategy's request inside a changing batch, for the exactness harness.

`InBatch(target, make, company)` looks like a strategy: its `generate` runs a request of
`make()` through a `BatchScheduler` while other requests (of `company()`, with
prompts and budgets drawn from the request's seed) join before it, beside it and midway
through, and leave when they finish. Its Steps are the request's own. If batching leaked
anything between requests (rows, caches, draws, the controller's choices), the request's
outputs would stop being the target's distribution, or stop equalling its outputs alone,
and `check_exact` or an identity test would see it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from draftsman.batching.scheduler import BatchConfig, BatchScheduler
from draftsman.core import GenerationConfig, Step
from draftsman.sampling import SamplingConfig


@dataclass
class InBatch:
    target: object  # the model every request decodes with
    make: Callable[[], object]  # a new batchable strategy (one per request: drafters keep
    #                             per-request state), with `steps(prompt_ids, config, chunk)`
    company: Callable[[], object]  # the same for the other requests
    vocab: int  # company prompts draw token ids below this
    config: BatchConfig = BatchConfig(max_batch=4, prefill_chunk=3)
    companions: int = 3
    row_cost: object = None  # v(n) for the controller; None: linear
    _pool: object = None

    @property
    def name(self) -> str:
        return "in a batch"

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        seed = config.sampling.seed or 0
        rng = random.Random(seed)
        scheduler = BatchScheduler(self.target, self.config, self.row_cost, self._pool)
        self._pool = scheduler.new_cache  # llama.cpp: one shared context for every draw
        late = []
        for i in range(self.companions):
            prompt = [rng.randrange(self.vocab) for _ in range(rng.randint(1, 7))]
            sampling = SamplingConfig(1.0, seed=seed * 7919 + i) if rng.random() < 0.5 \
                else SamplingConfig()
            machine = self.company().steps(prompt, GenerationConfig(
                rng.randint(1, 12), sampling, config.eos_token_ids), self.config.prefill_chunk,
                new_cache=scheduler.new_cache)
            if rng.random() < 0.5:
                scheduler.submit(machine)
            else:
                late.append((rng.randint(1, 4), machine))
        mine: list[Step] = []
        scheduler.submit(self.make().steps(list(prompt_ids), config, self.config.prefill_chunk,
                                           new_cache=scheduler.new_cache), mine.append)
        steps = 0
        while not scheduler.idle:
            scheduler.step()
            steps += 1
            for machine in [m for when, m in late if when == steps]:
                scheduler.submit(machine)
        return iter(mine)
