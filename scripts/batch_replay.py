#!/usr/bin/env python3
"""The server's step scheduler alone, in process: `--users` closed-loop users over the load
benchmark's prompts (`draftsman loadtest`'s datasets), no HTTP. Reports wall time, tokens/s
and what the steps held (rows, guess rows, tokens committed): the step count does not move
with the hour's speed, so scheduling policies compare on it beside the wall time.

    scripts/batch_replay.py --users 4 --max-step-rows 16
    scripts/batch_replay.py --users 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import draftsman
from draftsman.batching.scheduler import BatchConfig, BatchScheduler
from draftsman.cli.loadtest_cmd import DEFAULT_DATASETS, load_prompts
from draftsman.profiling import verify_cost_curve


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--dtype", default="q4")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--users", type=int, default=4, help="requests decoding together")
    p.add_argument("--limit", type=int, default=4, help="prompts per dataset")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-step-rows", type=int, default=None)
    p.add_argument("--method", default="speculative")
    p.add_argument("--draft", default="prompt-lookup")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    engine = draftsman.load(a.target, dtype=a.dtype, threads=a.threads, backend="torch")
    options = {} if a.method == "autoregressive" else {"draft": a.draft, "gamma": "auto"}
    requests = [engine.prepare(m, method=a.method, max_new_tokens=a.max_tokens, **options)
                for m in load_prompts(list(DEFAULT_DATASETS), a.limit)]
    curve = verify_cost_curve(engine, 64)
    scheduler = BatchScheduler(engine.target.model, BatchConfig(
        max_batch=a.users, max_step_rows=a.max_step_rows),
        lambda n: curve.get(n, float(n)))
    waiting, steps, tokens = list(range(len(requests))), [], 0
    start = time.perf_counter()
    while waiting or not scheduler.idle:
        while waiting and len(scheduler.active) + scheduler.waiting < a.users:
            r = requests[waiting.pop(0)]
            scheduler.submit(r.strategy.steps(r.prompt_ids, r.config, 128,
                                              new_cache=scheduler.new_cache))
        scheduler.last = None
        tokens += sum(len(s.tokens) for _, s in scheduler.step())
        if scheduler.last is not None:  # a forward ran
            steps.append(scheduler.last)
    wall = time.perf_counter() - start
    prompt_rows = sum(len(r.prompt_ids) for r in requests)
    rows = [s.rows for s in steps]
    print(f"{a.users} users, row budget {a.max_step_rows}, "
          f"{len(requests)} requests, {prompt_rows} prompt tokens")
    print(f"wall {wall:.1f} s, {tokens / wall:.1f} tok/s, {len(steps)} steps "
          f"(rows mean {statistics.mean(rows):.1f}, max {max(rows)}), "
          f"guess rows {sum(s.guesses for s in steps)}, committed {tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
