"""The hardware-aware dynamic sparse tree (Chen et al., section 4).

Notation. acc[d][r] is the measured probability that the r-th ranked guess of prompt token
d + 1 is the token the target chooses at distance d + 1 (validation set). Under the
independence assumption a candidate node v = (r_1..r_d) is accepted with probability

    p(v) = prod_i acc[i - 1][r_i]                                        (Prop. 4.1)

and a tree of candidates C yields f(C) = 1 + sum_{v in C, v != root} p(v) tokens per step
(the 1 is the target's own token after the accepted path). The tree has one state T_k per
k = 0..m, k = prompt tokens carried by the last accepted node = guesses available, so C(T_k)
has depth <= k. The probability that node c ends the accepted path is

    e(c) = p(c) - sum_{children c'} p(c'),

hence the transition p(s_i | s_k) = sum_{c in T_k carrying i prompt tokens} e(c), and the
amortised tokens per step is R(T) = sum_k pi_k f(T_k) with pi the chain's stationary law
(Prop. 4.4). Removing one prompt token from a node c that carries i of them changes the
two-step objective F (Prop. 4.2) by

    ΔF(c) = e(c) (f(T_i) - f(T_{i-1}))                                    (Prop. 4.3)

(the paper writes p(c); the transition needs the end-of-path probability e(c), which is what
we use; f(T_0) = 1). Construction for a forward of n rows with n_e EPTs per prompt token:
for each candidate count n_c, (1) the optimal candidate tree per depth bound k (best-first by
p(v), Medusa/Sequoia), (2) m prompt tokens on every node, (3) greedy removal of the prompt
token with the smallest ΔF until 1 + n_c + n_e * (prompt tokens) <= n; keep the n_c with the
largest R. Hardware awareness (section 4.2): with L_fp(n) the measured latency of a forward
over n new rows, choose n maximising τ(n) / L_fp(n), τ(n) = R of the best tree of size n.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from draftsman.profiling import interpolate
from draftsman.trees.layout import TreeSpec

# A conservative prior for untrained/uncalibrated prompt tokens: rank-r accuracy at distance
# d+1 (roughly the shape of the paper's Figure 6, scaled down). Replaced by measurements.
PRIOR_ACCURACY = [
    [0.40, 0.10, 0.05, 0.03, 0.02, 0.015, 0.01, 0.01],
    [0.20, 0.07, 0.04, 0.02, 0.015, 0.01, 0.01, 0.005],
    [0.12, 0.05, 0.03, 0.02, 0.01, 0.01, 0.005, 0.005],
]
KINDS = ("dynamic", "static", "random")


def path_probability(path: Sequence[int], acc: Sequence[Sequence[float]]) -> float:
    p = 1.0
    for d, r in enumerate(path):
        p *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
    return p


def optimal_candidates(acc: Sequence[Sequence[float]], count: int, max_depth: int
                       ) -> list[tuple[tuple[int, ...], float]]:
    """The `count` non-root nodes of depth <= max_depth with the largest p(v), parents first.

    Best-first: p(child) <= p(parent), so expanding the frontier in order of p keeps the set
    a tree and maximises f (Prop. 4.1) for every count.
    """
    out: list[tuple[tuple[int, ...], float]] = []
    frontier: list[tuple[float, tuple[int, ...]]] = []

    def push_children(path: tuple[int, ...], p: float) -> None:
        d = len(path)
        if d < max_depth and d < len(acc):
            for r, a in enumerate(acc[d]):
                if a > 0:
                    heapq.heappush(frontier, (-p * a, path + (r,)))

    push_children((), 1.0)
    while frontier and len(out) < count:
        neg, path = heapq.heappop(frontier)
        out.append((path, -neg))
        push_children(path, -neg)
    return out


def tree_value(paths: Sequence[tuple[int, ...]], acc: Sequence[Sequence[float]]) -> float:
    """f(C) = 1 + sum of p(v) over the non-root candidates."""
    return 1.0 + sum(path_probability(p, acc) for p in paths if p)


def end_probabilities(paths: Sequence[tuple[int, ...]], acc: Sequence[Sequence[float]]
                      ) -> list[float]:
    """e(c) = p(c) - sum of p over c's children: the chance that c ends the accepted path."""
    prob = {p: path_probability(p, acc) for p in paths}
    e = dict(prob)
    for p in paths:
        if p:
            e[p[:-1]] -= prob[p]
    return [max(0.0, e[p]) for p in paths]


def allocate_prompts(paths: Sequence[tuple[int, ...]], acc: Sequence[Sequence[float]],
                     f: Sequence[float], m: int, budget: int) -> list[int]:
    """Start from m prompt tokens on every node; remove greedily by smallest ΔF (Prop. 4.3)
    until at most `budget` remain. f[i] = f(T_i) for i = 0..m (f[0] = 1)."""
    e = end_probabilities(paths, acc)
    counts = [m] * len(paths)
    total = m * len(paths)
    heap = [(e[j] * (f[m] - f[m - 1]), j) for j in range(len(paths))] if m else []
    heapq.heapify(heap)
    while total > budget and heap:
        _, j = heapq.heappop(heap)
        counts[j] -= 1
        total -= 1
        i = counts[j]
        if i > 0:
            heapq.heappush(heap, (e[j] * (f[i] - f[i - 1]), j))
    return counts


def stationary(transition: Sequence[Sequence[float]], iters: int = 500) -> list[float]:
    """Stationary distribution of a row-stochastic matrix by power iteration."""
    n = len(transition)
    pi = [1.0 / n] * n
    for _ in range(iters):
        nxt = [sum(pi[k] * transition[k][i] for k in range(n)) for i in range(n)]
        s = sum(nxt) or 1.0
        nxt = [x / s for x in nxt]
        if max(abs(a - b) for a, b in zip(nxt, pi, strict=True)) < 1e-12:
            return nxt
        pi = nxt
    return pi


@dataclass
class TreeSet:
    """One tree per state 0..m and the predicted tokens per step τ = R(T)."""

    kind: str
    rows: int  # size budget n: rows of one forward (root + candidates + prompt rows)
    states: dict[int, TreeSpec]
    tau: float

    def to_json(self) -> dict:
        return {"kind": self.kind, "rows": self.rows, "tau": self.tau,
                "states": {str(k): s.to_json() for k, s in self.states.items()}}

    @classmethod
    def from_json(cls, d: dict) -> TreeSet:
        return cls(d["kind"], int(d["rows"]),
                   {int(k): TreeSpec.from_json(v) for k, v in d["states"].items()},
                   float(d["tau"]))


def amortised_tokens(states: dict[int, TreeSpec], acc: Sequence[Sequence[float]], m: int
                     ) -> float:
    """R(T) = sum_k pi_k f(T_k) for the Markov chain of states (Prop. 4.4)."""
    f = [tree_value(states[k].paths, acc) for k in range(m + 1)]
    transition = []
    for k in range(m + 1):
        spec = states[k]
        row = [0.0] * (m + 1)
        for e, i in zip(end_probabilities(spec.paths, acc), spec.prompts, strict=True):
            row[i] += e
        s = sum(row)
        transition.append([x / s for x in row] if s > 0 else [1.0 if i == k else 0.0
                                                              for i in range(m + 1)])
    pi = stationary(transition)
    return sum(p * v for p, v in zip(pi, f, strict=True))


def dynamic_trees(acc: Sequence[Sequence[float]], m: int, rows: int, epts: int = 1) -> TreeSet:
    """The best dynamic sparse tree with at most `rows` rows per forward (module docstring)."""
    if rows < 1:
        raise ValueError("a tree needs at least the root row")
    best: TreeSet | None = None
    for nc in range(0, rows):
        cands = {k: [p for p, _ in optimal_candidates(acc, nc, k)] for k in range(m + 1)}
        f = [tree_value(cands[k], acc) for k in range(m + 1)]
        states = {}
        for k in range(m + 1):
            paths = [()] + cands[k]
            budget = (rows - len(paths)) // epts
            if budget < 0:
                break
            counts = allocate_prompts(paths, acc, f, m, budget)
            states[k] = TreeSpec.build(zip(paths, counts, strict=True))
        if len(states) < m + 1:
            break
        tau = amortised_tokens(states, acc, m)
        if best is None or tau > best.tau + 1e-12:
            best = TreeSet("dynamic", rows, states, tau)
    assert best is not None
    return best


def trim(spec: TreeSpec, depth: int) -> TreeSpec:
    """Drop the nodes deeper than `depth`."""
    return TreeSpec.build((p, k) for p, k in zip(spec.paths, spec.prompts, strict=True)
                          if len(p) <= depth)


def _uniform_states(paths: list[tuple[int, ...]], prompts: list[int], m: int
                    ) -> dict[int, TreeSpec]:
    spec = TreeSpec.build(zip(paths, prompts, strict=True))
    return {k: trim(spec, k) for k in range(m + 1)}


def static_trees(acc: Sequence[Sequence[float]], m: int, rows: int, epts: int = 1) -> TreeSet:
    """One sparse tree where every node carries the most prompt tokens that fit (the paper's
    static baseline, Figure 8a): j prompt tokens per node, j = m when possible."""
    for j in range(m, 0, -1):
        nc = rows // (1 + j * epts) - 1
        if nc >= 0:
            paths = [()] + [p for p, _ in optimal_candidates(acc, nc, j)]
            states = _uniform_states(paths, [j] * len(paths), m)
            return TreeSet("static", rows, states, amortised_tokens(states, acc, m))
    states = _uniform_states([()], [0], m)
    return TreeSet("static", rows, states, 1.0)


def random_trees(acc: Sequence[Sequence[float]], m: int, rows: int, epts: int = 1,
                 topk: int = 8, seed: int = 0) -> TreeSet:
    """A random tree of the same size: random candidate shape (depth <= m, ranks < topk),
    random prompt allocation (>= 1 per node when the budget allows)."""
    rng = random.Random(seed)
    nc = rng.randint(0, max(0, (rows - 1) // (1 + epts) - 1)) if m else 0
    paths: list[tuple[int, ...]] = [()]
    while len(paths) - 1 < nc:
        parent = rng.choice([p for p in paths if len(p) < m])
        used = {p[-1] for p in paths if len(p) == len(parent) + 1 and p[:-1] == parent}
        free = [r for r in range(topk) if r not in used]
        if free:
            paths.append(parent + (rng.choice(free),))
    budget = (rows - len(paths)) // epts
    prompts = [0] * len(paths)
    order = list(range(len(paths)))
    rng.shuffle(order)
    for j in order:  # at least one each, while the budget lasts
        if budget > 0 and m:
            prompts[j], budget = 1, budget - 1
    while budget > 0 and any(k < m for k in prompts):
        j = rng.choice([i for i, k in enumerate(prompts) if k < m])
        prompts[j] += 1
        budget -= 1
    states = _uniform_states(paths, prompts, m)
    return TreeSet("random", rows, states, amortised_tokens(states, acc, m))


def make_trees(kind: str, acc: Sequence[Sequence[float]], m: int, rows: int, epts: int = 1,
               seed: int = 0) -> TreeSet:
    if kind == "dynamic":
        return dynamic_trees(acc, m, rows, epts)
    if kind == "static":
        return static_trees(acc, m, rows, epts)
    if kind == "random":
        return random_trees(acc, m, rows, epts, topk=max(len(a) for a in acc), seed=seed)
    raise ValueError(f"unknown tree kind {kind!r}; choose from {', '.join(KINDS)}")


def build_tree_table(acc: Sequence[Sequence[float]], m: int, epts: int,
                     sizes: Sequence[int]) -> dict:
    """trees.json content: accuracies and the dynamic/static trees for every size."""
    table: dict = {"accuracy": [list(map(float, a)) for a in acc], "m": m, "epts": epts}
    for kind in ("dynamic", "static"):
        table[kind] = {str(n): make_trees(kind, acc, m, n, epts).to_json() for n in sizes}
    return table


# ----------------------------------------------------------------------------- hardware


def predicted_speedups(tau: dict[int, float], latency: dict[int, float]) -> dict[int, float]:
    """Speedup(n) = τ(n) L_fp(1) / L_fp(n) over autoregressive decoding (section 4.2)."""
    base = interpolate(latency, 1)
    return {n: t * base / interpolate(latency, n) for n, t in tau.items()}


def choose_size(tau: dict[int, float], latency: dict[int, float]) -> int:
    """argmax_n τ(n) / L_fp(n)."""
    speed = predicted_speedups(tau, latency)
    return max(speed, key=lambda n: (speed[n], -n))


