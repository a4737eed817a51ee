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
    p [γ + 1, V] target probabilities.

    Everything is decided on p's device with tensor ops; the host reads the kept count and
    the next token in one transfer. The generator is used as in the per-token rule (γ
    uniforms, then one draw from the chosen distribution), so seeded draws are unchanged."""
    gamma = len(drafts)
    if not gamma:
        return Verdict(0, sampler.draw(p[0]), False)
    dev = p.device
    idx = torch.tensor(drafts, device=dev)
    rows = torch.arange(gamma, device=dev)
    p_x = p[rows, idx]
    q_x = q[rows, idx] if q is not None else torch.ones(gamma, device=dev)
    u = sampler.uniform(gamma, device=dev)
    # accept iff u < p/q, written without division: u * q < p; n = first rejection or γ
    rejects = torch.cat([u * q_x >= p_x, torch.ones(1, dtype=torch.bool, device=dev)])
    n = rejects.to(torch.uint8).argmax()
    p_n = p[n]
    row = n.clamp_max(gamma - 1)  # q has γ rows; row γ (no rejection) ignores it below
    residual = ((p_n - q[row]).clamp_min(0) if q is not None
                else p_n.scatter(0, idx[row][None], 0.0))  # one-hot q: p less the draft
    total = residual.sum()
    # total == 0 only if p == q at this position, where rejection has probability 0;
    # guard against float round-off anyway by falling back to p.
    recovered = torch.where(total > 0, residual / total, p_n)
    dist = torch.where(n < gamma, recovered, p_n)  # all accepted: the bonus token from p_γ
    token = sampler.draw_tensor(dist)
    kept, next_token = torch.stack([n, token]).tolist()
    return Verdict(kept, next_token, kept < gamma)
