"""The reference: one target forward per token."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import LAST, DecoderLM
from draftsman.models.protocol import Cache
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy, check_fits
from draftsman.strategies.step_machine import SpeculativeSteps


class HostRead:
    """One device scalar at a time copied to the host: `start` begins the copy, `get` waits
    for that copy alone, so the host can queue more device work in between. One pinned
    buffer and one event per request, reused every token (on the CPU, the value itself)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.buffer = torch.empty((), dtype=torch.long, pin_memory=True) if self.cuda else None
        self.ready = torch.cuda.Event() if self.cuda else None
        self.value: torch.Tensor | None = None

    def start(self, value: torch.Tensor) -> None:
        if self.cuda:
            self.buffer.copy_(value, non_blocking=True)
            self.ready.record()
        else:
            self.value = value

    def get(self) -> int:
        if self.cuda:
            self.ready.synchronize()  # this copy only: the step queued after it runs on
            return int(self.buffer)
        return int(self.value)


class Autoregressive(Strategy):
    """`ahead` (default: on a GPU) keeps the host one step ahead of the device: the step
    that feeds token t is queued before the host reads token t, so the host's work between
    steps (reading, clipping, streaming, the next step's inputs) overlaps the device's
    instead of idling it. Same forwards, same draws, same tokens; at EOS one queued step is
    wasted (counted in the last Step's forwards). On the CPU a forward runs as it is called,
    so there is nothing to overlap."""

    name = "autoregressive"
    exactness = "reference"
    batchable = True

    def __init__(self, target: DecoderLM, ahead: bool | None = None) -> None:
        self.target = target
        self.ahead = target.capabilities.device != "cpu" if ahead is None else ahead

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
        if self.ahead:
            return self._generate_ahead(state, sampler, Budget(config), prompt_ids)
        return self._generate(state, sampler, Budget(config), prompt_ids)

    @staticmethod
    def _generate(state: ModelState, sampler: Sampler, budget: Budget,
                  prompt_ids: list[int]) -> Iterator[Step]:
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

    @staticmethod
    def _generate_ahead(state: ModelState, sampler: Sampler, budget: Budget,
                        prompt_ids: list[int]) -> Iterator[Step]:
        t0 = time.perf_counter()
        token = sampler.pick_tensor(state.feed(prompt_ids, logits_at=LAST).logits[0, -1])
        prefill = True
        read = HostRead(token.device)
        while True:
            read.start(token)
            queued = budget.remaining > 1  # a token may follow: queue its step first
            if queued:
                logits = state.feed_unread(token.view(1), logits_at=LAST).logits[0, -1]
                token = sampler.pick_tensor(logits)
            value = read.get()
            if queued:
                state.settle([value])
            tokens = budget.clip([value])
            wasted = int(queued and budget.done)  # the step queued past EOS
            yield Step(tokens, ["target"], target_forwards=1 + wasted, prefill=prefill,
                       verify_seconds=time.perf_counter() - t0, finish=budget.finish)
            if budget.done:
                return
            t0, prefill = time.perf_counter(), False
