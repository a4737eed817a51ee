"""`draftsman analyze parallel-prompt`: the measurements behind Figures 6, 8a and 8b/c.

Per prompt (interleaved, the order reversed on every other prompt): `autoregressive`,
`parallel-prompt` at each timed tree size and any extra methods, each timed end to end on
the same token ids. The autoregressive reply then gets one teacher-forced forward with a
prompt-token chain after every position (`prompt_decoding.guess_ranks`), from which the
per-distance accuracies and the replayed τ of every tree kind and size follow. The forward
latency profile L_fp(n) is measured in the same process, so predicted and measured speedups
come from one machine state. Writes prompt_decoding.md / .json, three PNGs, report.html.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure

from draftsman.analysis import prompt_decoding as pd
from draftsman.bench.datasets import load_dataset
from draftsman.bench.spec import MethodConfig, parse_methods
from draftsman.bench.study_report import write_html
from draftsman.engine import load
from draftsman.errors import InvalidArgumentError
from draftsman.profiling import interpolate, measure_latency
from draftsman.strategies.parallel_prompt import resolve_prompt_tokens, select_trees
from draftsman.trees.sparse import KINDS

AR = "autoregressive"
DPI = 110


@dataclass
class RunSettings:
    target: str
    dtype: str = "int8"
    datasets: tuple[str, ...] = ("humaneval", "mt-bench")
    limit: int = 4
    max_new_tokens: int = 64
    sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    kinds: tuple[str, ...] = ("dynamic", "static", "random")
    time_sizes: tuple[int, ...] = (2, 4, 8, 16)
    also: tuple[MethodConfig, ...] = ()
    prompt_tokens: str | None = None
    threads: int = 2
    seed: int = 0
    device: str = "auto"


@dataclass
class Timing:
    label: str
    seconds: float
    tokens: list[int]
    steps: list[int] = field(default_factory=list)  # tokens per decode step

    @property
    def tau(self) -> float | None:
        return sum(self.steps) / len(self.steps) if self.steps else None


def _timed(engine: Any, ids: list[int], method: str, options: dict[str, Any], n: int
           ) -> Timing:
    request = engine.prepare(ids, method=method, max_new_tokens=n, **options)
    t0 = time.perf_counter()
    steps = [e.step for e in engine.run(request)]
    seconds = time.perf_counter() - t0
    return Timing("", seconds, [t for s in steps for t in s.tokens],
                  [len(s.tokens) for s in steps if not s.prefill])


def configs(s: RunSettings) -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = [(AR, AR, {})]
    for n in s.time_sizes:
        opts: dict[str, Any] = {"tree_size": n}  # trees from the shipped calibration
        if s.prompt_tokens:
            opts["prompt_tokens"] = s.prompt_tokens
        out.append((f"parallel-prompt:tree_size={n}", "parallel-prompt", opts))
    labels = {label for label, _, _ in out}
    out += [(c.label, c.method, c.kwargs()) for c in s.also if c.label not in labels]
    return out


def run(s: RunSettings, out: Path, say=lambda msg: print(msg, file=sys.stderr, flush=True)
        ) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    engine = load(s.target, dtype=s.dtype, threads=s.threads, device=s.device)
    target = engine.target
    prompts = resolve_prompt_tokens(s.prompt_tokens, target, 3, 1, s.seed)
    m = prompts.count
    cfgs = configs(s)
    t_start = time.monotonic()
    say(f"warm-up: {len(cfgs)} configurations")
    warm = engine.encode_prompt("Write a haiku about the sea.")
    for _, method, opts in cfgs:
        _timed(engine, warm, method, opts, 8)
    timings: dict[str, dict[str, list[Timing]]] = {}
    replies: list[pd.Reply] = []
    items = [(d, p) for d in s.datasets for p in load_dataset(d, limit=s.limit)]
    for idx, (dataset, prompt) in enumerate(items):
        ids = engine.encode_prompt(prompt.text)
        order = cfgs if idx % 2 == 0 else cfgs[::-1]
        done: dict[str, Timing] = {}
        for label, method, opts in order:
            t = _timed(engine, ids, method, opts, s.max_new_tokens)
            t.label = label
            done[label] = t
            timings.setdefault(dataset, {}).setdefault(label, []).append(t)
        ref = done[AR]
        say(f"[{idx + 1}/{len(items)}] {dataset} {prompt.id}: " + ", ".join(
            f"{lab} {t.seconds:.1f}s" + ("" if t.tokens == ref.tokens else " (differs)")
            for lab, t in done.items()))
        full = ids + ref.tokens
        replies.append(pd.Reply(dataset, prompt.id, len(ids), full,
                                pd.guess_ranks(target.model, prompts, full, len(ids))))
    say("forward latency profile L_fp(n)")
    lat_sizes = sorted({1, *s.sizes, *s.time_sizes})
    latency = measure_latency(target.model, lat_sizes, context=256, repeats=3)

    trees = {(k, n): select_trees(prompts, target.model, target.name, k, n, s.dtype, s.seed)
             for k in s.kinds for n in s.sizes}
    by_set = {"all": replies, **{d: [r for r in replies if r.dataset == d] for d in s.datasets}}
    replayed = {name: {f"{k}:{n}": pd.replay_tau(rs, t, m) for (k, n), t in trees.items()}
                for name, rs in by_set.items() if rs}
    time_trees = {n: trees[("dynamic", n)] for n in s.time_sizes}  # check(): sizes ⊇ these
    result = {
        "settings": {**asdict(s), "also": [c.label for c in s.also]},
        "target": target.name, "m": m, "seconds": time.monotonic() - t_start,
        "accuracy": {name: pd.accuracy(rs, m) for name, rs in by_set.items() if rs},
        "calibration_accuracy": (prompts.trees() or {}).get("accuracy"),
        "predicted_tau": {f"{k}:{n}": t.tau for (k, n), t in trees.items()},
        "replayed_tau": replayed,
        "replayed_tau_timed": {name: {str(n): pd.replay_tau(rs, t, m)
                                      for n, t in time_trees.items()}
                               for name, rs in by_set.items() if rs},
        "latency": {str(n): v for n, v in latency.items()},
        "timings": {d: {lab: [{"seconds": t.seconds, "tokens": len(t.tokens), "tau": t.tau,
                                "identical": t.tokens == timings[d][AR][i].tokens}
                               for i, t in enumerate(ts)] for lab, ts in per.items()}
                    for d, per in timings.items()},
    }
    (out / "prompt_decoding.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "replies.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in replies))
    return result


# ----------------------------------------------------------------------------- report


def _speedups(result: dict[str, Any], dataset: str
              ) -> dict[str, tuple[float, float, float | None, str]]:
    """label -> (tok/s, speedup vs autoregressive, mean decode τ, "identical/prompts")."""
    per = result["timings"][dataset]
    ar_s = sum(t["seconds"] for t in per[AR])
    out = {}
    for label, ts in per.items():
        secs = sum(t["seconds"] for t in ts)
        toks = sum(t["tokens"] for t in ts)
        taus = [t["tau"] for t in ts if t["tau"] is not None]
        same = sum(t["identical"] for t in ts)
        out[label] = (toks / secs, ar_s / secs, statistics.mean(taus) if taus else None,
                      f"{same}/{len(ts)}")
    return out


def _predicted_speedup(result: dict[str, Any], tau: float, n: int) -> float:
    lat = {int(k): v for k, v in result["latency"].items()}
    return tau * interpolate(lat, 1) / interpolate(lat, n)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def render(result: dict[str, Any], out: Path, command: str = "") -> str:
    s = result["settings"]
    m = result["m"]
    sets = [d for d in s["datasets"] if d in result["timings"]]
    parts = [f"# Parallel prompt decoding on {result['target']} ({s['dtype']}, "
             f"{s['threads']} threads)", ""]
    if command:
        parts += [f"Command: `{command}`", ""]
    parts += [f"{s['limit']} prompt(s) per dataset ({', '.join(sets)}), greedy, "
              f"{s['max_new_tokens']} new tokens, chat template; {m} prompt tokens. "
              f"Run time {result['seconds'] / 60:.1f} min.", ""]

    # speed, side by side
    rows = []
    for d in sets:
        for label, (tps, sp, tau, same) in _speedups(result, d).items():
            rows.append([d, label, f"{tps:.2f}", f"{sp:.2f}x",
                         f"{tau:.2f}" if tau is not None else "-", same])
    parts += ["## Speed (interleaved, same token ids)", "",
              _table(["dataset", "method", "tok/s", "vs autoregressive",
                      "τ (tokens / decode forward)", "identical to autoregressive"], rows), ""]

    # Figure 6
    ks = [1, 2, 3, 5, 10]
    rows = []
    for name, acc in result["accuracy"].items():
        cum = pd.cumulative(acc)
        for i in range(m):
            rows.append([name, str(i + 1)] + [f"{cum[i][k - 1]:.3f}" for k in ks])
    parts += ["## Figure 6 layout: top-k accuracy of prompt token i (guessing i tokens past "
              "the target's own next token), on the target's greedy replies", "",
              _table(["replies", "distance"] + [f"top-{k}" for k in ks], rows), ""]

    # Figure 8a
    sizes = s["sizes"]
    rows = []
    for kind in s["kinds"]:
        for n in sizes:
            key = f"{kind}:{n}"
            rows.append([kind, str(n), f"{result['predicted_tau'][key]:.2f}"]
                        + [f"{result['replayed_tau'][name][key]:.2f}"
                           for name in result["replayed_tau"]])
    parts += ["## Figure 8a layout: τ by tree kind and size (rows per forward)", "",
              "Predicted: the sparse-tree model (Prop. 4.4) with the calibration accuracies "
              "of trees.json (else a prior); replayed: the decoder's exact steps on these replies "
              "(`analysis/prompt_decoding.replay`).", "",
              _table(["tree", "rows", "predicted τ"]
                     + [f"replayed τ ({name})" for name in result["replayed_tau"]], rows), ""]

    # Figure 8b/c
    rows = []
    for d in sets:
        sp = _speedups(result, d)
        for n in s["time_sizes"]:
            label = f"parallel-prompt:tree_size={n}"
            tau_r = result["replayed_tau_timed"][d][str(n)]
            measured = sp[label]
            rows.append([d, str(n), f"{result['latency'][str(n)] * 1e3:.0f}",
                         f"{result['latency'][str(n)] / result['latency']['1']:.2f}",
                         f"{tau_r:.2f}", f"{measured[2]:.2f}" if measured[2] else "-",
                         f"{_predicted_speedup(result, tau_r, n):.2f}x",
                         f"{measured[1]:.2f}x"])
    best = {}
    for name, taus in result["replayed_tau"].items():
        dyn = {n: taus[f"dynamic:{n}"] for n in sizes if f"dynamic:{n}" in taus}
        sp = {n: _predicted_speedup(result, t, n) for n, t in dyn.items()}
        best[name] = max(sp, key=lambda n: (sp[n], -n))
    parts += ["## Figure 8b/c layout: predicted vs measured speedup per tree size on this CPU",
              "", "L_fp(n): one forward over n new rows after 256 cached tokens (median of 3). "
              "Predicted speedup = replayed τ(n) · L_fp(1) / L_fp(n); measured = "
              "autoregressive seconds / parallel-prompt seconds on the same prompts.", "",
              _table(["dataset", "rows n", "L_fp(n) ms", "L_fp(n) / L_fp(1)", "replayed τ",
                      "measured τ", "predicted speedup", "measured speedup"], rows), "",
              "Hardware-aware size (argmax of the predicted speedup over "
              f"{min(sizes)}–{max(sizes)} rows, dynamic trees): "
              + ", ".join(f"{name} {n} rows ({_predicted_speedup(result, result['replayed_tau'][name][f'dynamic:{n}'], n):.2f}x)"  # noqa: E501
                          for name, n in best.items()), ""]
    plots = make_plots(result, out)
    parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(parts) + "\n"


def _panels(count: int, width: float, height: float) -> tuple[Figure, list]:
    """A figure with `count` side-by-side axes."""
    fig = Figure(figsize=(width * count, height))
    return fig, list(fig.subplots(1, count, squeeze=False)[0])


def _save(fig: Figure, path: Path, files: list[Path]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    files.append(path)


def make_plots(result: dict[str, Any], out: Path) -> list[Path]:
    s = result["settings"]
    m = result["m"]
    files = []
    # Figure 6: cumulative top-k accuracy per distance, one panel per reply set
    names = list(result["accuracy"])
    fig, axes = _panels(len(names), 4.2, 3.6)
    for ax, name in zip(axes, names, strict=True):
        cum = pd.cumulative(result["accuracy"][name])
        ks = list(range(1, len(cum[0]) + 1))
        for i in range(m):
            ax.plot(ks, cum[i], marker="o", label=f"prompt token {i + 1}")
        ax.set_title(name)
        ax.set_xlabel("top-k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['target']}: prompt-token accuracy by distance (Figure 6)")
    _save(fig, out / "fig6_accuracy.png", files)

    # Figure 8a: τ vs size per tree kind
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    for j, kind in enumerate(s["kinds"]):
        ax.plot(s["sizes"], [result["replayed_tau"]["all"][f"{kind}:{n}"] for n in s["sizes"]],
                marker="o", color=f"C{j}", label=f"{kind} (replayed)")
        ax.plot(s["sizes"], [result["predicted_tau"][f"{kind}:{n}"] for n in s["sizes"]],
                linestyle="--", color=f"C{j}", alpha=.6, label=f"{kind} (predicted)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows per forward (tree size)")
    ax.set_ylabel("τ (tokens per forward)")
    ax.grid(alpha=.3)
    ax.legend(fontsize=8)
    ax.set_title("Dynamic vs static vs random trees (Figure 8a)")
    _save(fig, out / "fig8a_trees.png", files)

    # Figure 8b/c: predicted speedup curve and measured points per dataset
    sets = [d for d in s["datasets"] if d in result["timings"]]
    fig, axes = _panels(len(sets), 4.6, 3.8)
    for ax, d in zip(axes, sets, strict=True):
        taus = result["replayed_tau"][d]
        ax.plot(s["sizes"], [_predicted_speedup(result, taus[f"dynamic:{n}"], n)
                             for n in s["sizes"]], marker=".", label="predicted (dynamic)")
        sp = _speedups(result, d)
        ns = list(s["time_sizes"])
        ax.plot(ns, [sp[f"parallel-prompt:tree_size={n}"][1] for n in ns], "s",
                markersize=8, label="measured")
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows per forward")
        ax.set_title(d)
        ax.grid(alpha=.3)
    axes[0].set_ylabel("speedup over autoregressive")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Predicted vs measured speedup on this CPU ({s['dtype']}, Figure 8b/c)")
    _save(fig, out / "fig8bc_speedup.png", files)
    return files


def write(result: dict[str, Any], out: Path, command: str = "") -> Path:
    text = render(result, out, command)
    (out / "prompt_decoding.md").write_text(text)
    write_html(out / "report.html", text, out)
    return out / "prompt_decoding.md"


def settings_from(args: Any) -> RunSettings:
    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in str(text).split(",") if x.strip())

    return RunSettings(
        target=args.target, dtype=args.dtype,
        datasets=tuple(x.strip() for x in args.datasets.split(",") if x.strip()),
        limit=args.limit, max_new_tokens=args.max_new_tokens, sizes=ints(args.sizes),
        kinds=tuple(x.strip() for x in args.kinds.split(",") if x.strip()),
        time_sizes=ints(args.time_sizes),
        also=tuple(parse_methods(args.also)) if args.also else (),
        prompt_tokens=args.prompt_tokens, threads=args.threads, seed=args.seed,
        device=getattr(args, "device", "auto"))


def check(s: RunSettings) -> None:
    if s.limit < 1 or s.max_new_tokens < 2 or s.threads < 1:
        raise InvalidArgumentError("--limit and --threads must be >= 1, --max-new-tokens >= 2")
    if not s.sizes or min(s.sizes) < 1 or (s.time_sizes and min(s.time_sizes) < 1):
        raise InvalidArgumentError("tree sizes must be positive integers")
    for k in s.kinds:
        if k not in KINDS:
            raise InvalidArgumentError(f"unknown tree kind {k!r}; choose {', '.join(KINDS)}")
    if "dynamic" not in s.kinds:
        raise InvalidArgumentError("--kinds must include dynamic (the speedup curve uses it)")
    if not set(s.time_sizes) <= set(s.sizes):
        raise InvalidArgumentError("every --time-sizes value must also be in --sizes")
    torch.set_num_threads(s.threads)
