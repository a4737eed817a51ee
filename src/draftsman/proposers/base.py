"""Who guesses: the proposer interface shared by every drafter."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from draftsman.sampling import Sampler


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities; None: deterministic guesses
    forwards: int = 0  # draft model forwards spent
    extra: dict = field(default_factory=dict)  # e.g. inner-stage acceptance for cascades
    # a cheaper drafter's guesses a cascade did not send (their match length, the guesses):
    # the step machine learns from the committed text how they would have fared
    shadow: tuple[int | None, list[int]] | None = None


class Proposer(ABC):
    """Guesses the next tokens after `committed` (prompt + generated so far).

    `start` is called once per request, `propose` once per step, `commit` after the target
    decided (so a model-based proposer can roll its cache back). Deterministic proposers
    (n-gram, prompt lookup) return q = None: their guess is a point mass.
    """

    name: str = "proposer"
    uses_model: bool = False
    uses_history: bool = False  # True: drafts from earlier sequences given to `use_history`
    # True: `propose` also takes `room` and `route` and may return a cheaper drafter's
    # deterministic guesses (extra["bypass"]) past γ, up to `room`, as many as
    # `route(guesses, match)` says beat drafting with the model (0: draft); a cascade
    # sending a copied passage straight to the target
    bypasses: bool = False

    def use_history(self, history: object | None) -> None:
        """The request's read-only earlier sequences (proposers/history.py `Scope`), or None;
        called before `start`. Only proposers with `uses_history` read it."""
        return None

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        """Prepare for a request whose sequence will not exceed `capacity` tokens."""
        return None

    @abstractmethod
    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        """Up to `gamma` guesses; fewer if the proposer has nothing (or, with `stop_below`,
        as soon as its own confidence in the next guess drops below that probability)."""

    def propose_branches(self, committed: list[int], gamma: int, branches: int,
                         sampler: Sampler) -> list[Proposal]:
        """Up to `branches` different deterministic continuations of up to `gamma` guesses,
        most promising first (tree verification). Drafters with one guess per step return
        their single proposal."""
        proposal = self.propose(committed, gamma, sampler)
        return [proposal] if proposal.tokens else []

    def commit(self, committed: list[int]) -> None:
        """The target has decided; `committed` is the whole accepted sequence."""
        return None
