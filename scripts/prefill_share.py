#!/usr/bin/env python3
"""Why a speedup is capped when prefill is included: per set of a `draftsman bench` run,
llama.cpp's prefill share f, the default's decode-only speedup D over our autoregressive
decoding, the prediction 1/(f + (1-f)/D) against the measured ratio to llama.cpp's plain
loop, and the D a 1.5x overall speedup would need.

    scripts/prefill_share.py bench-results/cpu-llama-cpp-avx2/results.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

GOAL = 1.5


def set_name(row: dict) -> str:
    return f"mt-bench turn {row['turn']}" if row["dataset"] == "mt-bench" else row["dataset"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench run's results.jsonl")
    parser.add_argument("--label-prefix", default="default", help="the contestant to explain")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line]
    # (set, label) -> [seconds, seconds to the first token, new tokens, prompt tokens, prompts]
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 5)
    for r in rows:
        t = totals[(set_name(r), r["label"])]
        for i, v in enumerate((r["seconds"], r.get("ttft_seconds") or 0.0, r["new_tokens"],
                               r["prompt_tokens"], 1)):
            t[i] += v
    ours = next(label for _, label in totals if label.startswith(args.label_prefix))
    print("| set | prompt tokens | ms/prompt token | ms/decode step | prefill share f | D "
          "| predicted | measured | D needed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(s for s, _ in totals):
        ar, me, lp = (totals[(name, k)] for k in ("autoregressive", ours, "llama.cpp"))
        n = ar[4]
        f = lp[1] / lp[0]
        ar_step = (ar[0] - ar[1]) / (ar[2] - n)
        d = ar_step / ((me[0] - me[1]) / (me[2] - n))
        predicted = 1 / (f + (1 - f) / d)
        measured = (lp[0] / lp[2]) / (me[0] / me[2])
        need = f"{(1 - f) / (1 / GOAL - f):.2f}x" if f < 1 / GOAL else "unreachable"
        print(f"| {name} | {ar[3] / n:.0f} | {1000 * ar[1] / ar[3]:.1f} | "
              f"{1000 * ar_step:.1f} | {f:.2f} | {d:.2f}x | {predicted:.2f}x | "
              f"{measured:.2f}x | {need} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
