"""Analytic models beside the measurements.

Speculative decoding (Leviathan, Kalman, Matias 2023, section 3), with α the per-guess
acceptance probability, γ guesses per step and c the cost of a draft forward relative to a
target forward:

    E[tokens per step]       = (1 - α^(γ+1)) / (1 - α)                  (eq. 1)
    E[walltime improvement]  = (1 - α^(γ+1)) / ((1 - α)(γc + 1))         (Theorem 3.8)

Any speedup needs α > c (Corollary 3.9). α for a draft q against a target p is
Σ_x min(p(x), q(x)) = 1 - TV(p, q) (Definition 3.2 / Corollary 3.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Walltime improvement over the target alone (Theorem 3.8)."""
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1.0)


def expected_speedup_with_verify_cost(
    alpha: float, gamma: int, draft_cost: float, verify_cost: float
) -> float:
    """Generalisation for hardware where verifying γ+1 tokens costs `verify_cost` target
    one-token forwards (≈ 1 on memory-bound GPUs and bf16 CPUs, larger on quantised CPU
    kernels): tokens per step / (γ·c + verify_cost)."""
    return expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost + verify_cost)


def optimal_gamma(alpha: float, cost_ratio: float, max_gamma: int = 32) -> int:
    """Integer γ >= 1 maximising expected_speedup; returns 0 if no γ beats the target alone."""
    best_gamma, best = 0, 1.0
    for gamma in range(1, max_gamma + 1):
        s = expected_speedup(alpha, gamma, cost_ratio)
        if s > best + 1e-12:
            best_gamma, best = gamma, s
    return best_gamma


def optimal_gamma_with_verify_cost(alpha: float, draft_cost: float,
                                   verify_cost: Callable[[int], float],
                                   max_gamma: int = 32) -> tuple[int, float]:
    """(γ, speedup) maximising `expected_speedup_with_verify_cost` when verifying n tokens
    costs `verify_cost(n)` one-token target forwards (a measured curve); (0, 1.0) when no
    γ beats the target alone."""
    best_gamma, best = 0, 1.0
    for gamma in range(1, max_gamma + 1):
        s = expected_speedup_with_verify_cost(alpha, gamma, draft_cost, verify_cost(gamma + 1))
        if s > best + 1e-12:
            best_gamma, best = gamma, s
    return best_gamma, best


def speedup_possible(alpha: float, cost_ratio: float) -> bool:
    """Corollary 3.9: some γ gives a speedup iff α > c."""
    return alpha > cost_ratio


def oracle_speedup(alpha: float, cost_ratio: float) -> float:
    """Section 3.5's bound: an oracle picks each step's γ as the number of guesses the
    target will accept, n ~ Geometric (P(n) = α^n (1 - α)), so no draft is wasted:
    E[n + 1] / (E[n]·c + 1) = 1 / (1 - α + α·c)."""
    return 1.0 / (1.0 - alpha + alpha * cost_ratio)


def oracle_speedup_from_runs(accepted_runs: list[int], cost_ratio: float) -> float:
    """The same bound on observed data: `accepted_runs` are how many consecutive guesses the
    target accepted before each mismatch; an oracle drafts exactly those n (cost n·c + 1
    target forwards) and commits n + 1 tokens."""
    if not accepted_runs:
        return 1.0
    tokens = sum(n + 1 for n in accepted_runs)
    cost = sum(n * cost_ratio + 1.0 for n in accepted_runs)
    return tokens / cost


def is_finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
