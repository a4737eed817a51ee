"""What the cost-model γ controller saw and did, for the benchmark report.

- verify_cost.json (written by the runner when a cost-model method ran): the target's
  measured latency of one forward over n tokens, L(n), on this machine and backend;
- "Verify cost curve" table and verify_cost.png: v(n) = L(n) / L(1) against n (the line
  v = n is what verifying costs when batching buys nothing);
- "Cost-model controller" table: per adaptive method, the share of steps at γ = 0 (plain
  decoding), the mean γ, and predicted against measured tokens per second (predicted: the
  autoregressive baseline's tokens/s times the speedup the analytic model gives for the
  method's measured α, γ, draft cost and verify cost);
- gamma_over_time.png: γ chosen at each step of the first prompt, per adaptive method.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from draftsman.bench.metrics import MethodSummary
from draftsman.bench.tables import Table, num
from draftsman.profiling import engine_profile_path

VERIFY_COST = "verify_cost.json"
VERIFY_PLOT = "verify_cost.png"
GAMMA_PLOT = "gamma_over_time.png"
DPI = 110


def save_verify_cost(out: Path, engine: Any) -> None:
    """Copy the target's verify-latency profile (if one was measured) into the run folder."""
    src = engine_profile_path(engine)
    if src.is_file():
        shutil.copyfile(src, Path(out) / VERIFY_COST)


def load_latency(out: Path) -> dict[int, float] | None:
    path = Path(out) / VERIFY_COST
    if not path.is_file():
        return None
    return {int(k): float(v) for k, v in json.loads(path.read_text())["latency"].items()}


def _adaptive(summaries: list[MethodSummary]) -> list[MethodSummary]:
    return [s for s in summaries if s.kind == "draftsman"
            and str(s.options.get("gamma", "")) == "auto"]


def controller_tables(out: Path, rows: list[dict], summaries: list[MethodSummary],
                      baseline: str = "autoregressive") -> list[Table]:
    tables = []
    latency = load_latency(out)
    if latency:
        one = latency[min(latency)]
        body = [[str(n), num(sec * 1000, 1), num(sec / one), num(n / sec, 1)]
                for n, sec in sorted(latency.items())]
        tables.append(Table("Verify cost curve", ["tokens n", "ms per forward",
                                                  "v(n) = L(n)/L(1)", "tokens/s in batch"],
                            body, "the target's forward over n new tokens on this machine "
                                  "and backend, measured once and cached; the cost-model γ "
                                  "controller plans with it"))
    base = next((s for s in summaries if s.label == baseline), None)
    adaptive = _adaptive(summaries)
    if adaptive and base is not None and base.tokens_per_second:
        body = []
        for s in adaptive:
            gammas = [g for r in rows if r.get("label") == s.label for g in r.get("gammas", [])]
            zero = sum(g == 0 for g in gammas) / len(gammas) if gammas else None
            predicted = (base.tokens_per_second * s.predicted_speedup_hw
                         if s.predicted_speedup_hw else None)
            body.append([s.label, s.drafter or "—", num(s.alpha), num(s.gamma),
                         f"{zero:.0%}" if zero is not None else "—",
                         num(predicted, 1), num(s.tokens_per_second, 1)])
        tables.append(Table("Cost-model controller", ["method", "drafter", "α", "mean γ",
                                                      "steps at γ=0", "predicted tok/s",
                                                      "measured tok/s"], body,
                            "γ = 0 is plain decoding: the controller speculates only when "
                            "(1-α^(γ+1))/(1-α) / (γc + v(γ+1)) beats 1"))
    return tables


def controller_plots(out: Path, rows: list[dict], summaries: list[MethodSummary]) -> list[Path]:
    written = []
    latency = load_latency(out)
    path = Path(out) / VERIFY_PLOT
    if latency:
        one = latency[min(latency)]
        ns = sorted(latency)
        fig = Figure(figsize=(5.5, 4))
        ax = fig.subplots()
        ax.plot(ns, [latency[n] / one for n in ns], "o-", label="measured v(n)")
        ax.plot(ns, ns, ":", color="gray", label="v(n) = n (no batching gain)")
        ax.set_xlabel("tokens verified in one forward (n)")
        ax.set_ylabel("cost relative to one token")
        ax.set_title("Verify cost curve")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
        written.append(path)
    path = Path(out) / GAMMA_PLOT
    adaptive = _adaptive(summaries)
    if adaptive:
        fig = Figure(figsize=(7, 4))
        ax = fig.subplots()
        drawn = False
        for s in adaptive:
            mine = [r for r in rows if r.get("label") == s.label and r.get("gammas")]
            if mine:
                first = mine[0]
                ax.step(range(len(first["gammas"])), first["gammas"], where="post",
                        label=f"{s.label} ({first.get('dataset', '')})")
                drawn = True
        if drawn:
            ax.set_xlabel("step")
            ax.set_ylabel("γ chosen (0 = plain decoding)")
            ax.set_title("Cost-model controller: γ over time (first prompt)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(path, dpi=DPI)
            written.append(path)
    return written
