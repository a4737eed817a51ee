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
- Each model's KV cache holds a prefix of the committed text (never its last token) whenever
  that model runs. Between large runs the text only grows, so each model feeds just what it
  misses; a rollback cuts both caches once (`ModelState.rollback`), costing nothing but the
  recomputation of the dropped positions.
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
from typing import ClassVar, Protocol

import torch

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.errors import InvalidArgumentError
from draftsman.models.base import LAST, DecoderLM
from draftsman.models.cache import KVCache
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy, check_fits
from draftsman.strategies.options import MethodOptions, option

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


# 'off' and its spellings: rollback -> inf (never roll back), max_small -> None (no cap)
OFF_WORDS = ("off", "none", "inf", "infinity", "")


@dataclass(frozen=True)
class BigLittleOptions(MethodOptions):
    """`--method big-little` options: the small model (or early_exit) and BigLittleConfig."""

    draft: str | None = option(None, "the small model (name/path); default: the target's "
                                     "catalogue draft")
    fallback: float = option(0.5, "alpha_FB: the small model keeps its token while its top "
                                  "probability is above this", kind=float, minimum=0,
                             maximum=1)
    rollback: float = option(3.0, "alpha_RB: the large model rolls back a small token whose "
                                  "distance exceeds this; 'off' never", kind=float,
                             minimum=0, words=dict.fromkeys(OFF_WORDS, math.inf))
    max_small: int | None = option(10, "small tokens between two large runs; 'off': no cap",
                                   kind=int, minimum=1, words=dict.fromkeys(OFF_WORDS))
    distance: str = option("cross-entropy", "rollback distance between the two models",
                           choices=tuple(DISTANCES), aliases=DISTANCE_ALIASES)
    early_exit: int | None = option(None, "use the target's first LAYERS layers as the small "
                                          "model instead of a draft", kind=int, minimum=1)

    def needs(self) -> dict[str, str]:
        if self.early_exit is None:
            return {}
        why = "hidden states of an intermediate layer (early_exit)"
        return {"layer_ranges": why, "hidden_states": why}

    def config(self) -> BigLittleConfig:
        return BigLittleConfig(self.fallback, self.rollback, self.max_small, self.distance)


# ---------------------------------------------------------------------------- model pairs


class Pair(Protocol):
    """The small and the large model over one committed text.

    `small_next(committed)` -> the small model's logits [V] for the position after
    `committed`. `large_check(committed, k)` -> the large model's logits [k + 1, V] for the
    last k committed positions and the next one. Between two large runs the text only grows,
    so both feed just the tokens they miss; `rollback(n)` cuts both caches when the text was
    cut to n tokens, and `sync(tokens)` rolls both back to the longest common prefix with
    `tokens`. No cache may hold the last committed token (it must be fed to read the next
    position, and the deep layers of an early exit must still be able to take it).
    """

    def small_next(self, committed: list[int]) -> torch.Tensor: ...

    def large_check(self, committed: list[int], k: int) -> torch.Tensor: ...

    def rollback(self, length: int) -> None: ...

    def sync(self, committed: list[int]) -> None: ...


class TwoModels:
    """Two separate models, each with its own cache and `ModelState`."""

    def __init__(self, small: DecoderLM, large: DecoderLM, capacity: int) -> None:
        self.small = ModelState(small, capacity)
        self.large = ModelState(large, capacity)

    def small_next(self, committed: list[int]) -> torch.Tensor:
        pending = self.small.missing(committed)  # the last token, or more after a check
        return self.small.feed(pending, logits_at=LAST).logits[0, -1]

    def large_check(self, committed: list[int], k: int) -> torch.Tensor:
        # inputs for the k + 1 rows: the token before the unchecked ones, and them
        pending = self.large.missing(committed)
        return self.large.feed(pending, logits_at=slice(len(pending) - k - 1, None)).logits[0]

    def rollback(self, length: int) -> None:
        self.small.rollback(length)
        self.large.rollback(length)

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

    Two states over one cache: `small` (layers < exit_layer) and `large` (the rest). The
    small one runs ahead; `hidden` holds the residual stream at the exit layer for its
    slots the large one has not run yet, the input the deep layers will need.
    Invariant: large.fed is a prefix of small.fed, len(small.fed) = cache.length, and the
    `hidden` pieces cover slots len(large.fed)..len(small.fed)-1.
    """

    def __init__(self, model: DecoderLM, exit_layer: int, capacity: int) -> None:
        check_exit_layer(model, exit_layer)
        self.model = model
        self.small = ModelState(model, capacity, layers=range(0, exit_layer))
        self.large = ModelState(model, layers=range(exit_layer, model.config.num_layers),
                                cache=self.small.cache)
        self.hidden: list[torch.Tensor] = []  # [1, t, H] pieces

    @property
    def cache(self) -> KVCache:
        return self.small.cache

    @property
    def fed(self) -> list[int]:
        """Tokens whose keys/values the shallow layers hold."""
        return self.small.fed

    @property
    def deep(self) -> int:
        """Slots the deep layers hold as well."""
        return len(self.large.fed)

    def _run_shallow(self, committed: list[int]) -> torch.Tensor:
        hidden = self.small.feed(self.small.missing(committed)).hidden
        self.hidden.append(hidden)
        return hidden

    def small_next(self, committed: list[int]) -> torch.Tensor:
        hidden = self._run_shallow(committed)
        with torch.inference_mode():
            return self.model.head(hidden[0, -1])

    def large_check(self, committed: list[int], k: int) -> torch.Tensor:
        if len(self.small.fed) < len(committed):  # the cap skipped the small pass: run it now
            self._run_shallow(committed)
        hidden = torch.cat(self.hidden, dim=1) if len(self.hidden) > 1 else self.hidden[0]
        t = hidden.shape[1]
        # holds when the strategy keeps the rule "caches never hold the last committed token"
        assert t > k, "the deep layers ran ahead of the unchecked tokens"
        out = self.large.feed(self.small.fed[self.deep:], logits_at=slice(t - k - 1, None),
                              hidden=hidden)
        self.hidden = []
        return out.logits[0]

    def rollback(self, length: int) -> None:
        self.small.rollback(length)
        self._follow()

    def sync(self, committed: list[int]) -> None:
        self.small.sync(committed)
        self._follow()

    def _follow(self) -> None:
        """After the shallow state was cut, cut the deep one and the pending hidden states."""
        n = len(self.small.fed)
        if self.deep >= n:  # deep > n cannot happen in BiLD (checked tokens are final)
            self.large.rollback(n)
            self.hidden = []
        elif self.hidden and n < self.deep + sum(h.shape[1] for h in self.hidden):
            self.hidden = [torch.cat(self.hidden, dim=1)[:, : n - self.deep]]


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
            tokens = torch.tensor(unchecked, device=large_logp.device)
            d = self.distance(small_logp, large_logp, tokens)
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
                    pair.rollback(len(committed) - 1)
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
