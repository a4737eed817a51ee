"""Draft-length (γ) policies for speculative decoding.

- fixed:      the same γ every step.
- heuristic:  +2 after a fully accepted step, -1 otherwise.
- acceptance: an exponential average of the per-step acceptance rate; grow γ while it is
              high, shrink it while it is low (the course project's dynamic lookahead).
- cost:       running estimates of α (maximum likelihood over recent steps) and of the cost
              ratio c from measured timings; γ = argmax (1 - α^(γ+1)) / ((1 - α)(γc + v(γ)))
              where v(γ) is the measured verify cost of γ+1 tokens relative to one; drafting
              also stops early when the draft's own probability for its guess drops below a
              threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsman.errors import InvalidArgumentError
from draftsman.theory.speculative import expected_tokens_per_step


@dataclass
class Feedback:
    drafted: int
    accepted: int
    rejected: bool
    draft_seconds: float
    draft_forwards: int
    verify_seconds: float
    key: int | None = None  # a deterministic drafter's match length (see CostModelGamma.plan)
    free: bool = False  # a cascade's bypass: guesses that cost nothing, learnt per key only
    declined: bool = False  # a cascade wanted its draft model, too far behind to pay yet


class GammaPolicy:
    name = "fixed"
    stop_below: float | None = None
    plans_guesses = False  # True: deterministic drafters propose max_gamma, `plan` trims

    def __init__(self, gamma: int = 4, max_gamma: int = 16) -> None:
        self.gamma = gamma
        self.max_gamma = max_gamma

    def next_gamma(self) -> int:
        return self.gamma

    def plan(self, guesses: int, key: int | None, free: bool = False) -> int:
        """How many of a deterministic drafter's `guesses` to verify (all, unless a policy
        knows better); `free`: guesses that cost no drafting (a cascade's bypass)."""
        return guesses

    def route(self, guesses: int, key: int | None, model: bool = True) -> int:
        """A cascade's free guesses (its sub-drafter's, `key` their match length): how many
        to verify instead of drafting with the model (`model`: whether it may draft this
        step); 0: draft with the model, or plain decoding where it may not."""
        return guesses

    def model_ready(self, behind: int) -> bool:
        """Whether a cascade's draft model, `behind` tokens behind the text, may draft now."""
        return True

    def learn_key(self, key: int | None, accepted: int, rejected: bool) -> None:
        """How guesses of match length `key` fared (a step's, or a cascade's unsent ones
        against the committed text)."""

    def update(self, fb: Feedback) -> None:
        pass


class HeuristicGamma(GammaPolicy):
    name = "heuristic"

    def update(self, fb: Feedback) -> None:
        if fb.drafted and fb.accepted == fb.drafted:
            self.gamma = min(self.gamma + 2, self.max_gamma)
        else:
            self.gamma = max(self.gamma - 1, 1)


class AcceptanceGamma(GammaPolicy):
    name = "acceptance"

    def __init__(self, gamma: int = 4, max_gamma: int = 16, high: float = 0.8,
                 low: float = 0.5, smoothing: float = 0.5) -> None:
        super().__init__(gamma, max_gamma)
        self.high, self.low, self.smoothing = high, low, smoothing
        self.rate: float | None = None

    def update(self, fb: Feedback) -> None:
        if not fb.drafted:
            return
        step_rate = fb.accepted / fb.drafted
        self.rate = step_rate if self.rate is None else (
            self.smoothing * self.rate + (1 - self.smoothing) * step_rate)
        if self.rate >= self.high:
            self.gamma = min(self.gamma + 1, self.max_gamma)
        elif self.rate < self.low:
            self.gamma = max(self.gamma - 1, 1)


class CostModelGamma(GammaPolicy):
    """Picks γ from the analytic speedup with running α and c; may choose γ = 0.

    For a deterministic drafter (n-gram, prompt lookup) guessing is nearly free, so the
    drafter proposes up to max_gamma and `plan` keeps the γ that maximises expected tokens
    per unit time for the acceptance rate *of guesses like these*: α is also tracked per
    match length (the drafter's `extra["match"]`), since a 3-token match continues far more
    often than a 1-token one. Where no guess pays, it verifies none: plain decoding.
    """

    name = "cost"
    plans_guesses = True

    def __init__(self, gamma: int = 4, max_gamma: int = 12, stop_below: float | None = 0.3,
                 memory: float = 0.9, prior_alpha: float = 0.7, prior_cost: float = 0.3,
                 verify_cost: dict[int, float] | None = None) -> None:
        super().__init__(gamma, max_gamma)
        self.stop_below = stop_below
        self.memory = memory
        # discounted counts (a prior worth a few steps) for the α maximum-likelihood estimate
        self.accepts, self.trials = prior_alpha * 4, 4.0
        self.cost = prior_cost
        self.verify_cost = verify_cost or {}  # tokens verified -> cost relative to 1 token
        self.idle = 0  # steps without drafting; after a few, probe with γ = 1 to refresh α
        self.by_key: dict[int, list[float]] = {}  # match length -> [accepts, trials]
        # A bypassing cascade (`route`): the model's α says nothing of its sub-drafter's
        # guesses, so a match length not seen yet starts from the α of all its free guesses
        self.bypassing = False
        self.free_counts = [prior_alpha * 4, 4.0]
        self.rent = 0.0  # target forwards forgone since the cascade's draft fell behind
        # Probing a draft *model* after it stopped paying is not free: the draft must first
        # read every token committed since it last ran. The registry turns probes off for
        # model drafters, so "do not speculate" really costs nothing once decided.
        self.probe = True

    def calibrate(self, verify_cost: dict[int, float], draft_cost: float | None = None) -> None:
        """Take this machine's verify cost curve (and a draft model's measured cost per
        guess, relative to a target forward) and choose the first γ before any step: the
        prior's best γ; 1 if only a better α than the prior could pay (to learn α); 0 for
        good if no γ pays even when every guess is accepted, so a drafter that cannot win on
        this hardware costs nothing."""
        self.verify_cost = verify_cost
        if draft_cost is not None:
            self.cost = draft_cost
        best = self._best_gamma(self.alpha, self.max_gamma)
        if best == 0 and self._best_gamma(0.99, self.max_gamma) > 0:
            best = 1
        self.gamma = best

    def _best_gamma(self, alpha: float, limit: int, cost: float | None = None) -> int:
        verify = self.verify_cost
        c = self.cost if cost is None else cost
        return max(range(0, limit + 1), key=lambda g: expected_tokens_per_step(alpha, g) / (
            g * c + verify.get(g + 1, 1.0)))

    @property
    def free_alpha(self) -> float:
        """α of a bypassing cascade's free guesses, all match lengths together."""
        return min(self.free_counts[0] / self.free_counts[1], 0.99)

    def _key_prior(self) -> float:
        """The α a match length not seen yet starts from."""
        return self.free_alpha if self.bypassing else self.alpha

    def plan(self, guesses: int, key: int | None, free: bool = False) -> int:
        if key is None:
            return min(guesses, self.gamma)
        accepts, trials = self.by_key.get(key, (2 * self._key_prior(), 2.0))
        keep = self._best_gamma(min(accepts / trials, 0.99), guesses, 0.0 if free else None)
        if keep == 0 and key not in self.by_key:
            keep = 1  # never seen: one guess to learn how such matches fare
        return keep

    def route(self, guesses: int, key: int | None, model: bool = True) -> int:
        """Bypass the draft model when the free guesses' expected tokens per unit time (α of
        their match length, the best γ for them at no drafting cost) beat the model path's
        at its current γ (plain decoding's 1 when that γ is 0 or the model may not draft)."""
        verify = self.verify_cost
        accepts, trials = self.by_key.get(key, (2 * self._key_prior(), 2.0))
        alpha_key = min(accepts / trials, 0.99)
        g = self._best_gamma(alpha_key, guesses, 0.0)
        if g == 0:
            return 0
        free = expected_tokens_per_step(alpha_key, g) / verify.get(g + 1, 1.0)
        return g if free >= (self._model_rate() if model else 1.0) else 0

    def _model_rate(self) -> float:
        """Tokens per target forward of drafting with the model at its current γ."""
        g = self.gamma
        return expected_tokens_per_step(self.alpha, g) / (
            g * self.cost + self.verify_cost.get(g + 1, 1.0))

    def catch_up_cost(self, behind: int) -> float:
        """Target forwards a draft model spends reading `behind` tokens it has not seen, past
        what a step's forward reads anyway (as many rows as the verify cost curve spans):
        the curve's cost per row at its widest, times c, the draft's price of one row (a
        draft model's curve has the target's shape: the same kernels)."""
        verify = self.verify_cost
        if not verify or behind <= max(verify):  # uncalibrated: no price to weigh
            return 0.0
        widest = max(verify)
        return self.cost * verify.get(widest, 1.0) * behind / widest

    def model_ready(self, behind: int) -> bool:
        """Ski rental for a cascade's draft model: a long lag (the prompt, a long bypassed
        stretch) is read only once the savings forgone without the model since it fell
        behind (`rent`) reach what reading it costs. A copied passage then never pays the
        draft's prefill, while free text buys it after a few plain steps, at most twice what
        an oracle would have paid."""
        return self.catch_up_cost(behind) <= self.rent

    def learn_key(self, key: int | None, accepted: int, rejected: bool) -> None:
        if key is None:
            return
        m = self.memory
        own = self.by_key.setdefault(key, [2 * self._key_prior(), 2.0])
        for c in (own, self.free_counts) if self.bypassing else (own,):
            c[0] = m * c[0] + accepted
            c[1] = m * c[1] + accepted + (1 if rejected else 0)

    @property
    def alpha(self) -> float:
        return min(self.accepts / self.trials, 0.99)

    def update(self, fb: Feedback) -> None:
        verify = self.verify_cost
        m = self.memory
        if fb.drafted and not fb.free:
            self.accepts = m * self.accepts + fb.accepted
            self.trials = m * self.trials + fb.accepted + (1 if fb.rejected else 0)
        if fb.drafted:
            self.learn_key(fb.key, fb.accepted, fb.rejected)
        if fb.declined:  # a plain step the draft model would have beaten
            self.rent += max(0.0, 1.0 - 1.0 / self._model_rate())
        if fb.free:
            return  # a cascade's bypass: what such matches are worth, not the draft's α or c
        if fb.drafted:
            if fb.verify_seconds > 0:
                # c per drafted token (a model drafter spends one forward per token; n-gram
                # and lookup drafters almost nothing) relative to a one-token target forward
                one_token = fb.verify_seconds / verify.get(fb.drafted + 1, 1.0)
                c = (fb.draft_seconds / fb.drafted) / one_token
                self.cost = m * self.cost + (1 - m) * c
            self.idle, self.rent = 0, 0.0
        self.gamma = self._best_gamma(self.alpha, self.max_gamma)
        if self.gamma == 0 and self.probe:
            self.idle += 1
            if self.idle >= 8:
                self.gamma, self.idle = 1, 0


POLICIES = {p.name: p for p in (GammaPolicy, HeuristicGamma, AcceptanceGamma, CostModelGamma)}


def make_policy(gamma: int | str, policy: str | None, max_gamma: int = 16) -> GammaPolicy:
    """gamma: an integer (fixed unless a policy is named) or 'auto' (policy default 'cost')."""
    if gamma == "auto":
        name = policy or "cost"
        start = 4
    else:
        try:
            start = int(gamma)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"gamma must be an integer or 'auto', got {gamma!r}") \
                from None
        if start < 1:
            raise InvalidArgumentError(f"gamma must be >= 1, got {start}")
        name = policy or "fixed"
    if name not in POLICIES:
        raise InvalidArgumentError(
            f"unknown gamma policy {name!r}; choose from {', '.join(sorted(POLICIES))}")
    return POLICIES[name](gamma=start, max_gamma=max_gamma)
