"""Whole against half last records, the 0.5B's forwards (896 = 3.5 records wide), A/B by process.

Runs `profile-avx512-huge-pages/forward_rounds.py` (n new rows after 256 cached tokens, one
forward of each n per round) alternately on two source trees, `--old` (whole records: the
commit before half records) and `--new` (this tree), `--runs` times each per dtype, so that a
slow spell of the machine falls on both; each process loads the model and times `--rounds`
rounds. Reports per build the best forward over all its runs, the median over all its rounds,
and the median over its rounds of each round's L(n) / L(1).

    python bench-results/profile-avx512-half-records/half_ab.py --old /tmp/old/src \\
        --dtypes q4-draft,q4,q8 --runs 3 --rounds 15 --out bench-results/profile-avx512-half-records
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = HERE.parent / "profile-avx512-huge-pages" / "forward_rounds.py"


def run(src: str, model: str, dtype: str, lengths: str, rounds: int, out: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=src)
    subprocess.run([sys.executable, str(ROUNDS), "--model", model, "--dtype", dtype,
                    "--lengths", lengths, "--rounds", str(rounds), "--out", str(out)],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["rounds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="src folder of the whole-record build")
    p.add_argument("--new", default=str(HERE.parents[1] / "src"))
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--dtypes", default="q4-draft,q4,q8")
    p.add_argument("--lengths", default="1,2,4,8,16")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=str(HERE))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = a.lengths.split(",")
    summary = {}
    for dtype in a.dtypes.split(","):
        got: dict[str, list[dict]] = {"whole": [], "half": []}
        for i in range(a.runs):
            for name, src in (("whole", a.old), ("half", a.new)):
                got[name] += run(src, a.model, dtype, a.lengths, a.rounds,
                                 out / f"rounds-{dtype}-{name}-{i}.json")
        print(f"\n{a.model} {dtype}: {a.runs} runs x {a.rounds} rounds per build, alternated")
        print("| records | " + " | ".join(f"n={n} best / median ms" for n in lengths)
              + " | v(8) | v(16) |")
        print("|---|" + "---|" * (len(lengths) + 2))
        summary[dtype] = {}
        for name, rounds in got.items():
            best = {n: min(r[n] for r in rounds) * 1e3 for n in lengths}
            med = {n: statistics.median(r[n] for r in rounds) * 1e3 for n in lengths}
            ratio = {n: statistics.median(r[n] / r["1"] for r in rounds) for n in lengths}
            summary[dtype][name] = {"best_ms": best, "median_ms": med, "v_median_of_rounds": ratio}
            cells = " | ".join(f"{best[n]:.1f} / {med[n]:.1f}" for n in lengths)
            print(f"| {name} | {cells} | {ratio.get('8', float('nan')):.2f} "
                  f"| {ratio.get('16', float('nan')):.2f} |")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
