"""The per-set breakdown of a benchmark: every contestant's speed on each set, and on each
turn of a multi-turn set, since a second turn (revise the first answer) copies far more
than a first one.

A set is a dataset, split by turn when its rows have more than one ("mt-bench turn 1",
"mt-bench turn 2"). Sets are listed copy-heavy first, then free generation, then the rest,
each group in first-measured order. Speedups are over the same prompts only (`summarise`):
vs autoregressive decoding, and vs llama.cpp's plain loop when that peer ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftsman.bench.datasets import workload
from draftsman.bench.metrics import Row, summarise
from draftsman.bench.peer_llama_cpp import label as llama_cpp_label
from draftsman.bench.tables import Table, num, pct, times

LLAMA_CPP_PLAIN = llama_cpp_label("plain")
_ORDER = {"copy-heavy": 0, "free generation": 1}


@dataclass(frozen=True)
class SetRows:
    name: str  # "grammar", "mt-bench turn 2"
    workload: str  # "copy-heavy", "free generation" or "other"
    rows: list[Row]


def set_groups(rows: list[Row]) -> list[SetRows]:
    turns: dict[str, set[int]] = {}
    for r in rows:
        turns.setdefault(r.get("dataset", ""), set()).add(int(r.get("turn", 1)))
    groups: dict[tuple[str, int], list[Row]] = {}
    for r in rows:
        dataset, turn = r.get("dataset", ""), int(r.get("turn", 1))
        groups.setdefault((dataset, turn if len(turns[dataset]) > 1 else 0), []).append(r)
    out = [SetRows(f"{d} turn {t}" if t else d, workload(d, max(t, 1)), g)
           for (d, t), g in groups.items()]
    return sorted(out, key=lambda s: _ORDER.get(s.workload, 2))  # stable: measured order


def set_summaries(rows: list[Row], baseline: str = "autoregressive") -> list[dict[str, Any]]:
    """One record per (set, contestant): tok/s, speedups, α, identical share."""
    out = []
    for group in set_groups(rows):
        vs_plain = {s.label: s for s in summarise(group.rows, LLAMA_CPP_PLAIN)} \
            if any(r["label"] == LLAMA_CPP_PLAIN for r in group.rows) else {}
        for s in summarise(group.rows, baseline):
            peer = vs_plain.get(s.label)
            out.append({"set": group.name, "workload": group.workload, "label": s.label,
                        "prompts": s.prompts, "tokens_per_second": s.tokens_per_second,
                        "speedup": s.speedup,
                        "speedup_vs_llama_cpp": peer.speedup if peer else None,
                        "alpha": s.alpha, "identical_rate": s.identical_rate})
    return out


def set_table(rows: list[Row], baseline: str = "autoregressive") -> Table | None:
    records = set_summaries(rows, baseline)
    if len({r["set"] for r in records}) < 2:
        return None
    with_peer = any(r["speedup_vs_llama_cpp"] is not None for r in records)
    headers = ["set", "workload", "contestant", "prompts", "tok/s", "vs autoregressive"]
    headers += ["vs llama.cpp"] if with_peer else []
    headers += ["α", "identical"]
    lines = []
    for r in records:
        line = [r["set"], r["workload"], r["label"], str(r["prompts"]),
                num(r["tokens_per_second"]), times(r["speedup"])]
        line += [times(r["speedup_vs_llama_cpp"])] if with_peer else []
        line += [num(r["alpha"]), pct(r["identical_rate"])]
        lines.append(line)
    return Table("Per set and turn", headers, lines,
                 "Copy-heavy sets: the answer repeats much of the prompt (an edited function, "
                 "quotes, a corrected paragraph, a summary, a revised answer); free generation: "
                 "HumanEval completion, MT-Bench's first turn. tok/s counts prompt processing; "
                 "speedups are time per token against the same prompts"
                 + (", vs llama.cpp: over llama.cpp's own plain loop." if with_peer else "."))
