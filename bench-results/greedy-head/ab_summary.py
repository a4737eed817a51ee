#!/usr/bin/env python3
"""tok/s per method of each run in an ab_bench.sh folder (new tokens / seconds summed over the
run's prompts, as summary.md's tok/s), and the medians of each side.

    python3 ab_summary.py bench
"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

folder = Path(sys.argv[1])
sides: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
for run in sorted(p for p in folder.iterdir() if p.is_dir()):
    tokens, seconds = defaultdict(float), defaultdict(float)
    for line in (run / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        tokens[row["method"]] += row["new_tokens"]
        seconds[row["method"]] += row["seconds"]
    rates = {m: tokens[m] / seconds[m] for m in tokens}
    side = run.name.split("-")[0]
    for m, r in rates.items():
        sides[side][m].append(r)
    print(run.name, "  ".join(f"{m} {r:.2f}" for m, r in rates.items()))
for side, methods in sides.items():
    print(side, "medians:", "  ".join(f"{m} {statistics.median(v):.2f}" for m, v in methods.items()))
