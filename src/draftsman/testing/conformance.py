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

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.stats import chi2

from draftsman.core import GenerationConfig, Step
from draftsman.sampling import SamplingConfig
from draftsman.testing.reference import reference_probabilities


def target_joint(model, prompt: list[int], window: int,
                 sampling: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(x_1..x_window | prompt) under the target and `sampling`, every tuple enumerated
    (one forward per distinct prefix, float64 reference probabilities)."""
    vocab = model.config.vocab_size
    memo: dict[tuple[int, ...], np.ndarray] = {}

    def next_probs(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in memo:
            ctx = torch.tensor([list(prompt) + list(prefix)])
            with torch.no_grad():
                logits = model(ctx, torch.arange(ctx.shape[1])[None],
                               model.new_cache(ctx.shape[1])).logits[0, -1]
            memo[prefix] = reference_probabilities(logits.double().numpy(), sampling.temperature,
                                                   sampling.top_k, sampling.top_p)
        return memo[prefix]

    joint: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(vocab), repeat=window):
        p = 1.0
        for t in range(window):
            p *= float(next_probs(seq[:t])[seq[t]])
            if p == 0.0:
                break
        if p > 0.0:
            joint[seq] = p
    return joint


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
    `stage-1 accepted` / `stage-1 rejected` (a staged drafter's inner verification) and
    `gamma changed` (the run used more than one draft length)."""
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
        if "gamma" in extra:
            gammas.add(extra["gamma"])
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

    @property
    def p_min(self) -> float:
        return min([self.p_joint, *self.p_positions])

    def passed(self, alpha: float = 0.01) -> bool:
        """Exact at level alpha (Bonferroni over the window's tests) and fully covered."""
        return not self.missing and self.p_min * (1 + self.window) > alpha

    def table(self) -> str:
        lines = [f"draws {self.draws}, window {self.window}: p(joint) = {self.p_joint:.3g}, "
                 "p(position) = " + ", ".join(f"{p:.3g}" for p in self.p_positions)]
        lines += [f"  {name:<26}{n:>8}" for name, n in sorted(self.coverage.items())]
        if self.missing:
            lines.append("  never ran: " + ", ".join(self.missing))
        return "\n".join(lines)


def check_exact(strategy, prompt: list[int], expected: dict[tuple[int, ...], float],
                sampling: SamplingConfig, draws: int = 3000,
                require: Iterable[str] = ()) -> ConformanceResult:
    """Run `strategy` `draws` times (seeds 0..draws-1, `window` = the expected tuples'
    length new tokens each) and test its output against `expected` (`target_joint`)."""
    window = len(next(iter(expected)))
    counts: Counter = Counter()
    coverage: Counter = Counter()
    for seed in range(draws):
        config = GenerationConfig(window, SamplingConfig(
            sampling.temperature, sampling.top_k, sampling.top_p, seed=seed))
        steps = list(strategy.generate(list(prompt), config))
        tokens = tuple(t for s in steps for t in s.tokens)
        counts[tokens] += 1
        coverage.update(coverage_of(steps))
    positions = []
    for t in range(window):
        marginal: Counter = Counter()
        for seq, p in expected.items():
            marginal[seq[t]] += p
        observed = Counter()
        for seq, n in counts.items():
            observed[seq[t]] += n
        positions.append(chi_square_pvalue(observed, dict(marginal), draws))
    missing = [name for name in require if coverage[name] == 0]
    return ConformanceResult(draws, window, chi_square_pvalue(counts, expected, draws),
                             positions, coverage, missing)
