"""One request of speculative (or plain) decoding as a step machine.

A strategy written as a loop calls the target itself; a step machine instead says what rows
it wants in the next target forward and then reads that forward's logits. That is what lets
the batch scheduler (batching/) put many requests' rows in one forward, and a request alone
is the same machine driven by `run_alone`: the single-user path and the server share one
code path and one set of exactness tests.

Cycle, once per target forward:
    propose()        guesses for this step (none while the prompt is being read)
    trim(n)          optional: a batch controller keeps only the first n guesses
    rows()           the tokens to feed: a prompt chunk, or pending token(s) + guesses
    <forward>        alone (`ModelState.feed`) or in a ragged batch (`segment` + `wrote`)
    accept(logits)   speculative sampling on the rows' logits -> the Step (None while a
                     prompt chunk that is not the last one was read)

Invariants: the committed tokens only grow; after `accept` the cache holds exactly the
committed tokens but the last one (the pending token of the next step); a request's draws
come from its own seeded generator, in the same order alone or in a batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import DecoderLM
from draftsman.models.protocol import Cache
from draftsman.models.ragged import Segment
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler, greedy_tokens
from draftsman.state import ModelState, reads_greedy_tokens
from draftsman.strategies.base import check_fits
from draftsman.strategies.gamma import CostModelGamma, Feedback, GammaPolicy
from draftsman.verification.chain import Verdict, verify_greedy, verify_sampling

NO_GUESS = Proposal([], None)


def shadow_verdict(guesses: list[int], new: list[int]) -> tuple[int, bool]:
    """How deterministic guesses nobody verified would have fared against the tokens the
    step committed: (kept, refused). Greedy: what the target would have decided. Sampled:
    a guess x is kept with probability p(x), the chance the target drew x itself."""
    kept = 0
    while kept < min(len(guesses), len(new)) and guesses[kept] == new[kept]:
        kept += 1
    return kept, kept < len(guesses) and kept < len(new)


@dataclass(frozen=True)
class Rows:
    """What one request feeds to the next forward."""

    tokens: list[int]
    start: int  # position (= cache slot) of the first row
    logits_from: int | None  # first row whose logits `accept` reads; None: none
    prefill: bool  # a chunk of the prompt
    # a tree's rows (tree_steps.py): each row's position minus `start` (siblings share
    # one), and which rows each row sees; None: consecutive positions, causal
    offsets: tuple[int, ...] | None = None
    mask: torch.Tensor | None = None

    @property
    def logits_rows(self) -> int:
        return 0 if self.logits_from is None else len(self.tokens) - self.logits_from


class SpeculativeSteps:
    """Speculative decoding of one request (see the module docstring); `proposer` None (or
    `policy` None) is plain autoregressive decoding, one row per step."""

    def __init__(self, target: DecoderLM, proposer: Proposer | None,
                 policy: GammaPolicy | None, prompt_ids: list[int], config: GenerationConfig,
                 *, sources: tuple[str, str] = ("draft", "target"),
                 prefill_chunk: int | None = None,
                 new_cache: Callable[[int], Cache] | None = None, extra_rows: int = 0) -> None:
        check_fits(target, len(prompt_ids), config)
        self.proposer = proposer if policy is not None else None
        self.policy = policy
        self.sources = sources
        self.config = config
        max_gamma = policy.max_gamma if self.proposer is not None else 0
        self.capacity = len(prompt_ids) + config.max_new_tokens + max_gamma + 2
        # a batch may need the request's cache from a shared pool (llama.cpp's sequences)
        self.state = ModelState(target, self.capacity, extra_rows=extra_rows,
                                cache=new_cache(self.capacity + extra_rows) if new_cache
                                else None)
        self.sampler = Sampler(config.sampling)
        self.budget = Budget(config)
        self.timer = Timer()
        self.prompt = list(prompt_ids)
        self.committed = list(prompt_ids)
        self.prefilled = 0  # prompt tokens fed so far
        self.chunk = prefill_chunk or len(prompt_ids)
        self.gamma_cap: int | None = None  # a batch controller's cap for a model drafter
        self.proposal = NO_GUESS
        self._rows: Rows | None = None
        self._key: int | None = None
        self._gamma = self._wanted = 0
        self._room = 0  # free guesses a bypassing cascade may add past γ (draft_length)
        self._bypass = False  # this step's guesses bypassed the draft model
        self._started = False
        self._forwards = 0  # target forwards since the last Step

    # ---------------------------------------------------------------- what the request is
    @property
    def done(self) -> bool:
        return self.budget.done

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def adaptive(self) -> bool:
        """Whether a batch controller may choose this request's guesses (the cost-model
        policy, `gamma=auto`); a fixed γ the request asked for is kept, and so is the γ of
        a seeded sampled request: its draws follow its γ, and a seed promises the same
        tokens whatever else the server is doing."""
        seeded = not self.sampler.greedy and self.config.sampling.seed is not None
        return (self.proposer is not None and isinstance(self.policy, CostModelGamma)
                and not seeded)

    def guess_acceptance(self) -> float:
        """The learnt probability that one more guess like this step's is kept."""
        policy = self.policy
        if not isinstance(policy, CostModelGamma):
            return 0.0
        if self._key is not None and self._key in policy.by_key:
            accepts, trials = policy.by_key[self._key]
            return min(accepts / trials, 0.99)
        if self.bypasses:
            return policy.free_alpha
        return policy.alpha

    def offered(self) -> int:
        """Guesses a batch controller may keep this step: a draft model's γ before it
        drafts (it caps `gamma_cap`), else the proposal's (it calls `trim`)."""
        return self.policy.max_gamma if self.drafts_with_model else len(self.proposal.tokens)

    def guess_cost(self) -> float:
        """Cost of drafting one guess relative to one target forward (c). A bypassing
        cascade is offered to a batch controller as its free guesses (its cap then bounds
        the model's γ too)."""
        if self.bypasses or not isinstance(self.policy, CostModelGamma):
            return 0.0
        return self.policy.cost

    @property
    def drafts_with_model(self) -> bool:
        return self.proposer is not None and self.proposer.uses_model

    @property
    def bypasses(self) -> bool:
        return self.proposer is not None and self.proposer.bypasses

    # ---------------------------------------------------------------- the cycle
    def propose(self) -> Proposal:
        """This step's guesses (as the request's policy plans them; none while prefilling)."""
        gamma = self.draft_length()
        if not gamma and not self._room:
            return self.take(Proposal([], None))
        routing = {"room": self._room, "route": self.policy.route,
                   "ready": self.policy.model_ready} if self._room else {}
        with self.timer("draft"):
            proposal = self.proposer.propose(self.committed, gamma, self.sampler,
                                             self.policy.stop_below, **routing)
        return self.take(proposal)

    def draft_length(self) -> int:
        """How many guesses to ask the drafter for this step (0: none). The first call that
        asks for some starts the proposer on the prompt. `propose` = this, the drafter, then
        `take`; a batch drafts several requests' guesses together between the two."""
        self.proposal, self._key, self._gamma, self._wanted = NO_GUESS, None, 0, 0
        self._room, self._bypass = 0, False
        if self.prefilling or self.done or self.proposer is None:
            return 0
        policy = self.policy
        planned = policy.plans_guesses and not self.proposer.uses_model
        wanted = policy.max_gamma if planned else policy.next_gamma()
        if self.gamma_cap is not None and not planned:
            wanted = min(wanted, self.gamma_cap)
        self._wanted = wanted
        self._gamma = max(0, min(wanted, self.budget.remaining - 1))
        if self.proposer.bypasses and policy.plans_guesses:
            # free guesses past γ: up to the policy's largest γ (a batch controller's cap)
            room = policy.max_gamma if self.gamma_cap is None else self.gamma_cap
            self._room = max(0, min(room, self.budget.remaining - 1))
        if (self._gamma or self._room) and not self._started:
            # a one-time cost (a draft model reads the prompt), kept out of the policy's
            # cost per guess; none at all for a drafter the policy never asks
            with self.timer("draft_setup"):
                self.proposer.use_history(self.config.history)
                self.proposer.start(self.prompt, self.capacity)
            self._started = True
        return self._gamma

    def take(self, proposal: Proposal) -> Proposal:
        """The drafter's guesses for this step; a deterministic drafter's are cut to what
        the policy plans for guesses of their match length."""
        self._bypass = bool(proposal.extra.get("bypass"))
        planned = (self.proposer is not None and self.policy.plans_guesses
                   and (not self.proposer.uses_model or self._bypass))
        key = proposal.extra.get("match") if planned else None
        if planned and proposal.tokens:
            keep = self.policy.plan(len(proposal.tokens), key, free=self._bypass)
            proposal.tokens = proposal.tokens[:keep]
            self._gamma = self._wanted = len(proposal.tokens)
        self.proposal, self._key = proposal, key
        return proposal

    def trim(self, n: int) -> None:
        """Keep only the first `n` guesses of this step's proposal."""
        p = self.proposal
        if n < len(p.tokens):
            p.tokens = p.tokens[:n]
            if p.q is not None:
                p.q = p.q[:n]
            self._gamma = n

    def rows(self, chunk: int | None = None) -> Rows:
        """The rows of this step; while prefilling, the next `chunk` prompt tokens (at most
        the machine's own chunk size)."""
        if self.prefilling:
            size = self.chunk if chunk is None else max(1, min(chunk, self.chunk))
            chunk = self.prompt[self.prefilled: self.prefilled + size]
            last = self.prefilled + len(chunk) == len(self.prompt)
            rows = Rows(chunk, self.prefilled, len(chunk) - 1 if last else None, True)
        else:
            # the last committed token is not in the cache yet; `committed` only grows, so
            # this compares just what the previous step appended
            pending = self.state.sync(self.committed)
            rows = Rows(pending + self.proposal.tokens, len(self.state.fed), len(pending) - 1,
                        False)
        self._rows = rows
        return rows

    def segment(self) -> Segment:
        """This request's part of a ragged forward over `rows()`."""
        rows = self._rows
        assert rows is not None
        return Segment(self.state.cache, rows.start, len(rows.tokens), rows.mask)

    def wrote(self) -> None:
        """A ragged forward wrote this request's rows into its cache."""
        assert self._rows is not None
        self.state.record(self._rows.tokens)
        self.state.forwards += 1

    def accept(self, logits: torch.Tensor | None, forward_seconds: float,
               cost_seconds: float | None = None, *,
               tokens: torch.Tensor | None = None) -> Step | None:
        """logits [rows.logits_rows, V] of this request's rows, or, from a forward that
        picked them itself (`reads_greedy_tokens`), their greedy tokens [rows.logits_rows]
        and logits None. `forward_seconds`: the forward's wall time (what this request
        waited); `cost_seconds`: its share of the forward in one-request terms, for the
        policy's cost estimate (default: all of it). None while a prompt chunk before the
        last was read."""
        rows, timer = self._rows, self.timer
        assert rows is not None, "accept() before rows()"
        self._rows = None
        self._forwards += 1
        timer.seconds["verify"] = timer.seconds.get("verify", 0.0) + forward_seconds
        if rows.prefill:
            self.prefilled += len(rows.tokens)
            if self.prefilling:
                return None
            with timer("verify"):
                pick = int(tokens[-1]) if tokens is not None else self.sampler.pick(logits[-1])
                first = self.budget.clip([pick])
            self.committed += first
            return self._step(first, ["target"], prefill=True)
        proposal = self.proposal
        with timer("verify"):
            verdict = self._verify(proposal, logits, tokens)
        new = self.budget.clip(proposal.tokens[: verdict.accepted] + [verdict.next_token])
        self.committed += new
        with timer("other"):
            self.state.sync(self.committed)
            if self._started:  # a drafter never asked has nothing to follow
                self.proposer.commit(self.committed)
        seconds = timer.take()
        drafted = len(proposal.tokens)
        if self.policy is not None:
            verify = seconds["verify"] - forward_seconds + (
                forward_seconds if cost_seconds is None else cost_seconds)
            # a cascade's catch-up read of a long lag is a one-time cost, not a guess's
            draft = seconds.get("draft", 0.0) - proposal.extra.get("catch_up_seconds", 0.0)
            self.policy.update(Feedback(drafted, verdict.accepted, verdict.rejected, draft,
                                        proposal.forwards, verify, self._key,
                                        free=self._bypass,
                                        declined=bool(proposal.extra.get("declined"))))
            if proposal.shadow is not None:
                key, guesses = proposal.shadow
                self.policy.learn_key(key, *shadow_verdict(guesses, new))
        kept = min(verdict.accepted, len(new))
        extra = {"gamma": self._gamma, "policy_gamma": self._wanted, **proposal.extra} \
            if self.proposer is not None else {}
        step = Step(new, [self.sources[0]] * kept + [self.sources[1]] * (len(new) - kept),
                    drafted=drafted, accepted=verdict.accepted, rejected=verdict.rejected,
                    target_forwards=self._forwards, draft_forwards=proposal.forwards,
                    draft_seconds=seconds.get("draft", 0.0) + seconds.get("draft_setup", 0.0),
                    verify_seconds=seconds["verify"],
                    other_seconds=seconds.get("other", 0.0), finish=self.budget.finish,
                    extra=extra)
        self._forwards = 0
        return step

    def release(self) -> None:
        """The request is over: hand back what a pool lent it (a batch context's sequence),
        at once rather than when garbage collection gets to it."""
        for state in (self.state, getattr(self.proposer, "state", None)):
            release = getattr(getattr(state, "cache", None), "release", None)
            if release is not None:
                release()

    def _verify(self, proposal: Proposal, logits: torch.Tensor | None,
                tokens: torch.Tensor | None) -> Verdict:
        if tokens is not None:  # the forward's own greedy picks, [γ+1]
            return verify_greedy(proposal.tokens, tokens.tolist())
        if self.sampler.greedy:  # [γ+1, V] -> the target's choice after each prefix
            return verify_greedy(proposal.tokens, greedy_tokens(logits).tolist())
        return verify_sampling(proposal.tokens, proposal.q, self.sampler.probs(logits),
                               self.sampler)

    def _step(self, tokens: list[int], sources: list[str], prefill: bool) -> Step:
        seconds = self.timer.take()
        step = Step(tokens, sources, target_forwards=self._forwards, prefill=prefill,
                    verify_seconds=seconds.get("verify", 0.0), finish=self.budget.finish)
        self._forwards = 0
        return step


def run_alone(machine: SpeculativeSteps) -> Iterator[Step]:
    """Drive one request by itself: one forward of its own rows per step."""
    greedy = reads_greedy_tokens(machine.state.model, machine.sampler.greedy)
    while not machine.done:
        machine.propose()
        rows = machine.rows()
        at = None if rows.logits_from is None else slice(rows.logits_from, None)
        t0 = time.perf_counter()
        out = machine.state.feed(rows.tokens, logits_at=at, greedy=greedy)
        seconds = time.perf_counter() - t0
        step = machine.accept(None if out.logits is None else out.logits[0], seconds,
                              tokens=None if out.tokens is None else out.tokens[0])
        if step is not None:
            yield step
