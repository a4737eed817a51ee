"""Per-forward sums of the records calls' timing (patches/call-timing.patch, printed at exit
with DRAFTSMAN_XP_TIMING=1) for each row count of one fwd_rows.py run:
python call_table.py FILE (the raw file: runs headed by '== time model dtype'). A
shape's calls a forward: its calls over the logits calls of that row count."""

import sys
from collections import defaultdict


def runs(path: str):
    head, lines = None, []
    with open(path) as f:
        text = f.read().splitlines(keepends=True)
    for line in text:
        if line.startswith("=="):
            if head:
                yield head, lines
            head, lines = line.split()[1:], []
        else:
            lines.append(line)
    if head:
        yield head, lines


def main() -> None:
    for head, lines in runs(sys.argv[1]):
        curve = next(ln.strip() for ln in lines if ln[0].isdigit() and ":" in ln.split()[0])
        print(f"{' '.join(head)}  forward ms {curve}")
        per_rows = defaultdict(lambda: defaultdict(float))
        rows_of = [ln.split("|") for ln in lines if "|" in ln and not ln.startswith("qtype")]
        # forwards of each row count: its logits calls (the widest product, once a forward)
        widest = max(int(key.split()[1]) for key, *_ in rows_of)
        forwards = {int(key.split()[3]): float(calls) for key, calls, *_ in rows_of
                    if int(key.split()[1]) == widest}
        for ln in lines:
            if "|" not in ln or ln.startswith("qtype"):
                continue
            key, calls, times, _ = (part.split() for part in ln.split("|"))
            rows = int(key[3])
            count = round(float(calls[0]) / forwards[rows])
            call, s0, s1, w0, w1, join = map(float, times)
            t = per_rows[rows]
            t["calls"] += count
            t["products"] += call * count / 1e3
            t["start"] += (s0 + s1) / 2 * count / 1e3
            t["uneven"] += abs(w0 - w1) / 2 * count / 1e3
            t["join"] += join * count / 1e3
        for rows, t in sorted(per_rows.items()):
            print(f"  {rows:2d} rows: {t['calls']:.0f} calls, products {t['products']:.2f} ms, "
                  f"of it start (fork, quantise, barrier) {t['start']:.2f}, threads' uneven ends "
                  f"{t['uneven']:.2f}, join {t['join']:.2f}")


if __name__ == "__main__":
    main()
