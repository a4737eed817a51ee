"""Prompt lookup: copy what followed the latest earlier occurrence of the last tokens.

Free to run (no model), strong when the output quotes the input (code edits, summaries,
multi-turn chat). Tries the longest suffix first, from `max_ngram` down to `min_ngram`.
The earlier occurrences come from an index kept in step with the sequence, not a rescan.
"""

from __future__ import annotations

from collections.abc import Iterator

from draftsman.proposers.base import Proposal, Proposer
from draftsman.proposers.sequence_index import SequenceIndex
from draftsman.sampling import Sampler


class FollowerIndex(SequenceIndex):
    """n-gram tuple (n = 1..max_n) -> positions of the token right after each occurrence,
    ascending; an occurrence is indexed once a token follows it."""

    def __init__(self, max_n: int) -> None:
        super().__init__()
        self.max_n = max_n
        self.after: dict[tuple[int, ...], list[int]] = {}

    def _clear(self) -> None:
        self.after = {}

    def _grams(self, t: int) -> list[tuple[int, ...]]:
        return [tuple(self.seq[t - n : t]) for n in range(1, min(self.max_n, t) + 1)]

    def _add(self, t: int) -> None:
        for gram in self._grams(t):
            self.after.setdefault(gram, []).append(t)

    def _remove(self, t: int) -> None:
        for gram in self._grams(t):
            positions = self.after[gram]
            positions.pop()
            if not positions:
                del self.after[gram]


class PromptLookupProposer(Proposer):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("prompt lookup needs 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.index = FollowerIndex(max_ngram)

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.index.reset()

    def _matches(self, committed: list[int], gamma: int) -> Iterator[Proposal]:
        """Continuations of earlier occurrences of the last tokens: longest match first,
        and among equally long ones the latest first (recent context predicts best)."""
        self.index.update(committed)
        end = len(committed)
        if gamma < 1:
            return
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            for t in reversed(self.index.after.get(tuple(committed[end - n :]), ())):
                yield Proposal(committed[t : t + gamma], None, extra={"match": n})

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        return next(self._matches(committed, gamma), Proposal([], None))

    def propose_branches(self, committed: list[int], gamma: int, branches: int,
                         sampler: Sampler) -> list[Proposal]:
        """The first `branches` matches whose continuations differ in their first guess
        (continuations sharing it would mostly share the same tree nodes)."""
        out: list[Proposal] = []
        firsts: set[int] = set()
        for proposal in self._matches(committed, gamma):
            if proposal.tokens[0] not in firsts:
                firsts.add(proposal.tokens[0])
                out.append(proposal)
                if len(out) == branches:
                    break
        return out
