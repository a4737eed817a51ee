"""Big Little Decoder (Kim et al., "Big Little Transformer Decoder", BiLD): lossy, measured.

A small model S writes the text on its own; the large model L only checks it, once in a while,
non-autoregressively. Two policies decide when (Algorithm 1 of the paper):

Fallback. At position n the small model computes p_S(· | y_<n). It keeps its token y_n ~ p_S
while its confidence is high enough and it has not run too long unchecked:

    max_y p_S(y | y_<n) > α_FB   and   k < max_small,

where k counts the small model's tokens since L last ran. Otherwise L runs once over the
k unchecked tokens plus the current position (one forward of k + 1 tokens), giving
p_L(· | y_<m) for every unchecked position m and for n.

Rollback. Among the unchecked positions, take the smallest m with

    d(p_S(· | y_<m), p_L(· | y_<m), y_m) > α_RB.

If there is one, the small tokens y_m..y_{n-1} are dropped (from the output and from both KV
caches) and y_m is replaced by L's token y_m ~ p_L(· | y_<m); otherwise L's token for n is
appended. In both cases the small model continues after L's token. Distances:

    cross-entropy   d = -log p_L(y_m)                     (the paper's choice: S's hard label
                                                            under L's soft label; default)
    total-variation d = ½ Σ_y |p_S(y) - p_L(y)|
    kl              d = Σ_y p_S(y) log(p_S(y) / p_L(y))    (= cross-entropy when p_S is one-hot)

Policy distributions are the models' beliefs p = softmax(logits / T) (T = 1 when greedy);
top-k / top-p only shape the draws. α_FB compares strictly (Algorithm 1, line 4), so α_FB = 1
always falls back, even when a probability rounds to 1.0, and α_FB = 0 never does.

Invariants:
- A token is yielded (final) only when nothing can take it back: with rollback on, a small
  token becomes final when L has checked it; with rollback off (α_RB = inf), at once.
- With rollback on, every small token is checked: at EOS or when the small tokens fill the
  budget, L runs once more over the tail (its own next token is then cut by the budget).
- Each model's KV cache holds exactly the committed text (minus the last token) whenever that
  model runs: `ModelState.sync` truncates to the common prefix, so a rollback costs nothing
  but the recomputation of the dropped positions.
- α_FB = 1 (or α_RB = 0 with cross-entropy) gives the large model's own output; α_FB = 0, no
  cap and rollback off give the small model's own output.

Early exit (section 4.4): the small model is the first `early_exit` layers of the large model
with its final norm and LM head. Both share one KV cache: the small pass writes layers < L_e
and keeps the residual stream at layer L_e; at a fallback the large pass runs only layers
L_e..N-1 from those hidden states, which fills the skipped layers' KV entries with the real
values the paper requires (no copying of the exit layer's state, no recomputation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.errors import InvalidArgumentError
from draftsman.models.base import LAST, DecoderLM
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy, as_batch, check_fits, positions

# ---------------------------------------------------------------------------- distances

Distance = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(small_logp: torch.Tensor | None, large_logp: torch.Tensor,
                  tokens: torch.Tensor) -> torch.Tensor:
    """-log p_L(y_m) for each row m: [k]. Needs only the small model's tokens."""
    return -large_logp.gather(-1, tokens[:, None])[:, 0]


def total_variation(small_logp: torch.Tensor, large_logp: torch.Tensor,
                    tokens: torch.Tensor) -> torch.Tensor:
    """½ Σ_y |p_S(y) - p_L(y)| per row, in [0, 1]."""
    return 0.5 * (small_logp.exp() - large_logp.exp()).abs().sum(-1)


def kl_divergence(small_logp: torch.Tensor, large_logp: torch.Tensor,
                  tokens: torch.Tensor) -> torch.Tensor:
    """KL(p_S ‖ p_L) = Σ_y p_S(y) (log p_S(y) - log p_L(y)) per row, >= 0."""
    p = small_logp.exp()
    # 0 · log 0 = 0; where p_L = 0 but p_S > 0 the divergence is +inf, as it should be
    terms = torch.where(p > 0, p * (small_logp - large_logp), torch.zeros_like(p))
    return terms.sum(-1)


DISTANCES: dict[str, Distance] = {
    "cross-entropy": cross_entropy,
    "total-variation": total_variation,
    "kl": kl_divergence,
}
DISTANCE_ALIASES = {"ce": "cross-entropy", "crossentropy": "cross-entropy",
                    "cross_entropy": "cross-entropy", "tv": "total-variation",
                    "total_variation": "total-variation", "kl-divergence": "kl"}


def policy_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) in float32; T = 0 (greedy) reads the plain softmax."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1)


# ---------------------------------------------------------------------------- config

OFF = ("off", "none", "inf", "infinity", "")


def _number(value: Any, name: str) -> float:
    if isinstance(value, str) and value.strip().lower() in OFF:
        return math.inf
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} must be a number or 'off', got {value!r}") from None
    if math.isnan(out):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    return out


@dataclass(frozen=True)
class BigLittleConfig:
    """The two thresholds, the cap and the distance (see the module docstring)."""

    fallback: float = 0.5  # α_FB in [0, 1]: small keeps its token iff max p_S > α_FB
    rollback: float = 3.0  # α_RB >= 0; math.inf turns rollback off
    max_small: int | None = 10  # small tokens between two large runs; None: no cap
    distance: str = "cross-entropy"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fallback <= 1.0:
            raise InvalidArgumentError(f"fallback must be in [0, 1], got {self.fallback}")
        if not self.rollback >= 0.0:
            raise InvalidArgumentError(f"rollback must be >= 0 or 'off', got {self.rollback}")
        if self.max_small is not None and (isinstance(self.max_small, bool)
                                           or not isinstance(self.max_small, int)
                                           or self.max_small < 1):
            raise InvalidArgumentError(
                f"max_small must be an integer >= 1 or 'off', got {self.max_small!r}")
        if self.distance not in DISTANCES:
            raise InvalidArgumentError(
                f"unknown distance {self.distance!r}; choose {', '.join(DISTANCES)}")

    @property
    def reviews(self) -> bool:
        """Rollback is on: small tokens stay tentative until the large model checked them."""
        return math.isfinite(self.rollback)

    @classmethod
    def from_options(cls, fallback: Any = 0.5, rollback: Any = 3.0, max_small: Any = 10,
                     distance: Any = "cross-entropy") -> BigLittleConfig:
        """Parse CLI-style values: numbers or strings, 'off' for rollback and max_small."""
        cap = _number(max_small, "max_small")
        if math.isfinite(cap) and cap != int(cap):
            raise InvalidArgumentError(f"max_small must be an integer, got {max_small!r}")
        name = str(distance).strip().lower()
        return cls(
            fallback=_number(fallback, "fallback"),
            rollback=_number(rollback, "rollback"),
            max_small=int(cap) if math.isfinite(cap) else None,
            distance=DISTANCE_ALIASES.get(name, name),
        )


# ---------------------------------------------------------------------------- model pairs


class Pair(Protocol):
    """The small and the large model over one committed text.

    `small_next(committed)` -> the small model's logits [V] for the position after
    `committed`. `large_check(committed, k)` -> the large model's logits [k + 1, V] for the
    last k committed positions and the next one. `sync(tokens)` rolls both caches back to
    the longest common prefix with `tokens`; after a rollback the strategy syncs to the
    committed text minus its last token, which no cache may hold (it must be fed to read
    the next position, and the deep layers of an early exit must still be able to take it).
    """

    def small_next(self, committed: list[int]) -> torch.Tensor: ...

    def large_check(self, committed: list[int], k: int) -> torch.Tensor: ...

    def sync(self, committed: list[int]) -> None: ...


class TwoModels:
    """Two separate models, each with its own cache (kept in step by `ModelState.sync`)."""

    def __init__(self, small: DecoderLM, large: DecoderLM, capacity: int) -> None:
        self.small = ModelState(small, capacity)
        self.large = ModelState(large, capacity)

    def small_next(self, committed: list[int]) -> torch.Tensor:
        # the last token must be fed to read the next position: keep it out of the cache
        pending = self.small.sync(committed[:-1]) + committed[-1:]
        return self.small.feed(pending, logits_at=LAST).logits[0, -1]

    def large_check(self, committed: list[int], k: int) -> torch.Tensor:
        # inputs for the k + 1 rows: the token before the unchecked ones, and them
        split = len(committed) - k - 1
        pending = self.large.sync(committed[:split]) + committed[split:]
        return self.large.feed(pending, logits_at=slice(len(pending) - k - 1, None)).logits[0]

    def sync(self, committed: list[int]) -> None:
        self.small.sync(committed)
        self.large.sync(committed)


def check_exit_layer(model: DecoderLM, exit_layer: int) -> None:
    n = model.config.num_layers
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) \
            or not 1 <= exit_layer < n:
        raise InvalidArgumentError(
            f"early_exit must be an integer from 1 to {n - 1} (the model has {n} layers), "
            f"got {exit_layer!r}")


class EarlyExit:
    """The first `exit_layer` layers of one model as the small model, sharing its cache.

    State: `fed` tokens have their KV in layers < exit_layer (the shallow part); the first
    `deep` of them also in layers >= exit_layer; `hidden` holds the residual stream at the
    exit layer for slots deep..len(fed)-1, the input the deep layers will need.
    Invariant: deep <= len(fed) = cache.length.
    """

    def __init__(self, model: DecoderLM, exit_layer: int, capacity: int) -> None:
        check_exit_layer(model, exit_layer)
        self.model = model
        self.shallow = range(0, exit_layer)
        self.deep_layers = range(exit_layer, model.config.num_layers)
        self.cache = model.new_cache(capacity)
        self.fed: list[int] = []
        self.deep = 0
        self.hidden: list[torch.Tensor] = []  # [1, t, H] pieces, slots deep..len(fed)-1

    def _run_shallow(self, tokens: list[int]) -> torch.Tensor:
        start = len(self.fed)
        out = self.model(as_batch(tokens), positions(start, len(tokens)), self.cache,
                         layers=self.shallow, start=start)
        self.fed.extend(tokens)
        self.hidden.append(out.hidden)
        return out.hidden

    def small_next(self, committed: list[int]) -> torch.Tensor:
        self.sync(committed[:-1])
        hidden = self._run_shallow(committed[len(self.fed):])
        with torch.inference_mode():
            return self.model.head(hidden[0, -1])

    def large_check(self, committed: list[int], k: int) -> torch.Tensor:
        self.sync(committed)
        if len(self.fed) < len(committed):  # the cap skipped the small pass: run it now
            self._run_shallow(committed[len(self.fed):])
        hidden = torch.cat(self.hidden, dim=1) if len(self.hidden) > 1 else self.hidden[0]
        t = hidden.shape[1]
        # holds when the strategy keeps the rule "caches never hold the last committed token"
        assert t > k, "the deep layers ran ahead of the unchecked tokens"
        out = self.model(None, positions(self.deep, t), self.cache, layers=self.deep_layers,
                         hidden_from=hidden, start=self.deep, logits_at=slice(t - k - 1, None))
        self.deep += t
        self.hidden = []
        return out.logits[0]

    def sync(self, committed: list[int]) -> None:
        n = min(len(self.fed), len(committed))
        i = 0
        while i < n and self.fed[i] == committed[i]:
            i += 1
        if i == len(self.fed):
            return
        del self.fed[i:]
        if self.deep >= i:  # deep > i cannot happen in BiLD (checked tokens are final)
            self.deep, self.hidden = i, []
        else:
            self.hidden = [torch.cat(self.hidden, dim=1)[:, : i - self.deep]]
        self.cache.truncate(i)


# ---------------------------------------------------------------------------- strategy


@dataclass
class _Check:
    """What one large-model run decided."""

    kept: int  # unchecked small tokens kept (a prefix)
    token: int  # the large model's token, appended after them


class BigLittle(Strategy):
    """BiLD over a small model (or the large model's first layers) and the large target.

    Steps: one per large-model run (tokens = the kept small tokens + the large token), and
    with rollback off one per small token as well. Step.sources are "small" / "large";
    Step.extra carries `fallbacks` (1 when a low confidence or the cap handed over),
    `trigger` ("confidence", "max_small" or "end"), `rollbacks` (0 or 1) and `rolled_back`
    (small tokens dropped). drafted / accepted count the checked / kept small tokens.
    """

    name: ClassVar[str] = "big-little"
    exactness: ClassVar[str] = "lossy"

    def __init__(self, large: DecoderLM, small: DecoderLM | None,
                 config: BigLittleConfig | None = None, early_exit: int | None = None) -> None:
        if (small is None) == (early_exit is None):
            raise InvalidArgumentError("big-little needs either a small model or early_exit")
        self.large = large
        self.small = small
        self.config = config or BigLittleConfig()
        self.early_exit = early_exit
        self.distance = DISTANCES[self.config.distance]
        if early_exit is not None:  # validate now, not at the first request
            check_exit_layer(large, early_exit)

    def new_pair(self, capacity: int) -> Pair:
        if self.early_exit is not None:
            return EarlyExit(self.large, self.early_exit, capacity)
        return TwoModels(self.small, self.large, capacity)

    def _check(self, large_logits: torch.Tensor, unchecked: list[int],
               small_rows: list[torch.Tensor], sampler: Sampler, temperature: float) -> _Check:
        """Apply the rollback policy to L's logits [k + 1, V] and pick L's token."""
        k = len(unchecked)
        m = k
        if self.config.reviews and k:
            large_logp = policy_logprobs(large_logits[:k], temperature)
            small_logp = torch.stack(small_rows) if small_rows else None
            d = self.distance(small_logp, large_logp, torch.tensor(unchecked))
            over = (d > self.config.rollback).nonzero()
            if over.numel():
                m = int(over[0, 0])
        return _Check(m, sampler.pick(large_logits[m]))

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        check_fits(self.large, len(prompt_ids), config)
        if self.small is not None:
            check_fits(self.small, len(prompt_ids), config)
        policy = self.config
        # the text never exceeds prompt + budget, plus L's token cut by the budget at the end
        pair = self.new_pair(len(prompt_ids) + config.max_new_tokens + 2)
        sampler = Sampler(config.sampling)
        temperature = 0.0 if sampler.greedy else config.sampling.temperature
        keep_rows = policy.distance != "cross-entropy"
        budget = Budget(config)
        timer = Timer()
        committed = list(prompt_ids)
        unchecked: list[int] = []  # small tokens since L last ran (the tail of `committed`)
        small_rows: list[torch.Tensor] = []  # their policy log-probs, if the distance needs them
        small_forwards = 0
        first = True
        cap = policy.max_small if policy.max_small is not None else math.inf

        while not budget.done:
            room = budget.remaining - (len(unchecked) if policy.reviews else 0)
            ended = bool(unchecked) and unchecked[-1] in budget.eos
            if room <= 0 or ended:
                trigger = "end"  # rollback on: the tail still needs its check
            elif len(unchecked) >= cap:
                trigger = "max_small"
            else:
                with timer("draft"):
                    logits = pair.small_next(committed)
                    small_forwards += 1
                    logp = policy_logprobs(logits, temperature)
                    confident = float(logp.max().exp()) > policy.fallback
                if confident:
                    with timer("draft"):
                        token = sampler.pick(logits)
                    committed.append(token)
                    unchecked.append(token)
                    if keep_rows:
                        small_rows.append(logp)
                    if not policy.reviews:  # nothing can take it back: final now
                        out = budget.clip([token])
                        seconds = timer.take()
                        yield Step(out, ["small"] * len(out), draft_forwards=small_forwards,
                                   draft_seconds=seconds.get("draft", 0.0), prefill=first,
                                   finish=budget.finish)
                        small_forwards, first = 0, False
                    continue
                trigger = "confidence"

            with timer("verify"):
                large_logits = pair.large_check(committed, len(unchecked))
            with timer("other"):
                check = self._check(large_logits, unchecked, small_rows, sampler, temperature)
                k = len(unchecked)
                rolled_back = k - check.kept
                del committed[len(committed) - rolled_back:]
                committed.append(check.token)
                if rolled_back:  # L's token may equal the one dropped: forget it too
                    pair.sync(committed[:-1])
                kept = unchecked[: check.kept] if policy.reviews else []
                out = budget.clip(kept + [check.token])
            seconds = timer.take()
            n_small = min(len(kept), len(out))
            yield Step(
                out,
                ["small"] * n_small + ["large"] * (len(out) - n_small),
                drafted=k if policy.reviews else 0,
                accepted=check.kept if policy.reviews else 0,
                rejected=rolled_back > 0,
                target_forwards=1,
                draft_forwards=small_forwards,
                draft_seconds=seconds.get("draft", 0.0),
                verify_seconds=seconds["verify"],
                other_seconds=seconds.get("other", 0.0),
                prefill=first,
                finish=budget.finish,
                extra={
                    "trigger": trigger,
                    "fallbacks": int(trigger != "end"),
                    "rollbacks": int(rolled_back > 0),
                    "rolled_back": rolled_back,
                    "unchecked": k,
                },
            )
            unchecked, small_rows, small_forwards, first = [], [], 0, False
