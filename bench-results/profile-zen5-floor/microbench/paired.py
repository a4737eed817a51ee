"""Paired differences of an ab_env.sh file (lines "ROUND VALUE rows:ms ..."), value 1 minus
value 0 per round, per row count: python paired.py FILE."""

import statistics
import sys
from collections import defaultdict


def main() -> None:
    runs: dict[int, dict[str, dict[int, float]]] = defaultdict(dict)
    with open(sys.argv[1]) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            cells = (c.split(":") for c in parts[2:])
            runs[int(parts[0])][parts[1]] = {int(r): float(ms) for r, ms in cells}
    pairs = [v for v in runs.values() if "0" in v and "1" in v]
    for rows in sorted(pairs[0]["0"]):
        diffs = [v["1"][rows] - v["0"][rows] for v in pairs]
        base = statistics.median(v["0"][rows] for v in pairs)
        new = statistics.median(v["1"][rows] for v in pairs)
        print(f"rows {rows}: median 0 {base:.2f} 1 {new:.2f}  paired diff median "
              f"{statistics.median(diffs):+.2f} mean {statistics.mean(diffs):+.2f} "
              f"({sum(d < 0 for d in diffs)}/{len(diffs)} faster)")


if __name__ == "__main__":
    main()
