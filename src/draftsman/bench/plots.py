"""PNG plots of a benchmark (matplotlib, no display needed: `Figure` renders with Agg).

- speedup_vs_gamma.png: measured speedup of every drafting configuration at its mean γ
  (fixed γ: dots with the min-max over repeats, adaptive: stars), beside the theory curve
  expected_speedup(α, γ, c) for each drafter with its pooled measured α and c, and (hollow)
  each configuration's prediction with this machine's measured verify and draft costs.
- tokens_per_second.png: throughput per method, min-max over repeats as whiskers.
- quality_vs_latency.png: agreement with the target's own output (ROUGE-L) against time per
  token normalised by autoregressive decoding; lossy methods filled, exact ones hollow.

A plot is written only when the data it needs exists; `make_plots` returns what it wrote.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure

from draftsman.bench.metrics import MethodSummary
from draftsman.theory.speculative import expected_speedup

SPEEDUP = "speedup_vs_gamma.png"
THROUGHPUT = "tokens_per_second.png"
QUALITY = "quality_vs_latency.png"
DPI = 110


def _drafting(summaries: list[MethodSummary]) -> dict[str, list[MethodSummary]]:
    groups: dict[str, list[MethodSummary]] = defaultdict(list)
    for s in summaries:
        if s.kind == "draftsman" and s.gamma is not None and s.speedup is not None:
            groups[f"{s.method} / {s.drafter or 'default draft'}"].append(s)
    return groups


def plot_speedup_vs_gamma(summaries: list[MethodSummary], path: Path) -> bool:
    groups = _drafting(summaries)
    if not groups:
        return False
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    top = max(max(s.gamma or 1 for s in group) for group in groups.values())
    gammas = [g / 10 for g in range(10, int(10 * max(top + 2, 8)) + 1)]
    for i, (name, group) in enumerate(sorted(groups.items())):
        colour = f"C{i % 10}"
        alphas = [s.alpha for s in group if s.alpha is not None]
        costs = [s.guess_cost for s in group if s.guess_cost is not None]
        if alphas and costs:
            a, c = statistics.median(alphas), statistics.median(costs)
            ax.plot(gammas, [expected_speedup(a, g, c) for g in gammas], color=colour,
                    linestyle="--", linewidth=1,
                    label=f"theory {name} (α={a:.2f}, c={c:.2f})")
        for s in group:
            adaptive = str(s.options.get("gamma", "")).lower() == "auto"
            low = (s.speedup - s.speedup_min) if s.speedup_min is not None else 0
            high = (s.speedup_max - s.speedup) if s.speedup_max is not None else 0
            ax.errorbar([s.gamma], [s.speedup], yerr=[[max(low, 0)], [max(high, 0)]],
                        fmt="*" if adaptive else "o", markersize=11 if adaptive else 6,
                        color=colour, capsize=3)
            if s.predicted_speedup_hw is not None:
                ax.plot([s.gamma], [s.predicted_speedup_hw], "o", markersize=7,
                        markerfacecolor="none", color=colour)
            if adaptive and s.options.get("gamma_policy"):
                ax.annotate(str(s.options["gamma_policy"]), (s.gamma, s.speedup),
                            textcoords="offset points", xytext=(6, 4), fontsize=7)
        ax.plot([], [], "o", color=colour, label=f"measured {name}")
    ax.plot([], [], "o", markerfacecolor="none", color="black",
            label="predicted with this CPU's verify and draft costs")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("γ (mean tokens drafted per step)")
    ax.set_ylabel("speedup over autoregressive")
    ax.set_title("Speedup vs draft length (★ adaptive γ)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return True


def plot_throughput(summaries: list[MethodSummary], path: Path) -> bool:
    shown = [s for s in summaries if s.tokens_per_second]
    if not shown:
        return False
    fig = Figure(figsize=(7, 0.9 + 0.38 * len(shown)))
    ax = fig.subplots()
    ys = list(range(len(shown)))[::-1]
    values = [s.tokens_per_second for s in shown]
    low = [max(v - (s.tokens_per_second_min or v), 0) for v, s in zip(values, shown, strict=True)]
    high = [max((s.tokens_per_second_max or v) - v, 0) for v, s in zip(values, shown, strict=True)]
    colours = ["grey" if s.kind == "baseline" else "C1" if s.kind == "peer" else "C0"
               for s in shown]
    ax.barh(ys, values, xerr=[low, high], color=colours, capsize=3)
    ax.set_yticks(ys, [s.label for s in shown], fontsize=7)
    for y, v, h in zip(ys, values, high, strict=True):
        ax.text(v + h, y, f"  {v:.1f}", va="center", fontsize=7)
    ax.set_xlim(0, max(v + h for v, h in zip(values, high, strict=True)) * 1.15)
    ax.set_xlabel("tokens / s (grey: autoregressive, orange: transformers)")
    ax.set_title("Throughput per method")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return True


def plot_quality(summaries: list[MethodSummary], path: Path) -> bool:
    base = next((s for s in summaries if s.kind == "baseline"), None)
    points = [s for s in summaries if s.kind != "baseline" and s.rouge_l_ar is not None
              and s.speedup]
    if base is None or not points:
        return False
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    ax.plot([1.0], [1.0], "s", color="grey", label="autoregressive")
    for i, s in enumerate(points):
        lossy = s.exactness == "lossy"
        ax.plot([1.0 / s.speedup], [s.rouge_l_ar], "o", color=f"C{i % 10}",
                markerfacecolor=None if lossy else "none", label=s.label)
    ax.set_xlabel("time per token / autoregressive (lower is faster)")
    ax.set_ylabel("ROUGE-L vs the target's own output")
    ax.set_title("Quality vs normalised latency (filled: lossy methods)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return True


def make_plots(out: Path, summaries: list[MethodSummary]) -> list[Path]:
    written = []
    for name, plot in ((SPEEDUP, plot_speedup_vs_gamma), (THROUGHPUT, plot_throughput),
                       (QUALITY, plot_quality)):
        path = Path(out) / name
        if plot(summaries, path):
            written.append(path)
        elif path.exists():
            path.unlink()  # stale from an earlier report of this folder
    return written
