"""An index over a token sequence kept in step with it at the cost of the tokens that changed.

Drafters without a model (n-gram, prompt lookup) look up what followed earlier occurrences of
the last tokens. Rebuilding or rescanning per step costs O(sequence); here each call finds how
much of the indexed sequence is still the caller's (the longest common prefix: one C-level
list comparison when the sequence only grew), removes the positions past it newest first and
adds the new ones. A rollback (speculative rejection, a staged sub-draft replaced) therefore
costs the rolled-back tokens, not a rebuild.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix; C-level comparisons, O(log n) of them at most."""
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == b[:n]:  # the usual case: b only grew
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SequenceIndex(ABC):
    """Positions of a sequence, indexed one position at a time.

    Invariant: after `update(seq)`, the index holds exactly the positions 0..len(seq)-1 of
    `seq`, as if built from scratch.
    """

    def __init__(self) -> None:
        self.seq: list[int] = []

    def reset(self) -> None:
        self.seq = []
        self._clear()

    def update(self, seq: list[int]) -> None:
        keep = common_prefix(self.seq, seq)
        for p in range(len(self.seq) - 1, keep - 1, -1):
            self._remove(p)
        del self.seq[keep:]
        for p in range(keep, len(seq)):
            self.seq.append(seq[p])
            self._add(p)

    @abstractmethod
    def _clear(self) -> None: ...

    @abstractmethod
    def _add(self, p: int) -> None:
        """Index position p; self.seq[: p + 1] is the sequence so far."""

    @abstractmethod
    def _remove(self, p: int) -> None:
        """Undo `_add(p)`; p is the newest indexed position."""
