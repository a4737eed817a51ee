"""An n-gram model of the prompt and the text generated so far.

Counts continuations of every context of 1..order-1 tokens; proposes by repeatedly taking
the most frequent continuation of the longest context seen before (ties: most recent),
backing off to shorter contexts. Unlike prompt lookup it pools every occurrence of a
context, so it predicts the usual continuation rather than the latest one.
"""

from __future__ import annotations

from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler


class NGramProposer(Proposer):
    name = "ngram"

    def __init__(self, order: int = 4) -> None:
        if order < 2:
            raise ValueError("an n-gram drafter needs order >= 2")
        self.order = order
        # context tuple -> {next token: (count, last position seen)}
        self.table: dict[tuple[int, ...], dict[int, tuple[int, int]]] = {}
        self.indexed: list[int] = []

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.table = {}
        self.indexed = []

    def _index(self, committed: list[int]) -> None:
        # the committed sequence only grows between steps of one request
        start = len(self.indexed)
        for t in range(max(start, 1), len(committed)):
            nxt = committed[t]
            for k in range(1, self.order):
                if t - k < 0:
                    break
                ctx = tuple(committed[t - k : t])
                slot = self.table.setdefault(ctx, {})
                count, _ = slot.get(nxt, (0, 0))
                slot[nxt] = (count + 1, t)
        self.indexed = list(committed)

    def _next(self, seq: list[int]) -> tuple[int, int] | None:
        """(most likely next token, length of the context that predicted it)."""
        for k in range(min(self.order - 1, len(seq)), 0, -1):
            slot = self.table.get(tuple(seq[-k:]))
            if slot:
                return max(slot.items(), key=lambda item: item[1])[0], k
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

    def _refresh(self, committed: list[int]) -> None:
        if len(self.indexed) > len(committed) or self.indexed != committed[: len(self.indexed)]:
            self.start(committed, 0)  # a different sequence: rebuild
        self._index(committed)

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        self._refresh(committed)
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
        self._refresh(committed)
        if gamma < 1:
            return []
        for k in range(min(self.order - 1, len(committed)), 0, -1):
            slot = self.table.get(tuple(committed[-k:]))
            if slot:
                ranked = sorted(slot.items(), key=lambda item: item[1], reverse=True)
                tail = committed[-self.order:]
                return [Proposal([t] + self._continue(tail + [t], gamma - 1), None,
                                 extra={"match": k}) for t, _ in ranked[:branches]]
        return []
