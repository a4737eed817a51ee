"""How many draft branches a tree verify should carry.

- fixed k:  always the first k branches the drafter offers.
- auto:     a cost model. Every few steps ("probes") the verify carries all K branches, and
            for each k <= K it records what the first k branches would have earned: the
            tokens committed, 1 + the longest accepted run among them (greedy matching
            against the target's argmax, also used as the estimate when sampling), and the
            rows they cost, 1 + the trie's nodes (+ the accepted nodes a backend without
            in-place path compaction must feed again next step). Between probes it verifies
            k* = argmax E[tokens] / v(E[rows]), with v the measured verify cost curve.
            On hardware where a forward over n tokens costs ~n times one token, k* = 1:
            a second branch only pays when extra rows are nearly free. Probes are not
            free either, so each probe that confirms k* = 1 doubles the wait until the
            next one (up to `max_wait` steps).
"""

from __future__ import annotations

from draftsman.profiling import interpolate
from draftsman.trees.draft_tree import DraftTree


class BranchPlanner:
    def __init__(self, branches: int | None = 1, max_branches: int = 4,
                 verify_cost: dict[int, float] | None = None, refeed: bool = False,
                 probe_every: int = 8, warmup: int = 2, memory: float = 0.9,
                 max_wait: int = 128) -> None:
        """branches: a fixed count, or None for auto (up to max_branches)."""
        self.fixed = branches
        self.max_branches = branches or max_branches
        self.verify_cost = verify_cost or {}
        self.refeed = refeed
        self.probe_every, self.warmup, self.memory = probe_every, warmup, memory
        self.max_wait = max_wait
        self.wait = probe_every  # steps between probes
        self.since = 0  # steps since the last probe
        k = self.max_branches
        self.gain = [0.0] * (k + 1)  # discounted sums over probes, index k = first k branches
        self.rows = [0.0] * (k + 1)
        self.weight = 0.0
        self.steps = 0
        self.choice = 1

    @property
    def auto(self) -> bool:
        return self.fixed is None

    def next_branches(self) -> int:
        if not self.auto:
            return self.max_branches
        self.steps += 1
        self.since += 1
        if self.steps <= self.warmup or self.since >= self.wait:
            self.since = 0
            return self.max_branches
        return self.choice

    def _cost(self, rows: float) -> float:
        curve = self.verify_cost
        if not curve:
            return rows  # no measurement: assume every row costs a forward
        lo = int(rows)
        w = rows - lo
        return (1 - w) * interpolate(curve, max(lo, 1)) + w * interpolate(curve, lo + 1)

    def update(self, tree: DraftTree, argmax: list[int], requested: int) -> None:
        """After a verify of `requested` branches; learns only from probes (all K asked)
        where the drafter had more than one branch to offer."""
        if not self.auto or requested < self.max_branches or len(tree.leaves) < 2:
            return
        lengths = tree.branch_lengths(argmax)
        m = self.memory
        self.weight = m * self.weight + 1
        for k in range(1, self.max_branches + 1):
            first = lengths[:k]
            best = max(first)
            rows = 1 + tree.nodes_of_first(k)
            if self.refeed and best:
                path = tree.path_to(tree.leaves[first.index(best)])[: best + 1]
                rows += len(path) - DraftTree.contiguous(path)
            self.gain[k] = m * self.gain[k] + 1 + best
            self.rows[k] = m * self.rows[k] + rows
        self.choice = max(range(1, self.max_branches + 1), key=self.rate)
        self.wait = min(2 * self.wait, self.max_wait) if self.choice == 1 else self.probe_every

    def rate(self, k: int) -> float:
        """Expected tokens per unit of one-token forward time with the first k branches."""
        if not self.weight:
            return 0.0
        return (self.gain[k] / self.weight) / self._cost(self.rows[k] / self.weight)
