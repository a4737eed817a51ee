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
        idx = torch.tensor(drafts, device=p.device)
        rows = torch.arange(gamma, device=p.device)
        p_x = p[rows, idx]
        q_x = q[rows, idx] if q is not None else torch.ones(gamma, device=p.device)
        u = sampler.uniform(gamma, device=p.device)
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


