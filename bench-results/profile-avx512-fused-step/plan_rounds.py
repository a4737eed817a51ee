"""The module tree against the flat plan of the fused CPU ops (models/fused_cpu_step.py), one
model, one process, interleaved.

Each round times one forward of every n new rows after 256 cached tokens (a tree-style mask,
logits on every row, as `draftsman profile`) with the plan and with the module tree (the
model's `fused_step` answering None), alternately, so a slow spell of the machine falls on
both. Reports best and median ms per n for each, and the median over rounds of each round's
tree / plan ratio.

    python bench-results/profile-avx512-fused-step/plan_rounds.py \\
        --model qwen2.5-coder-0.5b-instruct --dtype q4-draft --rounds 20 --out rounds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--dtype", default="q4-draft")
    p.add_argument("--lengths", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(resolve_model(a.model, pull=False), a.dtype,
                       gguf=resolve_gguf(a.model, pull=False))
    lengths = [int(n) for n in a.lengths.split(",")]
    context, gen = 256, torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = model.new_cache(context + max(lengths) + 1)
    model(torch.randint(0, vocab, (1, context), generator=gen), torch.arange(context)[None], cache)
    inputs = {n: (torch.randint(0, vocab, (1, n), generator=gen),
                  torch.arange(context, context + n)[None],
                  torch.ones(n, n, dtype=torch.bool).tril()) for n in lengths}
    plan_step = model.fused_step

    def forward(n: int, plan: bool) -> float:
        model.fused_step = plan_step if plan else (lambda *args: None)
        tokens, pos, mask = inputs[n]
        cache.truncate(context)
        t0 = time.perf_counter()
        model(tokens, pos, cache, mask=mask)
        return time.perf_counter() - t0

    rounds = []
    with torch.inference_mode():
        for r in range(a.rounds + 1):  # round 0 warms up
            times = {f"{kind}-{n}": forward(n, kind == "plan")
                     for n in lengths for kind in (("plan", "tree") if r % 2 else ("tree", "plan"))}
            if r:
                rounds.append(times)
    print(f"{a.model} {a.dtype}, {a.threads} threads, {a.rounds} rounds")
    print("| rows | tree best / median ms | plan best / median ms "
          "| tree / plan, median of rounds |")
    print("|---|---|---|---|")
    for n in lengths:
        tree = [t[f"tree-{n}"] for t in rounds]
        plan = [t[f"plan-{n}"] for t in rounds]
        ratio = statistics.median(a / b for a, b in zip(tree, plan, strict=True))
        print(f"| {n} | {min(tree) * 1e3:.1f} / {statistics.median(tree) * 1e3:.1f} "
              f"| {min(plan) * 1e3:.1f} / {statistics.median(plan) * 1e3:.1f} | {ratio:.3f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "dtype": a.dtype, "threads": a.threads, "context": context,
                       "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
