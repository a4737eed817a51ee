"""What every strategy shares: the Strategy interface, context checks and cache sizing.

A strategy is a loop of propose -> verify -> commit that yields one `Step` per target
forward (or per committed batch). Stats, the CLI, the server and the benchmark read Steps
only, so they agree on every number.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import torch

from draftsman.core import GenerationConfig, Step
from draftsman.errors import ContextOverflowError, InvalidArgumentError
from draftsman.models.base import DecoderLM


def check_fits(model: DecoderLM, prompt_len: int, config: GenerationConfig) -> None:
    if prompt_len == 0:
        raise InvalidArgumentError("the prompt is empty")
    context = model.config.max_position_embeddings
    if prompt_len + config.max_new_tokens > context:
        raise ContextOverflowError(
            f"prompt of {prompt_len} tokens + max-new-tokens {config.max_new_tokens} "
            f"exceeds the model's context of {context} tokens"
        )


def as_batch(tokens: list[int]) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long)


def positions(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.long)[None]


class Strategy(ABC):
    """One decoding method. Construct with loaded models and options; call `generate`."""

    name: ClassVar[str]
    exactness: ClassVar[str]  # "reference", "exact", "exact-greedy", "lossy"
    # True: `steps(prompt_ids, config, prefill_chunk)` returns the request as a step machine
    # (strategies/step_machine.py) the batch scheduler can share forwards with
    batchable: ClassVar[bool] = False

    @abstractmethod
    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        """Yield Steps until the budget is spent or EOS; the last Step carries `finish`."""
