"""Why a speedup is capped when prefill is included, per set of a `draftsman bench` run.

For one contestant (the default configuration unless named): llama.cpp's prefill share f of
its time (seconds to the first token / seconds), the contestant's decode-only speedup D over
our autoregressive decoding (time per token after the first), the prediction
1/(f + (1 − f)/D) against the measured ratio to llama.cpp's plain loop, and the D that an
overall speedup of `goal` would need ((1 − f)/(1/goal − f); unreachable when f ≥ 1/goal).
The run needs autoregressive decoding and llama.cpp's plain loop (`--peer llama.cpp:plain`).
"""

from __future__ import annotations

from draftsman.bench.metrics import Row
from draftsman.bench.set_report import LLAMA_CPP_PLAIN, set_groups
from draftsman.bench.tables import Table, num, times

GOAL = 1.5


def _totals(rows: list[Row]) -> list[float]:
    """Σ seconds, Σ seconds to the first token, Σ new tokens, Σ prompt tokens, rows."""
    return [sum(r["seconds"] for r in rows), sum(r.get("ttft_seconds") or 0.0 for r in rows),
            sum(r["new_tokens"] for r in rows), sum(r["prompt_tokens"] for r in rows),
            float(len(rows))]


def prefill_table(rows: list[Row], contestant: str = "default", goal: float = GOAL) -> Table:
    """One line per set (as the per-set table orders them) for the first label that starts
    with `contestant`."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    ours = next((label for label in labels if label.startswith(contestant)), None)
    missing = [name for name, label in (("autoregressive", "autoregressive"),
                                        (LLAMA_CPP_PLAIN, LLAMA_CPP_PLAIN),
                                        (contestant, ours)) if label not in labels]
    if missing:
        raise ValueError(f"prefill share needs rows labelled {', '.join(missing)}")
    lines = []
    for group in set_groups(rows):
        ar, me, lp = (_totals([r for r in group.rows if r["label"] == label])
                      for label in ("autoregressive", ours, LLAMA_CPP_PLAIN))
        n = ar[4]
        f = lp[1] / lp[0]
        ar_step = (ar[0] - ar[1]) / (ar[2] - n)
        d = ar_step / ((me[0] - me[1]) / (me[2] - n))
        need = (times((1 - f) / (1 / goal - f)) if f < 1 / goal
                else f"unreachable (f ≥ {1 / goal:.2f})")
        lines.append([group.name, f"{ar[3] / n:.0f}", num(1000 * ar[1] / ar[3], 1),
                      num(1000 * ar_step, 1), num(f), times(d), times(1 / (f + (1 - f) / d)),
                      times((lp[0] / lp[2]) / (me[0] / me[2])), need])
    return Table(f"Prefill share ({ours})",
                 ["set", "prompt tokens", "ms/prompt token", "ms/decode step",
                  "prefill share f", "decode speedup D", "predicted", "measured",
                  f"D needed for {goal:g}×"], lines,
                 "ms/prompt token and ms/decode step: our autoregressive decoding; f: "
                 "llama.cpp's plain loop; predicted: 1/(f + (1 − f)/D); measured: the "
                 "contestant's tokens/s over llama.cpp's plain loop's.")
