"""The 1.5B q4 forward-cost curve from interleaved rounds, three ways, on a noisy machine.

As `draftsman profile` times it (n new rows after 256 cached tokens, a tree-style bool mask,
logits on every row, one forward of each n per round), but with more rounds, and reported
as the best forward per n, the median per n (what the profile records), and the median over
rounds of each round's L(n) / L(1): a slow spell of the machine that lasts longer than a
round (~0.5 s) slows every n of that round alike, so the per-round ratio is the statistic
it disturbs least. Raw times go to the JSON file named by --out.

    python bench-results/profile-avx512-huge-pages/forward_rounds.py --rounds 40 --out rounds.json
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
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--dtype", default="q4")
    p.add_argument("--lengths", default="1,2,4,6,8,12,16")
    p.add_argument("--rounds", type=int, default=40)
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
    rounds: list[dict[int, float]] = []
    with torch.inference_mode():
        for r in range(a.rounds + 1):  # round 0 warms up
            times = {}
            for n, (tokens, pos, mask) in inputs.items():
                cache.truncate(context)
                t0 = time.perf_counter()
                model(tokens, pos, cache, mask=mask)
                times[n] = time.perf_counter() - t0
            if r:
                rounds.append(times)
    best = {n: min(t[n] for t in rounds) for n in lengths}
    median = {n: statistics.median(t[n] for t in rounds) for n in lengths}
    ratio = {n: statistics.median(t[n] / t[1] for t in rounds) for n in lengths}
    print(f"{a.model} {a.dtype}, {a.threads} threads, {a.rounds} rounds")
    print("| rows | best ms | median ms | v(n) from best | v(n) from medians "
          "| v(n), median of rounds |")
    print("|---|---|---|---|---|---|")
    for n in lengths:
        print(f"| {n} | {best[n] * 1e3:.1f} | {median[n] * 1e3:.1f} | {best[n] / best[1]:.2f} "
              f"| {median[n] / median[1]:.2f} | {ratio[n]:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "dtype": a.dtype, "threads": a.threads, "context": context,
                       "rounds": [{str(n): t for n, t in r.items()} for r in rounds]}, f, indent=1)


if __name__ == "__main__":
    main()
