"""One model's forward-cost curve on two 8-bit kernels, interleaved in one process.

The model is loaded twice, once per value of DRAFTSMAN_INT8_KERNEL (weight_formats.int8_kernel:
"records" or "onednn"), and each round times one forward of every n on each copy in turn, as
`draftsman profile` times it (n new rows after 256 cached tokens, a tree-style bool mask,
logits on every row). On a machine whose speed drifts by tens of percent within minutes,
only times taken side by side compare. Reported per kernel: the best forward per n, the
median per n, and the median over rounds of each round's L(n) / L(1).

    python bench-results/profile-avx512-q8-records/kernel_rounds.py \
        --model qwen2.5-coder-0.5b-instruct --dtype q4 --rounds 30 --out rounds.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model

CONTEXT = 256


def load(name: str, dtype: str, kernel: str):
    os.environ["DRAFTSMAN_INT8_KERNEL"] = kernel  # read once per matrix, at load
    model = load_model(resolve_model(name, pull=False), dtype, gguf=resolve_gguf(name, pull=False))
    print(f"{kernel}: {model.quant_summary}", flush=True)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--dtype", default="q4")
    p.add_argument("--kernels", default="onednn,records")
    p.add_argument("--lengths", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    kernels = a.kernels.split(",")
    models = {k: load(a.model, a.dtype, k) for k in kernels}
    lengths = [int(n) for n in a.lengths.split(",")]
    gen = torch.Generator().manual_seed(0)
    vocab = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(0, vocab, (1, CONTEXT), generator=gen)
    caches = {}
    for k, model in models.items():
        caches[k] = model.new_cache(CONTEXT + max(lengths) + 1)
        model(prompt, torch.arange(CONTEXT)[None], caches[k])
    inputs = {n: (torch.randint(0, vocab, (1, n), generator=gen),
                  torch.arange(CONTEXT, CONTEXT + n)[None],
                  torch.ones(n, n, dtype=torch.bool).tril()) for n in lengths}
    rounds: dict[str, list[dict[int, float]]] = {k: [] for k in kernels}
    with torch.inference_mode():
        for r in range(a.rounds + 1):  # round 0 warms up
            for k, model in models.items():
                times = {}
                for n, (tokens, pos, mask) in inputs.items():
                    caches[k].truncate(CONTEXT)
                    t0 = time.perf_counter()
                    model(tokens, pos, caches[k], mask=mask)
                    times[n] = time.perf_counter() - t0
                if r:
                    rounds[k].append(times)
    print(f"{a.model} {a.dtype}, {a.threads} threads, {a.rounds} rounds, kernels interleaved")
    print("| kernel | n | best ms | median ms | v(n) of bests | median of per-round v(n) |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for k in kernels:
        best = {n: min(t[n] for t in rounds[k]) for n in lengths}
        median = {n: statistics.median(t[n] for t in rounds[k]) for n in lengths}
        ratio = {n: statistics.median(t[n] / t[1] for t in rounds[k]) for n in lengths}
        summary[k] = {"best_ms": {n: 1e3 * v for n, v in best.items()},
                      "median_ms": {n: 1e3 * v for n, v in median.items()},
                      "ratio_median": ratio}
        for n in lengths:
            print(f"| {k} | {n} | {1e3 * best[n]:.1f} | {1e3 * median[n]:.1f} | "
                  f"{best[n] / best[1]:.2f} | {ratio[n]:.2f} |")
    one = {k: statistics.median(t[1] for t in rounds[k]) for k in kernels}
    if len(kernels) == 2:
        a_, b_ = kernels
        per_round = statistics.median(x[1] / y[1] for x, y in zip(rounds[a_], rounds[b_], strict=True))
        print(f"one row, median of per-round {a_} / {b_}: {per_round:.2f} "
              f"(medians {1e3 * one[a_]:.1f} / {1e3 * one[b_]:.1f} ms)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "dtype": a.dtype, "threads": a.threads,
                       "summary": summary,
                       "rounds": {k: [{str(n): t for n, t in r.items()} for r in v]
                                  for k, v in rounds.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
