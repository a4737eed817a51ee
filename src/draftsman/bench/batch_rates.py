"""Aggregate decoding rate of the batched path at several levels of concurrency, without a
server: `Engine.generate_many` (one shared forward per step) over the same prompts at each
`--parallel` value, per method. The GPU check's batched stage (a GPU machine has no FastAPI,
so the server's load test cannot run there); on the CPU it runs as well.

    python -m draftsman.bench.batch_rates --target FOLDER --device cuda --parallel 1,4,8 \
        --dataset humaneval,mt-bench --limit 4 --max-new-tokens 64 --out rates.json

Each level generates for every prompt, `parallel` of them at a time; its rate is all new
tokens over the wall time of the call (prefills included, as a server's clients see it).
Levels run in rounds, one call of each per round, so a slow spell of the machine spreads
over all of them. Rows are written to `--out` as they come.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import draftsman
from draftsman.bench.datasets import load_dataset
from draftsman.errors import InvalidArgumentError

METHODS = ("autoregressive", "speculative:draft=prompt-lookup,gamma=auto")


def method_kwargs(spec: str) -> dict[str, Any]:
    """`speculative:draft=prompt-lookup,gamma=auto` -> generate's keywords."""
    name, _, options = spec.partition(":")
    kwargs: dict[str, Any] = {"method": name}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidArgumentError(f"{spec!r}: options are KEY=VALUE")
        kwargs[key] = value
    return kwargs


def rates(engine: Any, prompts: list[str], levels: list[int], methods: list[str],
          max_new_tokens: int, rounds: int, out: Path | None) -> list[dict[str, Any]]:
    """One row per (method, level): tokens, the median wall seconds over `rounds`, tok/s."""
    for spec in methods:  # warm-up: kernels, graphs and profiles outside the timed calls
        engine.generate_many(prompts[:2], parallel=2, max_new_tokens=8, **method_kwargs(spec))
    seconds: dict[tuple[str, int], list[float]] = {}
    tokens: dict[tuple[str, int], int] = {}
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        for spec in methods:
            for level in levels:
                t0 = time.perf_counter()
                results = engine.generate_many(prompts, parallel=level,
                                               max_new_tokens=max_new_tokens,
                                               **method_kwargs(spec))
                seconds.setdefault((spec, level), []).append(time.perf_counter() - t0)
                tokens[(spec, level)] = sum(len(x.token_ids) for x in results)
                print(f"batch_rates: round {r + 1}/{rounds} {spec} x{level}: "
                      f"{tokens[(spec, level)] / seconds[(spec, level)][-1]:.1f} tok/s",
                      file=sys.stderr, flush=True)
    for (spec, level), times in seconds.items():
        wall = statistics.median(times)
        rows.append({"method": spec, "parallel": level, "prompts": len(prompts),
                     "tokens": tokens[(spec, level)], "seconds": wall,
                     "tok_s": tokens[(spec, level)] / wall})
    if out is not None:
        out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    one = {r["method"]: r["tok_s"] for r in rows if r["parallel"] == 1}
    lines = ["| method | parallel | tok/s | × one at a time |", "|---|---|---|---|"]
    for r in rows:
        base = one.get(r["method"])
        lines.append(f"| {r['method']} | {r['parallel']} | {r['tok_s']:.1f} | "
                     f"{r['tok_s'] / base:.2f}× |" if base else
                     f"| {r['method']} | {r['parallel']} | {r['tok_s']:.1f} | – |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="catalogue name or model folder")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--backend", default="torch", choices=["torch", "llama.cpp"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--parallel", default="1,4,8", help="levels of concurrency")
    p.add_argument("--methods", default=";".join(METHODS), help="';'-separated method specs")
    p.add_argument("--dataset", default="humaneval,mt-bench")
    p.add_argument("--limit", type=int, default=4, help="prompts per dataset")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="write the rows here (JSON)")
    args = p.parse_args(argv)
    try:
        levels = [int(x) for x in args.parallel.split(",") if x.strip()]
    except ValueError:
        raise InvalidArgumentError(f"--parallel wants integers, got {args.parallel!r}") from None
    if not levels or min(levels) < 1:
        raise InvalidArgumentError(f"--parallel wants integers >= 1, got {args.parallel!r}")
    prompts = [x.text for name in args.dataset.split(",") if name
               for x in load_dataset(name, limit=args.limit)]
    if not prompts:
        raise InvalidArgumentError("the datasets gave no prompts")
    # the batched path itself: static steps (a GPU's default) hold one sequence per cache
    engine = draftsman.load(args.target, dtype=args.dtype, backend=args.backend,
                            device=args.device, threads=args.threads, static=False)
    rows = rates(engine, prompts, levels, [m for m in args.methods.split(";") if m],
                 args.max_new_tokens, args.rounds, args.out)
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, "
          f"{engine.device}:\n\n{table(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
