"""Prompt lookup: copy what followed the latest earlier occurrence of the last tokens.

Free to run (no model), strong when the output quotes the input (code edits, summaries,
multi-turn chat). Tries the longest suffix first, from `max_ngram` down to `min_ngram`.
"""

from __future__ import annotations

from collections.abc import Iterator

from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler


class PromptLookupProposer(Proposer):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("prompt lookup needs 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def _matches(self, committed: list[int], gamma: int) -> Iterator[Proposal]:
        """Continuations of earlier occurrences of the last tokens: longest match first,
        and among equally long ones the latest first (recent context predicts best)."""
        end = len(committed)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            suffix = committed[end - n :]
            first = suffix[0]
            for i in range(end - n - 1, -1, -1):
                if committed[i] == first and committed[i : i + n] == suffix:
                    guess = committed[i + n : i + n + gamma]
                    if guess:
                        yield Proposal(guess, None, extra={"match": n})

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
