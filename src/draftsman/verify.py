"""Accept / reject rules: speculative sampling (Leviathan et al., Algorithm 1).

Given γ draft tokens x_1..x_γ, the draft's distributions q_1..q_γ and the target's
distributions p_1..p_{γ+1} at the same positions: accept x_i while u_i < p_i(x_i) / q_i(x_i);
at the first rejection draw the recovered token from norm(max(0, p_i - q_i)); if all γ are
accepted draw a bonus token from p_{γ+1}. The committed tokens are then distributed exactly
as the target's own samples. With one-hot (greedy) distributions this reduces to "keep the
drafts that equal the target's argmax, then the target's argmax".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsman.sampling import Sampler


@dataclass(frozen=True)
class Verdict:
    accepted: int  # number of draft tokens kept
    next_token: int  # recovered token (after a rejection) or bonus token (all accepted)
    rejected: bool  # True when a draft was rejected (next_token is then a recovery)


def verify_greedy(drafts: list[int], target_argmax: list[int]) -> Verdict:
    """target_argmax has len(drafts) + 1 entries: the target's choice after each prefix."""
    n = 0
    while n < len(drafts) and drafts[n] == target_argmax[n]:
        n += 1
    return Verdict(n, target_argmax[n], n < len(drafts))


def verify_sampling(
    drafts: list[int],
    q: torch.Tensor | None,
    p: torch.Tensor,
    sampler: Sampler,
) -> Verdict:
    """q [γ, V] draft probabilities (None: a deterministic drafter, q = one-hot on the draft),
    p [γ + 1, V] target probabilities."""
    gamma = len(drafts)
    if gamma:
        idx = torch.tensor(drafts)
        rows = torch.arange(gamma)
        p_x = p[rows, idx]
        q_x = q[rows, idx] if q is not None else torch.ones(gamma)
        u = sampler.uniform(gamma)
        # accept iff u < p/q, written without division: u * q < p
        rejected = (u * q_x >= p_x).nonzero()
        if rejected.numel():
            n = int(rejected[0, 0])
            if q is not None:
                residual = (p[n] - q[n]).clamp_min(0)
            else:
                residual = p[n].clone()
                residual[drafts[n]] = 0.0
            total = residual.sum()
            # total == 0 only if p == q at this position, where rejection has probability 0;
            # guard against float round-off anyway by falling back to p.
            dist = residual / total if total > 0 else p[n]
            return Verdict(n, sampler.draw(dist), True)
    return Verdict(gamma, sampler.draw(p[gamma]), False)


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted nodes, root (node 0) first
    next_token: int  # recovered token (after rejections) or bonus token (at a leaf)
    rejected: bool  # True when the last accepted node had guesses and all were refused


def verify_tree_greedy(tokens: list[int], children: list[list[int]],
                       argmax: list[int]) -> TreeVerdict:
    """Follow the child equal to the target's argmax from the root; siblings are distinct,
    so the path is unique and equals the autoregressive continuation."""
    path = [0]
    while True:
        node = path[-1]
        match = next((c for c in children[node] if tokens[c] == argmax[node]), None)
        if match is None:
            return TreeVerdict(path, argmax[node], bool(children[node]))
        path.append(match)


def verify_tree_sampling(tokens: list[int], children: list[list[int]], p: torch.Tensor,
                         sampler: Sampler) -> TreeVerdict:
    """Recursive rejection sampling over deterministic guesses (SpecInfer / SpecTr style).

    p [C, V]: the target's distribution after each node. At a node with distinct guesses
    x_1..x_m: accept x_1 with probability r(x_1) / sum(r), r = p; on rejection set r(x_1) = 0
    and try x_2 the same way; if all are refused, draw from r / sum(r). Each token x then
    comes out with probability p(x): for a guess, (1 - sum of earlier guesses' p) times
    p(x) / (1 - sum of earlier guesses' p); for any other token, the remaining mass times its
    share of it.
    """
    path = [0]
    while True:
        node = path[-1]
        residual = p[node].clone()
        for child in children[node]:
            mass = float(residual.sum())
            if float(sampler.uniform(1)[0]) * mass < float(residual[tokens[child]]):
                path.append(child)
                break
            residual[tokens[child]] = 0.0
        else:
            total = residual.sum()
            dist = residual / total if total > 0 else p[node]
            return TreeVerdict(path, sampler.draw(dist), bool(children[node]))
