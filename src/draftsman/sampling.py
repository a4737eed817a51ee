"""Logits -> probability distributions, and seeded draws.

Every sampling setting is standardised into a probability distribution (Leviathan et al.,
section 2): greedy is the one-hot distribution on the argmax, temperature scales logits,
top-k and top-p zero out the tail and renormalise. Verification rules therefore only ever
see distributions, and apply to every setting alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from draftsman.errors import InvalidArgumentError
from draftsman.kernels.greedy import greedy_tokens


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise InvalidArgumentError(f"temperature must be a number, got {self.temperature!r}")
        if self.temperature < 0:
            raise InvalidArgumentError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidArgumentError(f"top-k must be an integer >= 0, got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise InvalidArgumentError(f"top-p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """logits [..., V] -> float32 probabilities [..., V] under `config`."""
    if config.greedy:  # the same argmax in the logits' own dtype (bf16 -> float is exact)
        return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
    logits = logits.float() / config.temperature
    if config.top_k and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        logits = logits.masked_fill(~top_p_kept(logits, config.top_p), float("-inf"))
    return logits.softmax(-1)


# tokens ranked at first for top-p (then 8x as many while the nucleus reaches past them;
# 256 ran ~20% faster than 1024 on real logits, bench-results/logits-read)
TOP_P_HEAD = 256


def top_p_kept(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """bool [..., V]: the tokens top-p keeps of float logits [..., V] (temperature and top-k
    applied). Tokens ranked by probability, ties lower id first; a token is dropped when the
    tokens ranked above it already reach top_p (the first always stays): the shortest head
    whose mass reaches top_p (testing/reference.py).

    Each row ranks only a head of its tokens where that decides it: its TOP_P_HEAD most
    probable (8x as many, up to a quarter of the vocabulary, where its kept tokens reach the
    head's least probable value: a tie there might rank a token outside the head above a kept
    one), else all of them (and all of them off the CPU, where deciding per row would read
    back to the host). The head's ranking is a prefix of the whole one, summed in the same
    order: the same tokens kept. Ranking all 151,936 tokens took ~7 ms a row on an AMX
    Xeon (2 threads), 63 ms for a verify's 16 rows (bench-results/logits-read)."""
    probs = logits.softmax(-1)
    vocab = probs.shape[-1]
    rows = probs.reshape(-1, vocab)
    if rows.device.type != "cpu":  # deciding per row reads back to the host: rank it all
        return _kept_of_all(rows, top_p).reshape(probs.shape)
    kept = None
    todo = torch.arange(rows.shape[0])  # rows not decided yet
    head = TOP_P_HEAD
    while head <= vocab // 4 and todo.numel():
        every = kept is None
        mask, decided = _kept_of_head(rows if every else rows[todo], head, top_p)
        if every and bool(decided.all()):  # the usual case: every row from its first head
            return mask.reshape(probs.shape)
        if every:
            kept = torch.zeros_like(rows, dtype=torch.bool)
        kept[todo[decided]] = mask[decided]
        todo = todo[~decided]
        head *= 8
    if todo.numel():
        if kept is None:  # no head short of a quarter of the vocabulary
            return _kept_of_all(rows, top_p).reshape(probs.shape)
        kept[todo] = _kept_of_all(rows[todo], top_p)
    return kept.reshape(probs.shape)


def _kept_of_head(probs: torch.Tensor, head: int, top_p: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept [n, V], decided [n]) from each row's `head` most probable tokens of probs [n, V]."""
    values, ids = probs.topk(head, dim=-1)
    ids, by_id = ids.sort(dim=-1)  # then stably by probability: ties lower id first
    values, rank = values.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
    kept = values.cumsum(-1) - values < top_p  # a prefix of the ranking: the sum never falls
    last = values.gather(-1, kept.sum(-1, keepdim=True) - 1)
    decided = (last > values[:, -1:]).squeeze(-1)
    mask = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, ids.gather(-1, rank), kept)
    return mask, decided


def _kept_of_all(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """kept [n, V] from each row's whole ranking."""
    values, ids = probs.sort(dim=-1, descending=True, stable=True)  # ties: lower id first
    kept = values.cumsum(-1) - values < top_p
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, ids, kept)


def inverse_cdf_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token a uniform u in [0, 1) picks from probs [V] (non-negative, any total): the
    first whose cumulative mass exceeds u times the total, never one of mass 0 (float32 sums:
    each token's share off by at most a rounding of the total, ~6e-8 of it). torch.multinomial
    took 2.7 ms for a 151,936-token distribution on an AMX Xeon, this 0.095
    (bench-results/logits-read/draw-time.txt)."""
    cdf = probs.float().cumsum(-1)
    token = torch.searchsorted(cdf, u * cdf[-1], right=True)
    # u * total may round up to the total: the last token of positive mass, not one past it
    return torch.minimum(token, torch.searchsorted(cdf, cdf[-1]))


class Sampler:
    """A sampling config with its own seeded generator: the same seed gives the same draws.

    Draws happen on the device of the distribution, each device with its own generator
    seeded alike (a CUDA generator cannot draw on the CPU, nor the reverse): reproducible
    per device, not across devices.
    """

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self.generator = self._new_generator(torch.device("cpu"))
        self._device_generators: dict[torch.device, torch.Generator] = {}

    def _new_generator(self, device: torch.device) -> torch.Generator:
        generator = torch.Generator(device=device)
        generator.manual_seed(self.config.seed if self.config.seed is not None else 0)
        if self.config.seed is None:
            generator.seed()
        return generator

    def generator_for(self, device: torch.device) -> torch.Generator:
        """The CPU generator, or this device's own (made on first use)."""
        if device.type == "cpu":
            return self.generator
        if device not in self._device_generators:
            self._device_generators[device] = self._new_generator(device)
        return self._device_generators[device]

    @property
    def greedy(self) -> bool:
        return self.config.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probabilities(logits, self.config)

    def draw(self, probs: torch.Tensor) -> int:
        """One token from probs [V]."""
        return int(self.draw_tensor(probs))

    def draw_tensor(self, probs: torch.Tensor) -> torch.Tensor:
        """One token from probs [V] as a 0-d tensor on their device (no host sync)."""
        generator = self.generator_for(probs.device)
        if probs.device.type != "cpu":
            return torch.multinomial(probs, 1, generator=generator)[0]
        return inverse_cdf_draw(probs, torch.rand((), generator=generator))

    def uniform(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """n uniform draws in [0, 1), on `device` (default the CPU)."""
        generator = self.generator if device is None else self.generator_for(device)
        return torch.rand(n, generator=generator, device=generator.device)

    def pick(self, logits: torch.Tensor) -> int:
        """One token from logits [V]: argmax when greedy, else a draw."""
        return int(self.pick_tensor(logits))

    def pick_tensor(self, logits: torch.Tensor) -> torch.Tensor:
        """`pick` as a 0-d tensor on the logits' device (no host sync): the same draws."""
        if self.greedy:
            return greedy_tokens(logits)
        return self.draw_tensor(self.probs(logits))
