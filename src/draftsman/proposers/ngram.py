"""An n-gram model of the prompt and the text generated so far.

Counts continuations of every context of 1..order-1 tokens; proposes by repeatedly taking
the most frequent continuation of the longest context seen before (ties: most recent),
backing off to shorter contexts. Unlike prompt lookup it pools every occurrence of a
context, so it predicts the usual continuation rather than the latest one.
"""

from __future__ import annotations

from draftsman.proposers.base import Proposal, Proposer
from draftsman.proposers.sequence_index import SequenceIndex
from draftsman.sampling import Sampler


class ContinuationIndex(SequenceIndex):
    """context tuple -> {next token: positions where it followed that context, ascending}."""

    def __init__(self, order: int) -> None:
        super().__init__()
        self.order = order
        self.table: dict[tuple[int, ...], dict[int, list[int]]] = {}

    def _clear(self) -> None:
        self.table = {}

    def _contexts(self, t: int) -> list[tuple[int, ...]]:
        return [tuple(self.seq[t - k : t]) for k in range(1, min(self.order - 1, t) + 1)]

    def _add(self, t: int) -> None:
        nxt = self.seq[t]
        for ctx in self._contexts(t):
            self.table.setdefault(ctx, {}).setdefault(nxt, []).append(t)

    def _remove(self, t: int) -> None:
        nxt = self.seq[t]
        for ctx in self._contexts(t):
            slot = self.table[ctx]
            slot[nxt].pop()
            if not slot[nxt]:
                del slot[nxt]
                if not slot:
                    del self.table[ctx]


def _rank(item: tuple[int, list[int]]) -> tuple[int, int]:
    """(count, last position seen): most frequent first, ties to the most recent."""
    return len(item[1]), item[1][-1]


class NGramProposer(Proposer):
    name = "ngram"

    def __init__(self, order: int = 4) -> None:
        if order < 2:
            raise ValueError("an n-gram drafter needs order >= 2")
        self.order = order
        self.index = ContinuationIndex(order)

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.index.reset()

    def _next(self, seq: list[int]) -> tuple[int, int] | None:
        """(most likely next token, length of the context that predicted it)."""
        for k in range(min(self.order - 1, len(seq)), 0, -1):
            slot = self.index.table.get(tuple(seq[-k:]))
            if slot:
                return max(slot.items(), key=_rank)[0], k
        return None

    def _continue(self, seq: list[int], gamma: int) -> list[int]:
        """Up to gamma greedy guesses after seq; only its last order-1 tokens matter, so
        each lookup copies a short tail, not the whole sequence."""
        seq = seq[-(self.order - 1):]
        guess: list[int] = []
        for _ in range(gamma):
            found = self._next(seq + guess)
            if found is None:
                break
            guess.append(found[0])
        return guess

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        self.index.update(committed)
        found = self._next(committed) if gamma > 0 else None
        if found is None:
            return Proposal([], None)
        token, k = found
        guess = [token] + self._continue(committed[-self.order:] + [token], gamma - 1)
        return Proposal(guess, None, extra={"match": k})

    def propose_branches(self, committed: list[int], gamma: int, branches: int,
                         sampler: Sampler) -> list[Proposal]:
        """The `branches` most frequent next tokens after the longest known context (ties:
        most recent), each continued greedily like `propose`."""
        self.index.update(committed)
        if gamma < 1:
            return []
        for k in range(min(self.order - 1, len(committed)), 0, -1):
            slot = self.index.table.get(tuple(committed[-k:]))
            if slot:
                ranked = sorted(slot.items(), key=_rank, reverse=True)
                tail = committed[-self.order:]
                return [Proposal([t] + self._continue(tail + [t], gamma - 1), None,
                                 extra={"match": k}) for t, _ in ranked[:branches]]
        return []
