"""The shared vocabulary of decoding: the Step event every strategy yields, the request
config, the token budget, the wall-clock timer, and the Stats derived from Steps only
(the CLI, the server and the benchmark all read these, so they agree on every number)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from draftsman.errors import InvalidArgumentError
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
    # the client's earlier sequences (proposers/history.py `Scope`) for drafters that use them
    history: object | None = field(default=None, compare=False)

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


@dataclass(frozen=True)
class Stats:
    new_tokens: int
    steps: int
    target_forwards: int
    draft_forwards: int
    drafted: int
    accepted: int
    rejections: int
    drafting_steps: int
    draft_seconds: float
    verify_seconds: float
    other_seconds: float

    @classmethod
    def from_steps(cls, steps: list[Step]) -> Stats:
        return cls(
            new_tokens=sum(len(s.tokens) for s in steps),
            steps=len(steps),
            target_forwards=sum(s.target_forwards for s in steps),
            draft_forwards=sum(s.draft_forwards for s in steps),
            drafted=sum(s.drafted for s in steps),
            accepted=sum(s.accepted for s in steps),
            rejections=sum(1 for s in steps if s.rejected),
            drafting_steps=sum(1 for s in steps if s.drafted),
            draft_seconds=sum(s.draft_seconds for s in steps),
            verify_seconds=sum(s.verify_seconds for s in steps),
            other_seconds=sum(s.other_seconds for s in steps),
        )

    @property
    def alpha(self) -> float | None:
        """Per-guess acceptance probability, maximum-likelihood under i.i.d. acceptance.

        Each guess is checked in order until the first rejection; guesses after a rejection
        were never tested, so α̂ = accepted / (accepted + rejections), not accepted / drafted.
        """
        trials = self.accepted + self.rejections
        return self.accepted / trials if trials else None

    @property
    def acceptance_rate(self) -> float | None:
        """Share of drafted tokens that were kept (what most papers call acceptance rate)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        """Mean tokens committed per target forward (prefill counts as one forward)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else None

    @property
    def cost_ratio(self) -> float | None:
        """c: seconds per draft forward / seconds per target forward, as measured."""
        if not self.draft_forwards or not self.target_forwards or not self.verify_seconds:
            return None
        return (self.draft_seconds / self.draft_forwards) / (
            self.verify_seconds / self.target_forwards
        )

    @property
    def mean_gamma(self) -> float | None:
        """Mean guesses per verify among steps that drafted."""
        return self.drafted / self.drafting_steps if self.drafting_steps else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(alpha=self.alpha, acceptance_rate=self.acceptance_rate, tau=self.tau,
                 cost_ratio=self.cost_ratio, gamma=self.mean_gamma)
        return d
