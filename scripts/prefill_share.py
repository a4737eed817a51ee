#!/usr/bin/env python3
"""Why a speedup is capped when prefill is included: per set of a `draftsman bench` run,
llama.cpp's prefill share f, the default's decode-only speedup D over our autoregressive
decoding, the prediction 1/(f + (1-f)/D) against the measured ratio to llama.cpp's plain
loop, and the D a 1.5x overall speedup would need (`draftsman.bench.prefill_share`, the
table docs/results.md generates with `table=prefill`).

    scripts/prefill_share.py bench-results/cpu-llama-cpp-avx2/results.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsman.bench.prefill_share import GOAL, prefill_table
from draftsman.bench.tables import table_md


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench run's results.jsonl")
    parser.add_argument("--label-prefix", default="default", help="the contestant to explain")
    parser.add_argument("--goal", type=float, default=GOAL, help="the overall speedup wanted")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line]
    print(table_md(prefill_table(rows, args.label_prefix, args.goal)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
