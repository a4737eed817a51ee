"""Medians and paired differences of code_ab.sh's alternated q4_step_breakdown runs:
python summ.py FILE (the step's median ms per build and row count)."""

import re
import statistics
import sys
from pathlib import Path


def main() -> None:
    build, medians = None, {}
    for line in Path(sys.argv[1]).read_text().splitlines():
        if m := re.match(r"=== round (\d+) (\w+)", line):
            build = m.group(2)
        elif (m := re.match(r"\| (\d+) \| ([\d.]+) / ([\d.]+) \|", line)) and build:
            medians.setdefault((build, int(m.group(1))), []).append(float(m.group(3)))
    for key, values in sorted(medians.items()):
        print(key, values, f"median {statistics.median(values):.2f}")
    for rows in sorted({r for _, r in medians}):
        diffs = [b - n for b, n in zip(medians[("base", rows)], medians[("new", rows)],
                                       strict=False)]
        print(rows, "paired base-new:", [round(d, 2) for d in diffs],
              f"median {statistics.median(diffs):.2f}")


if __name__ == "__main__":
    main()
