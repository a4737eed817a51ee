"""Load-adaptive speculation: how many guesses each request verifies in a shared forward.

On a CPU a forward over n rows costs v(n) one-row forwards, measured (the verify cost curve),
and a row spent on one request's guess is a row not spent on another's next token. Each
step, every decoding request brings its pending row (which commits one token for sure) and
its guesses; the i-th guess of request r commits one more token with probability
g_ri = a_r1 * ... * a_ri (every guess before it kept too), where a_ri is r's learnt
acceptance for guesses like these. Drafting it costs c_r (≈ 0 for n-gram and lookup
drafters, one draft forward per guess for a draft model). The step commits in expectation

    E = base_tokens + sum of the chosen g_ri,   for   cost = v(base_rows + chosen) + sum c_r,

and the controller keeps the set of guesses maximising E / cost, among the sets whose cost
stays within the step's bound when one is set (the scheduler's `max_step_cost`: every
request waits for the whole step, so one request's guesses are the others' latency). Within
a request the g_ri shrink with i, so the best set of any size is the guesses with the
largest g: sorting them once and trying every prefix finds the optimum. With one request
this is exactly the cost-model γ (strategies/gamma.py `_best_gamma`); with many, guesses
only pay where v stays flat, and on a machine where it grows linearly they are turned off
under load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Offer:
    """One request's guesses for this step."""

    acceptance: Sequence[float]  # a_r1..a_rk: each guess's chance of being kept given the
    #                              previous ones were (k = the most it may verify)
    guess_cost: float = 0.0  # c_r: drafting one guess, in one-row target forwards


def expected_gains(acceptance: Sequence[float]) -> list[float]:
    """g_i = a_1 * ... * a_i: the expected tokens the i-th guess adds."""
    gains, p = [], 1.0
    for a in acceptance:
        p *= a
        gains.append(p)
    return gains


def allocate(offers: Sequence[Offer], base_rows: int, base_tokens: float,
             row_cost: Callable[[int], float], max_cost: float | None = None) -> list[int]:
    """How many of each offer's guesses to verify: the counts maximising expected tokens per
    unit of step cost (module docstring). `row_cost(n)` is v(n), the cost of a forward over
    n rows relative to one row; `base_rows` the rows the step runs anyway (pending tokens,
    prompt chunks), `base_tokens` the tokens they commit. With `max_cost`, no set of guesses
    whose step (forward and drafting) would cost more is chosen."""
    candidates = sorted(
        ((gain, i, offer.guess_cost) for i, offer in enumerate(offers)
         for gain in expected_gains(offer.acceptance)),
        key=lambda c: -c[0])
    best_k, best_rate = 0, base_tokens / row_cost(max(base_rows, 1))
    tokens, drafting = base_tokens, 0.0
    for k, (gain, _, guess_cost) in enumerate(candidates, start=1):
        tokens += gain
        drafting += guess_cost
        step = row_cost(base_rows + k) + drafting
        if max_cost is not None and step > max_cost:
            break  # longer prefixes cost more still
        rate = tokens / step
        if rate > best_rate:
            best_k, best_rate = k, rate
    counts = [0] * len(offers)
    for _, i, _ in candidates[:best_k]:
        counts[i] += 1
    return counts
