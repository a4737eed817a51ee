"""What every strategy shares: the Step event, the request config, budget and cache sizing.

A strategy is a loop of propose -> verify -> commit that yields one `Step` per target
forward (or per committed batch). Stats, the CLI, the server and the benchmark read Steps
only, so they agree on every number.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from draftsman.cache import KVCache
from draftsman.errors import ContextOverflowError, InvalidArgumentError
from draftsman.models.base import DecoderLM
from draftsman.sampling import SamplingConfig


@dataclass
class Step:
    tokens: list[int]  # committed by this step, in order
    sources: list[str]  # who produced each token: "target", "draft", "subdraft", ...
    drafted: int = 0  # guesses proposed to the target in this step
    accepted: int = 0  # guesses kept
    rejected: bool = False  # a guess was refused (then the last token is a recovery)
    target_forwards: int = 0
    draft_forwards: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    other_seconds: float = 0.0
    prefill: bool = False
    finish: str | None = None  # "eos" or "length" on the last step
    extra: dict = field(default_factory=dict)  # strategy-specific (gamma, stage stats, ...)


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eos_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidArgumentError(
                f"max-new-tokens must be a positive integer, got {self.max_new_tokens!r}"
            )


class Budget:
    """Cuts committed tokens at the first EOS (kept) and at max_new_tokens."""

    def __init__(self, config: GenerationConfig) -> None:
        self.remaining = config.max_new_tokens
        self.eos = config.eos_token_ids
        self.finish: str | None = None

    def clip(self, tokens: list[int]) -> list[int]:
        out = []
        for t in tokens[: self.remaining]:
            out.append(t)
            if t in self.eos:
                self.finish = "eos"
                break
        self.remaining -= len(out)
        if self.finish is None and self.remaining <= 0:
            self.finish = "length"
        return out

    @property
    def done(self) -> bool:
        return self.finish is not None


def check_fits(model: DecoderLM, prompt_len: int, config: GenerationConfig) -> None:
    if prompt_len == 0:
        raise InvalidArgumentError("the prompt is empty")
    context = model.config.max_position_embeddings
    if prompt_len + config.max_new_tokens > context:
        raise ContextOverflowError(
            f"prompt of {prompt_len} tokens + max-new-tokens {config.max_new_tokens} "
            f"exceeds the model's context of {context} tokens"
        )


def new_cache(model: DecoderLM, prompt_len: int, config: GenerationConfig,
              lookahead: int = 0) -> KVCache:
    """A cache for one request: prompt + budget + the strategy's speculative lookahead."""
    check_fits(model, prompt_len, config)
    return model.new_cache(prompt_len + config.max_new_tokens + lookahead + 1)


def as_batch(tokens: list[int]) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long)


def positions(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.long)[None]


class Timer:
    """Accumulates wall time into named buckets: `with timer("draft"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._name = ""
        self._t0 = 0.0

    def __call__(self, name: str) -> Timer:
        self._name = name
        return self

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._t0
        self.seconds[self._name] = self.seconds.get(self._name, 0.0) + elapsed

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


class Strategy(ABC):
    """One decoding method. Construct with loaded models and options; call `generate`."""

    name: ClassVar[str]
    exactness: ClassVar[str]  # "reference", "exact", "exact-greedy", "lossy"
    needs_draft: ClassVar[bool] = False

    @abstractmethod
    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        """Yield Steps until the budget is spent or EOS; the last Step carries `finish`."""
