"""The step scheduler: many requests, one target forward per step.

Each `step()`:
1. requests that joined since the last step become active (up to `max_batch`);
2. every decoding request proposes its guesses (possibly none); with two or more decoding,
   the controller (controller.py) trims the guesses of requests that let it choose
   (`gamma=auto`) to what pays for the whole step on this machine's cost curve (within
   `max_step_cost`, when set: one request's guesses are the others' latency);
3. one prompting request reads a chunk of its prompt (`prefill_chunk` tokens), so a long
   prompt never stalls the others for more than one chunk's forward per step (while nobody
   decodes, every prompting request reads a whole chunk: no one waits on them); with a row
   budget (`max_step_rows`) the pending rows come first, the chunk takes what they leave and
   the guesses what is left, so that every shared step runs at most that many rows;
4. one ragged forward (models/ragged.py) runs every row: pending tokens, guesses, the chunk;
5. each request verifies its own rows with its own rule and seeded generator, and its Step
   goes out; finished and cancelled requests leave, and their caches go with them.

A request's tokens are what it would produce alone wherever the matrix kernels are batch
invariant (q4, q8; float32 up to the BLAS's rounding): its attention, its draws and its
verification never see another request. The scheduler is single-threaded; `submit` and
`cancel` may be called from other threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from draftsman.batching.controller import Offer, allocate
from draftsman.batching.drafting import batchable_drafter, draft_together, lend_draft_caches
from draftsman.core import Step
from draftsman.errors import UnsupportedError
from draftsman.models.ragged import RaggedCaches
from draftsman.state import greedy_option, reads_greedy_tokens
from draftsman.strategies.step_machine import SpeculativeSteps


@dataclass(frozen=True)
class BatchConfig:
    max_batch: int = 4  # requests decoding together (the server's --parallel)
    prefill_chunk: int = 128  # prompt tokens one request reads per step
    adaptive: bool = True  # the controller may trim `gamma=auto` requests' guesses
    # while others decode, a prompt chunk is cut so the step costs at most this many times
    # the step without it (the stall every decoding request feels); alone, whole chunks
    prefill_stall: float = 2.0
    # with two or more decoding, the controller's guesses are cut so the step (chunk and
    # guesses) costs at most this many times one row per decoding request: a bound on each
    # one's inter-token latency. None: guesses as the cost model says. Off by default: at 2.0
    # on an AMX Xeon it cut 4 users' speculative gain to nothing (load-amx-step-bound)
    max_step_cost: float | None = None
    # a row budget for every shared step (vLLM's max_num_batched_tokens): pending rows first,
    # then the joining prompt's chunk fills what they leave, then guesses what is left. One
    # bound in rows for every mix of requests, so a step's pause is the same whether one or
    # three others decode; replaces prefill_stall and max_step_cost while a step is shared
    max_step_rows: int | None = None
    # llama.cpp draft models draft together on sequences of one batch context; off by
    # default: with the 0.5B draft (Q5_0) on an AMX Xeon, 4 requests ran 0.94x the speed
    # of drafting each alone (bench-results/llama-cpp-draft-batching)
    share_llama_drafts: bool = False


@dataclass
class Ticket:
    """A request in the scheduler; `steps` are delivered through `on_step` as they come."""

    machine: SpeculativeSteps
    on_step: Callable[[Step], None] | None = None
    on_end: Callable[[Ticket], None] | None = None  # once, when it leaves for any reason
    joined_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # first step it took part in
    cancelled: bool = False
    finished: bool = False
    error: BaseException | None = None  # raised by its own machine; the others go on
    ended: bool = False

    @property
    def done(self) -> bool:
        return self.cancelled or self.finished or self.error is not None or self.machine.done

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.machine.release()
            if self.on_end is not None:
                self.on_end(self)

    def guard(self, work: Callable[..., object], *args: object, **kwargs: object
              ) -> tuple[bool, object]:
        """(ok, result) of this request's own work; an exception ends this request only."""
        try:
            return True, work(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported to this request's client
            self.error = exc
            return False, None


@dataclass
class StepReport:
    """What one step did (for /metrics and the benchmark)."""

    requests: int  # requests with rows in the forward
    rows: int  # rows in the forward
    guesses: int  # of which guesses
    committed: int  # tokens committed by the step
    seconds: float
    gammas: list[int]  # guesses verified per decoding request


class BatchScheduler:
    """See the module docstring. `row_cost(n)`: v(n), a forward over n rows relative to one
    row, on this machine (profiling.verify_cost_curve)."""

    def __init__(self, model, config: BatchConfig | None = None,
                 row_cost: Callable[[int], float] | None = None,
                 new_cache: Callable[[int], object] | None = None) -> None:
        if not model.capabilities.has("ragged_batches"):
            raise UnsupportedError(
                f"the {model.capabilities.backend} backend cannot batch requests into one "
                "forward (ragged_batches); serve them one per worker")
        self.model = model
        self.config = config or BatchConfig()
        # where a request's cache must come from to share forwards: a pool of max_batch
        # sequences for llama.cpp; None where every cache can join any forward (torch)
        # (`new_cache` reuses another scheduler's pool)
        pool = getattr(model, "sequence_caches", None)
        self.new_cache = new_cache or (pool(self.config.max_batch) if pool is not None
                                       else None)
        self.row_cost = row_cost or (lambda n: float(n))
        self.active: list[Ticket] = []
        self._joining: deque[Ticket] = deque()
        # per draft model whose batched caches come from a pool: this scheduler's pool of
        # max_batch sequences, lent to the requests drafting with it (drafting.py)
        self._draft_pools: dict[int, Callable[[int], object]] = {}
        self._lock = threading.Lock()
        self.last: StepReport | None = None

    # ---------------------------------------------------------------- membership
    def submit(self, machine: SpeculativeSteps, on_step: Callable[[Step], None] | None = None,
               on_end: Callable[[Ticket], None] | None = None) -> Ticket:
        """Queue a request; it joins at the next step boundary with room."""
        ticket = Ticket(machine, on_step, on_end)
        with self._lock:
            if self.config.share_llama_drafts:
                lend_draft_caches(machine, self._draft_pools, self.config.max_batch)
            self._joining.append(ticket)
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The request leaves at the next step; nothing of it is computed after that."""
        ticket.cancelled = True

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self.active and not self._joining

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._joining)

    def _admit(self) -> None:
        with self._lock:
            gone = [t for t in self._joining if t.cancelled]
            self._joining = deque(t for t in self._joining if not t.cancelled)
            while self._joining and len(self.active) < self.config.max_batch:
                self.active.append(self._joining.popleft())
        for t in gone:
            t.end()

    def fail_all(self, error: BaseException) -> None:
        """End every request, active or joining, with `error` (a failure no single request
        owns); the scheduler is empty and usable afterwards."""
        with self._lock:
            joining, self._joining = list(self._joining), deque()
        for t in self.active + joining:
            t.error = error
        self.active += joining
        self._retire()

    def _retire(self) -> None:
        """Finished, cancelled and failed requests leave; their caches go with them."""
        for t in self.active:
            if t.done:
                t.end()
        self.active = [t for t in self.active if not t.done]

    # ---------------------------------------------------------------- one step
    def step(self) -> list[tuple[Ticket, Step]]:
        """One forward over every active request's rows; the Steps it committed."""
        self._retire()
        self._admit()
        if not self.active:
            return []
        decoding = [t for t in self.active if not t.machine.prefilling]
        prompting = [t for t in self.active if t.machine.prefilling]
        prompting = prompting if not decoding else prompting[:1]
        for t in decoding:
            t.machine.gamma_cap = None
        chunk = self._chunk(len(decoding), prompting)
        self._plan_guesses(decoding, base_rows=len(decoding) + chunk,
                           shared=bool(prompting) and bool(decoding))
        tickets = [t for t in decoding + prompting if not t.done]
        if not tickets:
            self._retire()
            return []
        rows = [t.machine.rows() for t in decoding if not t.done] + [
            t.machine.rows(chunk if decoding else self._whole_chunk(t)) for t in prompting
            if not t.done]
        ids = torch.tensor([[tok for r in rows for tok in r.tokens]], dtype=torch.long)
        positions = torch.tensor([[r.start + (j if r.offsets is None else r.offsets[j])
                                   for r in rows for j in range(len(r.tokens))]],
                                 dtype=torch.long)
        wanted, offset = [], 0
        for r in rows:
            if r.logits_from is not None:
                wanted.extend(range(offset + r.logits_from, offset + len(r.tokens)))
            offset += len(r.tokens)
        caches = RaggedCaches([t.machine.segment() for t in tickets])
        at = torch.tensor(wanted, dtype=torch.long) if wanted else None
        now = time.perf_counter()
        for t in tickets:
            if t.started_at is None:
                t.started_at = now
        # a batch of greedy requests reads only its rows' greedy tokens: the model gives
        # them instead of logits where it declares greedy_head
        greedy = reads_greedy_tokens(self.model, all(t.machine.sampler.greedy for t in tickets))
        try:
            out = self.model(ids, positions, caches, logits_at=at, **greedy_option(greedy))
        except Exception as exc:  # noqa: BLE001 - the shared forward failed: its requests end
            for t in tickets:
                t.error = exc
            self._retire()
            return []
        seconds = time.perf_counter() - now
        logits = out.logits[0] if out.logits is not None else None
        picked = out.tokens[0] if out.tokens is not None else None
        total = caches.rows
        results, read = [], 0
        for t, r in zip(tickets, rows, strict=True):
            t.machine.wrote()
            n = r.logits_rows
            mine = logits[read: read + n] if n and logits is not None else None
            tokens = picked[read: read + n] if n and picked is not None else None
            read += n
            share = seconds * self.row_cost(len(r.tokens)) / self.row_cost(total)
            ok, step = t.guard(t.machine.accept, mine, seconds, share, tokens=tokens)
            if not ok or step is None:
                continue
            if step.finish is not None:
                t.finished = True
            if t.on_step is not None:
                t.on_step(step)
            results.append((t, step))
        self.last = StepReport(len(tickets), total, sum(s.drafted for _, s in results),
                               sum(len(s.tokens) for _, s in results), seconds,
                               [len(t.machine.proposal.tokens) for t in decoding])
        self._retire()
        return results

    @staticmethod
    def _whole_chunk(t: Ticket) -> int:
        return min(t.machine.chunk, len(t.machine.prompt) - t.machine.prefilled)

    def _chunk(self, decoding: int, prompting: list[Ticket]) -> int:
        """Prompt tokens read this step: a whole chunk when nobody decodes, else the most
        that keeps the step within `prefill_stall` times the cost of the decode rows alone
        (on this machine's cost curve), and at least one."""
        if not prompting:
            return 0
        most = self._whole_chunk(prompting[0])
        if not decoding:
            return most
        if self.config.max_step_rows is not None:
            return max(1, min(most, self.config.max_step_rows - decoding))
        budget = self.config.prefill_stall * self.row_cost(decoding)
        n = 1
        while n < most and self.row_cost(decoding + n + 1) <= budget:
            n += 1
        return n

    def _plan_guesses(self, decoding: list[Ticket], base_rows: int, shared: bool) -> None:
        """Every decoding request's guesses for this step. Drafters without a model propose
        first; with two or more requests (or one beside a prompt chunk, under a row budget)
        the controller then trims the guesses of those that let it choose and caps their
        draft models' γ; then draft models draft, those sharing a model together
        (drafting.py)."""
        budgeted = self.config.max_step_rows is not None and shared
        adaptive = self.config.adaptive and (len(decoding) > 1 or budgeted)
        chosen = [t for t in decoding if adaptive and t.machine.adaptive]
        chosen_ids = {id(t) for t in chosen}
        later = [t for t in decoding if t.machine.drafts_with_model
                 and (id(t) in chosen_ids or batchable_drafter(t.machine))]
        later_ids = {id(t) for t in later}
        for t in decoding:
            if id(t) not in later_ids:
                t.guard(t.machine.propose)
        chosen = [t for t in chosen if not t.done]
        if chosen:
            self._control(decoding, chosen, base_rows)
        groups: dict[int, list[tuple[Ticket, int]]] = {}
        for t in later:
            if t.done:
                continue
            if not batchable_drafter(t.machine):
                t.guard(t.machine.propose)
                continue
            ok, gamma = t.guard(t.machine.draft_length)
            if ok:
                groups.setdefault(id(t.machine.proposer.model), []).append((t, gamma))
        for group in groups.values():
            self._draft(group)

    def _control(self, decoding: list[Ticket], chosen: list[Ticket], base_rows: int) -> None:
        """The controller's counts for `chosen`: trims a deterministic drafter's guesses,
        caps a draft model's γ before it drafts."""
        offers = []
        for t in chosen:
            m = t.machine
            offers.append(Offer([m.guess_acceptance()] * m.offered(), m.guess_cost()))
        fixed_rows = sum(len(t.machine.proposal.tokens) for t in decoding
                         if not t.machine.drafts_with_model and t not in chosen)
        most = self.config.max_step_cost
        bound = None if most is None else most * self.row_cost(len(decoding))
        if self.config.max_step_rows is not None:
            bound = self.row_cost(self.config.max_step_rows)
        counts = allocate(offers, base_rows + fixed_rows, float(len(decoding)), self.row_cost,
                          bound)
        for t, n in zip(chosen, counts, strict=True):
            if t.machine.drafts_with_model:
                t.machine.gamma_cap = n
            else:
                t.machine.trim(n)

    def _draft(self, group: list[tuple[Ticket, int]]) -> None:
        """Requests sharing a draft model draft together; each is charged its share."""
        machines = [t.machine for t, _ in group]
        try:
            seconds = draft_together(machines, [g for _, g in group])
        except Exception as exc:  # noqa: BLE001 - the shared draft forward failed
            for t, _ in group:
                t.error = exc
            return
        drafting = [m for m, (_, g) in zip(machines, group, strict=True) if g > 0]
        for m in drafting:
            m.timer.seconds["draft"] = m.timer.seconds.get("draft", 0.0) + (
                seconds / len(drafting))

    # ---------------------------------------------------------------- driving it
    def run(self) -> Iterator[tuple[Ticket, Step]]:
        """Step until every submitted request is done."""
        while not self.idle:
            yield from self.step()
            self._retire()
