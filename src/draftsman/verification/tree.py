"""Accept rules over a tree of candidates: greedy matching along the target's argmax,
recursive rejection sampling over the distinct guesses at each node (exact), and Medusa's
typical acceptance (lossy)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from draftsman.sampling import Sampler
from draftsman.trees.layout import TreeLayout


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted nodes, root (node 0) first
    next_token: int  # recovered token (after rejections) or bonus token (at a leaf)
    rejected: bool  # True when the last accepted node had guesses and all were refused
    siblings_tried: int = 0  # guesses tried after a refused sibling at the same node


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
    siblings = 0
    while True:
        node = path[-1]
        residual = p[node].clone()
        for i, child in enumerate(children[node]):
            siblings += i > 0
            mass = float(residual.sum())
            if float(sampler.uniform(1)[0]) * mass < float(residual[tokens[child]]):
                path.append(child)
                break
            residual[tokens[child]] = 0.0
        else:
            total = residual.sum()
            dist = residual / total if total > 0 else p[node]
            return TreeVerdict(path, sampler.draw(dist), bool(children[node]), siblings)


def accept_greedy(lay: TreeLayout, tokens: torch.Tensor, argmax: torch.Tensor) -> int:
    """Deepest node whose whole path matches the target's argmax; returns its node index.

    tokens [C] candidate ids, argmax [C] the target's choice after each node. A node is
    correct iff its token equals the argmax at its parent; siblings hold distinct guesses,
    so at most one child of a node is correct and the accepted path is unique.
    """
    return int(greedy_end(lay, tokens, argmax))


def greedy_end(lay: TreeLayout, tokens: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """accept_greedy's node as a 0-d tensor on the tensors' device (no host sync); `lay`
    must live there too."""
    ok = tokens == argmax[lay.parent]
    ok[0] = True
    path_ok = ok[lay.ancestors].all(-1)  # [C]
    score = torch.where(path_ok, lay.depth, -1)
    return score.argmax()


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance (lossy): keep candidate x after node u iff
    p_u(x) > min(threshold, alpha * exp(-H(p_u))), with p_u the target's tempered
    distribution at u and H its entropy. Defaults are Medusa's (0.09, 0.3)."""

    threshold: float = 0.09
    alpha: float = 0.3


def accept_typical(lay: TreeLayout, tokens: torch.Tensor, probs: torch.Tensor,
                   rule: TypicalAcceptance) -> int:
    """Deepest node whose path passes the typical-acceptance test; ties: the higher path
    probability. probs [C, V] are the target's distributions after each node."""
    p_tok = probs[lay.parent, tokens]  # [C] probability of each candidate at its parent
    entropy = -(probs * torch.log(probs.clamp_min(1e-10))).sum(-1)  # [C]
    cut = torch.clamp(rule.alpha * torch.exp(-entropy), max=rule.threshold)
    ok = p_tok > cut[lay.parent]
    ok[0] = True
    path_ok = ok[lay.ancestors].all(-1)
    logp = torch.log(p_tok.clamp_min(1e-30))
    logp[0] = 0.0
    path_logp = logp[lay.ancestors].sum(-1) - logp * (lay.ancestors.shape[1] - 1 - lay.depth)
    score = torch.where(path_ok, lay.depth.double() * 1e6 + path_logp.double(), -math.inf)
    return int(score.argmax())

