"""Statistics derived from Steps only (the CLI, server and benchmark all use this)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftsman.strategies.base import Step


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
