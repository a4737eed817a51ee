"""`Engine.generate_many`: several prompts decoded together, from Python.

    results = engine.generate_many(["Write quicksort", "Explain RoPE"], parallel=4,
                                   method="speculative", draft="prompt-lookup", gamma="auto")

Up to `parallel` requests share each target forward (scheduler.py); the rest wait and join
as others finish. Each `Result` is what `engine.generate` gives for that prompt alone
wherever the kernels are batch invariant (docs/serving.md, "Many users at once"); its
`seconds` run from the start of the call to the request's last token. A method that cannot
share a forward runs the prompts one after another.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from draftsman.batching.scheduler import BatchConfig, BatchScheduler
from draftsman.errors import InvalidArgumentError


def generate_many(engine: Any, prompts: Sequence[Any], *, parallel: int = 4,
                  prefill_chunk: int = 128, **kwargs: Any) -> list[tuple[Any, list, float]]:
    """(request, events, seconds) per prompt, in order (`Engine.generate_many` makes the
    Results); `None` in place of the list when the method cannot share a forward."""
    from draftsman.profiling import verify_cost_curve

    if parallel < 1:
        raise InvalidArgumentError(f"parallel must be >= 1, got {parallel}")
    requests = [engine.prepare(p, **kwargs) for p in prompts]
    model = engine.target.model
    if not requests:
        return []
    if not (all(r.strategy.batchable for r in requests)
            and model.capabilities.has("ragged_batches")):
        return [(r, None, 0.0) for r in requests]
    curve = verify_cost_curve(engine, 64)
    scheduler = BatchScheduler(model, BatchConfig(max_batch=parallel,
                                                  prefill_chunk=prefill_chunk),
                               lambda n: curve.get(n, float(n)))
    t0 = time.perf_counter()
    events: list[list[Any]] = [[] for _ in requests]
    ended: list[float] = [0.0] * len(requests)
    waiting = list(range(len(requests)))
    tickets = []

    def join(i: int) -> None:
        request = requests[i]
        event_of = engine.text_events(request.stops)

        def on_step(step, i=i, event_of=event_of) -> None:
            event = event_of(step)
            events[i].append(event)
            if event.finish is not None:
                ticket.finished = True

        def on_end(_, i=i) -> None:
            ended[i] = time.perf_counter() - t0

        ticket = scheduler.submit(request.strategy.steps(
            request.prompt_ids, request.config, prefill_chunk, new_cache=scheduler.new_cache),
            on_step, on_end)
        tickets.append(ticket)

    while waiting or not scheduler.idle:
        while waiting and len(scheduler.active) + scheduler.waiting < parallel:
            join(waiting.pop(0))
        scheduler.step()
    for ticket in tickets:
        if ticket.error is not None:
            raise ticket.error
    return [(r, ev, ended[i]) for i, (r, ev) in enumerate(zip(requests, events, strict=True))]
