"""Suffix drafting: continue the longest suffix seen before, in this sequence or the history.

Like SuffixDecoding (Oliaro et al. 2024) and llama.cpp's n-gram caches, the drafter looks
for earlier occurrences of the sequence's last tokens -- in the prompt and text generated so
far, and in a read-only `Scope` of the same client's earlier prompts and replies -- and
guesses what followed them.

- Finding the match: anchors of 8 and 2 tokens are indexed (hash of the n tokens -> the
  positions that followed them). The longest anchor with hits gives candidates (the newest
  `scan` per source), each extended backwards token by token up to `max_match` = 32: enough
  to tell a copied passage from a common phrase (a 32-token agreement is already a copy;
  longer comparisons cost time every step and change no decision). Only the occurrences of
  the longest match are kept.
- Scoring: their continuations form a prefix tree whose nodes count how many occurrences
  agree; a token's share is its count over its parent's. The first branch follows the most
  supported child at each node (ties: the most recent occurrence); further branches start
  where the best unused child has the highest path share (product of shares), so branches
  share prefixes and the verify tree stays small. A branch stops where its path share falls
  below `min_share`.
- For the cost-model γ controller the proposal's `extra` carries `match` (the match length,
  capped at 16 so the controller learns acceptance per length from enough steps), the exact
  `match_length`, `support` (occurrences) and `confidence` (the first branch's path share).

The live index is kept in step with the sequence (sequence_index.py): a rollback costs the
rolled-back tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsman.proposers.base import Proposal, Proposer
from draftsman.proposers.history import ANCHORS, SEPARATOR, Scope, anchor_key
from draftsman.proposers.sequence_index import SequenceIndex
from draftsman.sampling import Sampler

KEY_CAP = 16


class AnchorIndex(SequenceIndex):
    """For each anchor length n: hash of seq[f-n:f] -> positions f, ascending."""

    def __init__(self) -> None:
        super().__init__()
        self.index: list[dict[int, list[int]]] = [{} for _ in ANCHORS]

    def _clear(self) -> None:
        self.index = [{} for _ in ANCHORS]

    def _add(self, f: int) -> None:
        for level, n in enumerate(ANCHORS):
            if f >= n:
                self.index[level].setdefault(anchor_key(self.seq, f, n), []).append(f)

    def _remove(self, f: int) -> None:
        for level, n in enumerate(ANCHORS):
            if f >= n:
                key = anchor_key(self.seq, f, n)
                positions = self.index[level][key]
                positions.pop()
                if not positions:
                    del self.index[level][key]

    def followers(self, level: int, key: int, limit: int) -> list[int]:
        return self.index[level].get(key, [])[-limit:][::-1]

    def window(self, start: int, stop: int) -> list[int]:
        return self.seq[max(start, 0) : stop]


@dataclass
class _Node:
    count: int = 0
    recency: int = 1 << 30  # rank of the newest occurrence through it (lower: newer)
    children: dict[int, _Node] = field(default_factory=dict)

    def ranked(self) -> list[tuple[int, _Node]]:
        return sorted(self.children.items(), key=lambda kv: (-kv[1].count, kv[1].recency))


@dataclass
class Match:
    length: int
    continuations: list[list[int]]  # newest first


class SuffixProposer(Proposer):
    name = "suffix"
    uses_history = True

    def __init__(self, max_match: int = 32, scan: int = 64, min_share: float = 0.1) -> None:
        if max_match < ANCHORS[-1]:
            raise ValueError(f"suffix drafting needs max_match >= {ANCHORS[-1]}")
        self.max_match, self.scan, self.min_share = max_match, scan, min_share
        self.index = AnchorIndex()
        self.history: Scope | None = None

    def use_history(self, history: Scope | None) -> None:
        self.history = history

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.index.reset()

    # ---- matching ------------------------------------------------------------------------
    def match(self, committed: list[int], depth: int) -> Match | None:
        """The occurrences of the longest suffix of `committed` seen before (at least the
        shortest anchor), with up to `depth` tokens of what followed each."""
        self.index.update(committed)
        sources = [self.index] if self.history is None else [self.index, self.history]
        tail = committed[-self.max_match :]
        for level, n in enumerate(ANCHORS):
            if len(committed) < n:
                continue
            key = anchor_key(committed, len(committed), n)
            found: list[tuple[int, list[int]]] = []
            for source in sources:
                for f in source.followers(level, key, self.scan):
                    before = source.window(f - len(tail), f)
                    length = _agreement(before, tail)
                    if length >= n:
                        found.append((length, source.window(f, f + depth)))
            if found:
                best = max(length for length, _ in found)
                conts = [_cut(c) for length, c in found if length == best]
                return Match(best, [c for c in conts if c])
        return None

    def _tree(self, match: Match) -> _Node:
        root = _Node()
        for rank, cont in enumerate(match.continuations):
            node = root
            node.count += 1
            for token in cont:
                node = node.children.setdefault(token, _Node())
                node.count += 1
                node.recency = min(node.recency, rank)
        return root

    def _branches(self, root: _Node, branches: int) -> list[tuple[list[int], float]]:
        """Up to `branches` paths through the tree, best first, with their path shares.
        Each starts at the divergence point whose best unused child has the highest path
        share and follows the most supported unused child from there."""
        out: list[tuple[list[int], float]] = []
        taken: set[int] = set()  # id() of the nodes already on a branch
        # divergence points: (path share of their best unused child, share there, path, node)
        frontier: list[tuple[float, float, list[int], _Node]] = [(1.0, 1.0, [], root)]
        while frontier and len(out) < branches:
            frontier.sort(key=lambda item: -item[0])
            _, share, path, node = frontier.pop(0)
            path, grown = list(path), len(path)
            while True:
                options = [(t, c) for t, c in node.ranked() if id(c) not in taken]
                if not options or share * options[0][1].count / node.count < self.min_share:
                    break
                token, child = options[0]
                if len(options) > 1:  # the next best sibling may start a later branch
                    frontier.append((share * options[1][1].count / node.count, share,
                                     list(path), node))
                taken.add(id(child))
                path.append(token)
                share, node = share * child.count / node.count, child
            if len(path) > grown:
                out.append((path, share))
        return out

    def _proposals(self, committed: list[int], gamma: int, branches: int) -> list[Proposal]:
        if gamma < 1:
            self.index.update(committed)
            return []
        found = self.match(committed, gamma)
        if found is None or not found.continuations:
            return []
        extra = {"match": min(found.length, KEY_CAP), "match_length": found.length,
                 "support": len(found.continuations)}
        paths = self._branches(self._tree(found), branches)
        return [Proposal(path, None, extra={**extra, "confidence": round(share, 4)})
                for path, share in paths]

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        proposals = self._proposals(committed, gamma, 1)
        return proposals[0] if proposals else Proposal([], None)

    def propose_branches(self, committed: list[int], gamma: int, branches: int,
                         sampler: Sampler) -> list[Proposal]:
        return self._proposals(committed, gamma, branches)


def _agreement(before: list[int], tail: list[int]) -> int:
    """How many trailing tokens the two lists share."""
    n = 0
    for a, b in zip(reversed(before), reversed(tail), strict=False):
        if a != b:
            break
        n += 1
    return n


def _cut(tokens: list[int]) -> list[int]:
    """A history window up to (not including) the end of its sequence."""
    return tokens[: tokens.index(SEPARATOR)] if SEPARATOR in tokens else tokens
