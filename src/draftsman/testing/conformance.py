"""Distribution-exactness checks for decoding strategies, with measured path coverage.

A strategy is exact under sampling when the tokens it commits are distributed as the
target's own samples. `check_exact` tests that over a window of the first `window` tokens:
the joint (every token tuple is a cell) and each position's marginal, by chi-square against
`target_joint`, which enumerates the target's conditionals with the float64 reference
sampler (reference.py), never with the sampling code under test. Coverage is read from the
Steps the runs yield, so a case fails when the paths it exists for did not run.

Power: with `draws` runs a cell of expected probability p is seen p * draws times; cells
expected fewer than 5 times are pooled. At the default 3000 draws a 2-point shift in a
20% cell gives a chi-square contribution of ~7 on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.stats import chi2

from draftsman.core import GenerationConfig, Step
from draftsman.errors import InvalidArgumentError
from draftsman.sampling import SamplingConfig
from draftsman.testing.reference import reference_probabilities


def target_joint(model, prompt: list[int], window: int, sampling: SamplingConfig,
                 max_cells: int = 200_000) -> dict[tuple[int, ...], float]:
    """P(x_1..x_window | prompt) under the target and `sampling`: every tuple of positive
    probability, enumerated along the tree of prefixes (one forward per prefix, float64
    reference probabilities). With top-k the tree has at most k^window leaves, which is what
    makes a real vocabulary tractable; more than `max_cells` raises."""
    joint: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for _ in range(window):
        grown = []
        for prefix, p in frontier:
            probs = next_token_probabilities(model, list(prompt) + list(prefix), sampling)
            grown += [(prefix + (int(t),), p * float(probs[t])) for t in np.flatnonzero(probs)]
            if len(grown) > max_cells:
                raise InvalidArgumentError(
                    f"the target's distribution over {window} tokens has more than "
                    f"{max_cells} outcomes; use a smaller top-k or window")
        frontier = grown
    joint.update((seq, p) for seq, p in frontier if p > 0.0)
    return joint


def next_token_probabilities(model, context: list[int], sampling: SamplingConfig
                             ) -> np.ndarray:
    """The target's next-token distribution after `context`, from one full forward."""
    ctx = torch.tensor([context])
    with torch.no_grad():
        logits = model(ctx, torch.arange(ctx.shape[1])[None],
                       model.new_cache(ctx.shape[1]), logits_at=slice(-1, None)).logits[0, -1]
    return reference_probabilities(logits.double().cpu().numpy(), sampling.temperature,
                                   sampling.top_k, sampling.top_p)


def chi_square_pvalue(counts: Counter | dict, expected: dict, draws: int) -> float:
    """Pearson's test of observed counts against expected probabilities; cells expected
    fewer than 5 times are pooled into one. An observed cell of probability 0 fails it."""
    if any(cell not in expected for cell, n in counts.items() if n):
        return 0.0
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, p in expected.items():
        e, o = p * draws, counts.get(cell, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        stat += (o - e) ** 2 / e
        dof += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return float(chi2.sf(stat, max(dof, 1)))


def coverage_of(steps: Iterable[Step]) -> Counter:
    """Which verification paths one run's steps exercised (counts of steps):
    `guesses`, `accepted at i` (a guess kept at depth i), `rejected at i` (the guess at
    depth i refused), `bonus` (every guess kept, the target's extra token), `branches >= 2`
    / `>= 3`, `sibling after rejection` (a tree node tried a guess after refusing one),
    `stage-1 accepted` / `stage-1 rejected` (a staged drafter's inner verification),
    `bypass` (a cascade sent its sub-drafter's guesses straight to the target) and
    `gamma changed` (the γ policy chose more than one draft length, budget
    clipping aside)."""
    cov: Counter = Counter()
    gammas = set()
    for s in steps:
        if s.prefill:
            continue
        if s.drafted:
            cov["guesses"] += 1
            for i in range(1, s.accepted + 1):
                cov[f"accepted at {i}"] += 1
            if s.rejected:
                cov[f"rejected at {s.accepted + 1}"] += 1
            elif len(s.tokens) == s.accepted + 1:
                cov["bonus"] += 1
        extra = s.extra
        for b in (2, 3):
            if extra.get("branches", 0) >= b:
                cov[f"branches >= {b}"] += 1
        if extra.get("siblings_tried", 0):
            cov["sibling after rejection"] += 1
        if extra.get("sub_accepted", 0):
            cov["stage-1 accepted"] += 1
        if extra.get("sub_rejections", 0):
            cov["stage-1 rejected"] += 1
        if extra.get("bypass"):
            cov["bypass"] += 1
        if "policy_gamma" in extra:
            gammas.add(extra["policy_gamma"])
    if len(gammas) > 1:
        cov["gamma changed"] += 1
    return cov


@dataclass
class ConformanceResult:
    draws: int
    window: int
    p_joint: float  # chi-square p-value of the joint over the window
    p_positions: list[float]  # one per position of the window (marginals)
    coverage: Counter = field(default_factory=Counter)
    missing: list[str] = field(default_factory=list)  # required paths that never ran
    tv_joint: float = 0.0  # total variation between observed and expected joints
    tv_positions: list[float] = field(default_factory=list)

    @property
    def p_min(self) -> float:
        return min([self.p_joint, *self.p_positions])

    def passed(self, alpha: float = 0.01) -> bool:
        """Exact at level alpha (Bonferroni over the window's tests) and fully covered."""
        return not self.missing and self.p_min * (1 + self.window) > alpha

    def table(self) -> str:
        lines = [f"draws {self.draws}, window {self.window}: p(joint) = {self.p_joint:.3g}, "
                 "p(position) = " + ", ".join(f"{p:.3g}" for p in self.p_positions)]
        if self.tv_positions:
            lines.append(f"  total variation: joint {self.tv_joint:.3f}, position "
                         + ", ".join(f"{tv:.3f}" for tv in self.tv_positions))
        lines += [f"  {name:<26}{n:>8}" for name, n in sorted(self.coverage.items())]
        if self.missing:
            lines.append("  never ran: " + ", ".join(self.missing))
        return "\n".join(lines)


def check_exact(strategy, prompt: list[int], expected: dict[tuple[int, ...], float],
                sampling: SamplingConfig, draws: int = 3000,
                require: Iterable[str] = (), history: object | None = None,
                progress: Callable[[int], None] | None = None) -> ConformanceResult:
    """Run `strategy` `draws` times (seeds 0..draws-1, `window` = the expected tuples'
    length new tokens each) and test its output against `expected` (`target_joint`).
    `history`: the earlier sequences a history drafter may copy from (a `Scope`);
    `progress(n)` is called after each run."""
    window = len(next(iter(expected)))
    counts: Counter = Counter()
    coverage: Counter = Counter()
    for seed in range(draws):
        config = GenerationConfig(window, SamplingConfig(
            sampling.temperature, sampling.top_k, sampling.top_p, seed=seed), history=history)
        steps = list(strategy.generate(list(prompt), config))
        tokens = tuple(t for s in steps for t in s.tokens)
        counts[tokens] += 1
        coverage.update(coverage_of(steps))
        if progress:
            progress(1)
    positions, tvs = [], []
    for t in range(window):
        marginal: Counter = Counter()
        for seq, p in expected.items():
            marginal[seq[t]] += p
        observed = Counter()
        for seq, n in counts.items():
            observed[seq[t]] += n
        positions.append(chi_square_pvalue(observed, dict(marginal), draws))
        tvs.append(total_variation(observed, marginal, draws))
    missing = [name for name in require if coverage[name] == 0]
    return ConformanceResult(draws, window, chi_square_pvalue(counts, expected, draws),
                             positions, coverage, missing,
                             total_variation(counts, expected, draws), tvs)


def total_variation(counts: Counter | dict, expected: dict, draws: int) -> float:
    """Half the L1 distance between the observed frequencies and `expected`. Sampling noise
    alone leaves about sqrt(cells / draws) / 2 of it, so read it beside the p-value."""
    cells = set(counts) | set(expected)
    return 0.5 * sum(abs(counts.get(c, 0) / draws - expected.get(c, 0.0)) for c in cells)
