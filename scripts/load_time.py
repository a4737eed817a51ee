#!/usr/bin/env python3
"""Load time of q4 / q8 models with the packed-weight cache off and on (models/packed_cache.py).

Each load runs in a fresh process (as a CLI run or a server worker starts), the two ways
alternated round by round, after a first load that packs and writes the entry (timed: the
once-per-model cost), so "on" reads it. Also times a whole `draftsman generate` both ways.
The entries go to a folder of the run's own (DRAFTSMAN_PACKED_DIR), removed at the end.
Prints a markdown table and writes the raw seconds as JSON.

    scripts/load_time.py --out bench-results/load-packed-cache
    scripts/load_time.py --models qwen2.5-coder-0.5b-instruct:q8 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftsman.hardware import cpu_model

LOAD = ("import time, sys; t = time.perf_counter(); "
        "from draftsman.engine import load_bundle; "
        "m = load_bundle(sys.argv[1], sys.argv[2], backend='torch').model; "
        "print(time.perf_counter() - t, m.packed_note)")
GENERATE = ["generate", "Write a Python function that reverses a string.", "--max-new-tokens",
            "16"]


def cache_env(cache: bool) -> dict[str, str]:
    return {**os.environ, "DRAFTSMAN_PACKED_CACHE": "1" if cache else "0"}


def run_load(spec: str, dtype: str, cache: bool) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", LOAD, spec, dtype], env=cache_env(cache),
                         check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    seconds, note = out.split(" ", 1)
    return float(seconds), note


def run_generate(cache: bool) -> float:
    cli = Path(sys.executable).parent / "draftsman"
    t = time.perf_counter()
    subprocess.run([str(cli), *GENERATE], env=cache_env(cache), check=True, capture_output=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qwen2.5-coder-1.5b-instruct:q4,"
                   "qwen2.5-coder-0.5b-instruct:q4-draft,qwen2.5-coder-1.5b-instruct:q8",
                   help="comma-separated NAME:DTYPE (default: the 1.5B q4 and q8, the 0.5B "
                        "q4-draft)")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds (default 3)")
    p.add_argument("--out", type=Path, help="folder for load-time.json")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    pairs = [tuple(m.split(":", 1)) for m in args.models.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        p.error("--models takes NAME:DTYPE items")
    with tempfile.TemporaryDirectory(prefix="draftsman-packed-") as folder:
        os.environ["DRAFTSMAN_PACKED_DIR"] = folder
        seconds = measure(pairs, args.rounds)
    print("| what | first load (packs, writes), s | cache off, s | cache on, s | medians, "
          "off / on |\n|---|---|---|---|---|")
    for what, row in seconds.items():
        off, on = row["off"], row["on"]
        print(f"| {what} | {' / '.join(f'{s:.2f}' for s in row['first'])} | "
              f"{' / '.join(f'{s:.2f}' for s in off)} | "
              f"{' / '.join(f'{s:.2f}' for s in on)} | "
              f"{statistics.median(off):.2f} / {statistics.median(on):.2f} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "load-time.json").write_text(json.dumps(
            {"cpu": cpu_model(), "seconds": seconds, "generate": GENERATE,
             "rounds": args.rounds}, indent=1) + "\n")
    return 0


def measure(pairs: list[tuple[str, str]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Seconds by what was timed: "first" (packs and writes), "off" and "on", alternated."""
    seconds: dict[str, dict[str, list[float]]] = {}
    for spec, dtype in pairs:
        first, note = run_load(spec, dtype, cache=True)
        if not note.startswith("packed at load, kept"):
            raise SystemExit(f"load_time: {spec} {dtype} was not kept: {note}")
        row = seconds.setdefault(f"{spec} {dtype}", {"first": [first], "off": [], "on": []})
        for r in range(rounds):
            for cache in (False, True):
                s, note = run_load(spec, dtype, cache)
                if cache and not note.startswith("read from"):
                    raise SystemExit(f"load_time: {spec} {dtype} did not read its entry: {note}")
                row["on" if cache else "off"].append(s)
            print(f"{spec} {dtype} round {r + 1}: off {row['off'][-1]:.2f} s, "
                  f"on {row['on'][-1]:.2f} s", file=sys.stderr)
    gen = seconds.setdefault("draftsman " + " ".join(GENERATE[:1] + GENERATE[2:]),
                             {"first": [run_generate(cache=True)], "off": [], "on": []})
    for _ in range(rounds):
        for cache in (False, True):
            gen["on" if cache else "off"].append(run_generate(cache))
    return seconds


if __name__ == "__main__":
    raise SystemExit(main())
