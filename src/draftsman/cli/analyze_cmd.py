"""`draftsman analyze ...`: measurements behind the pipelined strategy.

    analyze match-rate         p̂_correct tables (the paper's Tables 2, 5, 6-8), the replayed
                               timeline vs Theorem 4.1, and the trade-off plots (Figures 3-4)
    analyze pipelined-latency  measured latency of `pipelined` against `autoregressive` with
                               1 and 2 threads, in the layout of the paper's Table 3
    analyze parallel-prompt    prompt-token accuracy by distance, τ of dynamic / static /
                               random trees, predicted vs measured speedup per tree size
                               (the parallel prompt decoding paper's Figures 6, 8a, 8b/c)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from draftsman.analysis import match_rate as mr
from draftsman.analysis.match_rate import PAPER_FRACTIONS, TASK_LABELS, TASKS, encode
from draftsman.bench.datasets import load_dataset
from draftsman.bench.study_report import write_html
from draftsman.cli.common import add_device_arg, add_group, csv_items, positive_ints
from draftsman.engine import DEFAULT_TARGET, load, load_bundle
from draftsman.errors import InvalidArgumentError
from draftsman.models.exit_heads import layer_from_fraction
from draftsman.models.weight_formats import DTYPE_CHOICES
from draftsman.strategies.pipelined import close_pools
from draftsman.theory import pipelined as pt


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(
        subparsers, "analyze", "WHAT",
        help="measure guess quality (match rates) and pipelined latency",
        description="Analyses that explain a method's speed: how often guesses are right.")

    p = sub.add_parser(
        "match-rate", help="p̂_correct of early top-k predictions (pipelined decoding)",
        description="Generate on QA / translation / summarization prompts (the paper's "
                    "Table 1 formats) and measure how often one of the top-k predictions "
                    "read at an intermediate layer equals the final token; shared LM head "
                    "(N) and trained exit heads (Y). Writes tables, JSON, plots.")
    p.add_argument("--model", "--target", dest="models", action="append", default=None,
                   help=f"model(s), repeatable or comma separated (default {DEFAULT_TARGET})")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--limit", type=int, default=8, help="prompts per task")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="override the per-task lengths (qa 16, translation 128, "
                        "summarization 128)")
    p.add_argument("--layers", default=",".join(map(str, PAPER_FRACTIONS)),
                   help="probe layers: fractions of depth or layer counts (default: the "
                        "paper's 10/20/30/35/37 of 40)")
    p.add_argument("--k", default="1,3,5", help="top-k sizes")
    p.add_argument("--sampling", default="greedy",
                   help="decoding modes: greedy, top-k, top-p (Appendix B), comma separated")
    p.add_argument("--exit-heads", default="auto", choices=["auto", "none"],
                   help="auto: use trained exit heads where they exist (rows Y)")
    p.add_argument("--raw", action="store_true", help="no chat template around the prompts")
    p.add_argument("--out", type=Path, default=Path("match-rate"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true",
                   help="regenerate instead of reusing <out>/<model>/generations.jsonl")
    p.add_argument("--no-plots", action="store_true")
    add_device_arg(p)
    p.set_defaults(func=run_match_rate)

    q = sub.add_parser(
        "pipelined-latency", help="time pipelined vs autoregressive (the paper's Table 3)",
        description="Interleaved timing of autoregressive with 1 and 2 threads and of "
                    "pipelined (main worker + k sub-workers, 1 thread each), on news "
                    "summarization and QA prompts; reports p̂, latency, throughput, the "
                    "communication overhead per token and whether outputs are identical.")
    q.add_argument("--model", "--target", dest="model", default=DEFAULT_TARGET)
    q.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    q.add_argument("--tasks", default="summarization,qa")
    q.add_argument("--limit", type=int, default=2, help="prompts per task")
    q.add_argument("--max-new-tokens", type=int, default=128)
    q.add_argument("--k", default="1", help="sub-worker counts to time, comma separated")
    q.add_argument("--exit-layer", type=int, default=None)
    q.add_argument("--exit-head", default="auto")
    q.add_argument("--repeats", type=int, default=1)
    q.add_argument("--raw", action="store_true")
    q.add_argument("--out", type=Path, default=None, help="write results JSON + markdown here")
    add_device_arg(q)
    q.set_defaults(func=run_latency)

    r = sub.add_parser(
        "parallel-prompt", help="prompt-token accuracy, tree τ and speedup per tree size",
        description="Time autoregressive and parallel-prompt at several tree sizes "
                    "(interleaved, same token ids), then replay the decoder on the greedy "
                    "replies for every tree kind and size: per-distance accuracy (Figure 6), "
                    "dynamic vs static vs random τ (8a), predicted vs measured speedup with "
                    "this CPU's forward latency profile (8b/c). Writes tables, JSON, PNGs "
                    "and report.html.")
    r.add_argument("--target", default=DEFAULT_TARGET)
    r.add_argument("--dtype", default="int8", choices=DTYPE_CHOICES,
                   help="int8 (default): this CPU's cheapest multi-row forward")
    r.add_argument("--datasets", default="humaneval,mt-bench")
    r.add_argument("--limit", type=int, default=4, help="prompts per dataset")
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--sizes", default="1,2,3,4,6,8,12,16,24,32,48,64",
                   help="tree sizes (rows per forward) to replay")
    r.add_argument("--kinds", default="dynamic,static,random")
    r.add_argument("--time-sizes", default="2,4,8,16",
                   help="tree sizes to time against autoregressive (subset of --sizes)")
    r.add_argument("--also", action="append", default=None, metavar="METHOD",
                   help="another method to time side by side, e.g. "
                        "speculative:drafter=ngram,gamma=auto (repeatable)")
    r.add_argument("--prompt-tokens", default=None,
                   help="prompt-token folder (default: the ones shipped for the target)")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, default=Path("parallel-prompt"))
    add_device_arg(r)
    r.set_defaults(func=run_parallel_prompt)


def run_parallel_prompt(args: argparse.Namespace) -> int:
    from draftsman.analysis import prompt_decoding_run as pdr  # matplotlib: load on use

    settings = pdr.settings_from(args)
    pdr.check(settings)
    result = pdr.run(settings, args.out)
    path = pdr.write(result, args.out, "draftsman " + " ".join(sys.argv[1:]))
    print(path.read_text())
    print(f"wrote {path}, {args.out / 'report.html'}", file=sys.stderr)
    return 0


# ----------------------------------------------------------------------------- match rate


def run_match_rate(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise InvalidArgumentError("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    models = [m for spec in (args.models or [DEFAULT_TARGET]) for m in csv_items(spec)]
    ks = positive_ints(args.k, "k")
    modes = csv_items(args.sampling)
    for m in modes:
        if m not in mr.SAMPLING_MODES:
            raise InvalidArgumentError(f"unknown sampling mode {m!r}; choose "
                                       f"{', '.join(mr.SAMPLING_MODES)}")
    tasks = tuple(csv_items(args.tasks))
    lengths = tuple((t, args.max_new_tokens) for t in tasks) if args.max_new_tokens else ()
    for name in models:
        bundle = load_bundle(name, args.dtype, device=args.device)
        model = bundle.model
        depth = model.config.num_layers
        layers = sorted({layer_from_fraction(depth, x) for x in csv_items(args.layers)})
        half = depth // 2
        if half not in layers:
            layers = sorted({*layers, half})
        trained = {} if args.exit_heads == "none" else mr.find_trained_heads(
            model, bundle.folder, layers)
        heads = mr.ProbeHeads(layers, trained)
        cfg = mr.RunConfig(tasks=tasks, limit=args.limit, layers=tuple(layers),
                           modes=tuple(modes), lengths=lengths, chat=not args.raw,
                           seed=args.seed)
        out = args.out / Path(name).name
        out.mkdir(parents=True, exist_ok=True)
        gen_path = out / "generations.jsonl"
        meta = {"model": name, "dtype": args.dtype, "layers": layers,
                "trained": sorted(trained), "chat": not args.raw, "limit": args.limit,
                "lengths": [(t, cfg.length(t)) for t in tasks]}
        meta_path = out / "generations.meta.json"
        resume = not args.no_resume and meta_path.is_file() \
            and json.loads(meta_path.read_text()) == json.loads(json.dumps(meta))
        if not resume:
            gen_path.unlink(missing_ok=True)
            meta_path.write_text(json.dumps(meta) + "\n")
        old = mr.read_generations(gen_path)
        done = {(g.mode, g.task, g.prompt_id) for g in old}
        print(f"{name}: {depth} layers, probes {layers}, trained heads at "
              f"{sorted(trained) or 'none'}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with gen_path.open("a") as f:
            def emit(g: mr.Generation, f=f) -> None:
                f.write(g.to_json() + "\n")
                f.flush()

            new = mr.collect(model, bundle.tokenizer, name, heads, cfg, done=done, emit=emit,
                             progress=lambda s: print("  " + s, file=sys.stderr, flush=True))
        gens = old + new
        report = match_rate_report(gens, name, layers, depth, ks, cfg, out,
                                   plots=not args.no_plots)
        (out / "match_rate.md").write_text(report + "\n")
        write_html(out / "report.html", report, out)
        (out / "match_rate.json").write_text(json.dumps({
            "model": name, "depth": depth, "layers": layers, "meta": meta,
            "seconds": time.monotonic() - t0, "summary": mr.summary(gens, layers, ks)},
            indent=1) + "\n")
        print(report)
        print(f"wrote {out}/match_rate.md, match_rate.json", file=sys.stderr)
    return 0


def match_rate_report(gens: list, name: str, layers: list[int], depth: int, ks: list[int],
                      cfg: Any, out: Path, plots: bool = True) -> str:
    """Markdown: Table 2, Table 5, Tables 6-8, and the replayed timeline vs Theorem 4.1."""
    half = depth // 2
    greedy = [g for g in gens if g.mode == "greedy"]
    n_tok = {t: sum(len(g.tokens) for g in greedy if g.task == t) for t in mr.TASKS}
    n_prompts = {t: sum(1 for g in greedy if g.task == t) for t in mr.TASKS}
    parts = [f"## {name}: p̂_correct ({depth} layers)", "",
             "Prompts / generated tokens: " + ", ".join(
                 f"{mr.TASK_LABELS[t]} {n_prompts[t]} / {n_tok[t]}" for t in mr.TASKS
                 if n_prompts[t]), "",
             "### Table 2 layout: p̂ by layer (N = shared LM head, Y = trained exit head)", "",
             mr.table2(gens, layers, depth, ks)]
    if any(g.mode != "greedy" for g in gens):
        parts += ["", f"### Table 5 layout: sampling (k̂ = 3, layer {half}, shared head)", "",
                  mr.sampling_table(gens, half, 3, 0)]
    for task in mr.TASKS:
        if n_prompts[task]:
            parts += ["", f"### Tables 6-8 layout: {mr.TASK_LABELS[task]} by token position",
                      "", mr.position_table(gens, task, cfg.length(task), layers, depth, ks)]
    # replay: the timeline simulator on the real match sequences vs Theorem 4.1 with p̂
    rows = [["task", "head", "k", "p̂", "simulated latency / dℓ", "Theorem 4.1 / dℓ",
             "simulated compute / dℓ", "Theorem 4.1 / dℓ"], ["---"] * 8]
    p_fig: dict[str, dict[int, float]] = {}
    for task in mr.TASKS:
        tg = [g for g in greedy if g.task == task]
        if not tg:
            continue
        for h, flag in enumerate(("N", "Y")):
            for k in ks:
                cell = mr.match_cell(tg, half, k, h)
                if not cell.total:
                    continue
                lat = comp = theo_l = theo_c = dl = 0.0
                for g in tg:
                    j = g.layers.index(half)
                    ranks = [r[j][h] for r in g.ranks]
                    sim = pt.simulate(pt.replay_matches(ranks, k), depth, half, k)
                    ell = len(ranks)
                    lat += sim.latency
                    comp += sim.compute
                    theo_l += pt.expected_latency(depth, half, ell, cell.rate)
                    theo_c += pt.expected_compute(depth, half, ell, cell.rate, k)
                    dl += depth * ell
                rows.append([mr.TASK_LABELS[task], flag, str(k), f"{cell.rate:.3f}",
                             f"{lat / dl:.3f}", f"{theo_l / dl:.3f}", f"{comp / dl:.3f}",
                             f"{theo_c / dl:.3f}"])
                label = f"{mr.TASK_LABELS[task]}{' tr' if flag == 'Y' else ''}"
                p_fig.setdefault(label, {})[k] = cell.rate
    parts += ["", f"### Replayed generations at d̄ = {half} vs Theorem 4.1 (with p̂)", "",
              "\n".join("| " + " | ".join(r) + " |" for r in rows)]
    if plots and p_fig:
        files = pt.plot_tradeoff(p_fig, out / "tradeoff.png", f"{name}",
                                 d_bar_fraction=half / depth)
        parts += ["", "### Trade-off curves (Figures 3 and 4) from the measured p̂", ""]
        parts += [f"![{Path(f).stem}]({Path(f).name})" for f in files]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- latency


def _timed(engine: Any, prompt_ids: list[int], method: str, options: dict[str, Any],
           max_new: int, threads: int | None) -> dict[str, Any]:
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        request = engine.prepare(prompt_ids, method=method, max_new_tokens=max_new,
                                 **options)
        t0 = time.perf_counter()
        steps = [e.step for e in engine.run(request)]
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    tokens = [t for s in steps for t in s.tokens]
    drafted = sum(s.drafted for s in steps)
    out = {"seconds": seconds, "tokens": tokens, "n": len(tokens),
           "p_hat": sum(s.accepted for s in steps) / drafted if drafted else None}
    if method == "pipelined":
        decode = [s for s in steps if not s.prefill]
        for key in ("send_s", "wait_s", "adopt_s"):
            out[key] = sum(s.extra[key] for s in decode) / max(1, len(decode))
        out["overhead_s"] = sum(s.other_seconds for s in decode) / max(1, len(decode))
        out["main_compute_s"] = sum(s.verify_seconds for s in decode) / max(1, len(decode))
    return out


def run_latency(args: argparse.Namespace) -> int:
    engine = load(args.model, dtype=args.dtype, device=args.device)
    tasks = csv_items(args.tasks)
    configs: list[tuple[str, str, dict[str, Any], int | None]] = [
        ("greedy, 1 thread", "autoregressive", {}, 1),
        ("greedy, 2 threads", "autoregressive", {}, 2)]
    for k in positive_ints(args.k, "k"):
        opts: dict[str, Any] = {"k": k, "threads": 1, "main_threads": 1,
                                "exit_head": args.exit_head}
        if args.exit_layer is not None:
            opts["exit_layer"] = args.exit_layer
        configs.append((f"pipelined k={k} ({k + 1} x 1 thread)", "pipelined", opts, 1))
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        warm = encode(engine.target.tokenizer, "Hello", not args.raw)
        for _label, method, opts, threads in configs:  # warm-up: pools, caches, kernels
            _timed(engine, warm, method, opts, 4, threads)
        for task in tasks:
            prompts = load_dataset(TASKS[task][0], limit=args.limit)
            for prompt in prompts:
                ids = encode(engine.target.tokenizer, prompt.text, not args.raw)
                _timed(engine, ids, "autoregressive", {}, 4, 1)  # warm-up this length
                for rep in range(args.repeats):
                    order = configs if rep % 2 == 0 else configs[::-1]
                    for label, method, opts, threads in order:
                        r = _timed(engine, ids, method, opts, args.max_new_tokens, threads)
                        results.setdefault(task, {}).setdefault(label, []).append(r)
                        print(f"  {task} {prompt.id} {label}: {r['seconds']:.2f} s, "
                              f"{r['n']} tokens, p̂ {r['p_hat']}", file=sys.stderr,
                              flush=True)
    finally:
        close_pools()
    ref_label = configs[0][0]
    rows = [["task", "method", "k", "p̂", "latency (s)", "throughput (tok/s)", "vs greedy 1t",
             "overhead / token (ms)", "identical"], ["---"] * 9]
    for task in tasks:
        ref = results[task][ref_label]
        ref_s = statistics.mean(r["seconds"] for r in ref)
        for label, method, opts, _ in configs:
            rs = results[task][label]
            secs = statistics.mean(r["seconds"] for r in rs)
            toks = statistics.mean(r["n"] for r in rs)
            same = sum(r["tokens"] == ref[i % len(ref)]["tokens"] for i, r in enumerate(rs))
            p = [r["p_hat"] for r in rs if r["p_hat"] is not None]
            over = statistics.mean(r["overhead_s"] for r in rs) * 1e3 if method == \
                "pipelined" else None
            rows.append([TASK_LABELS[task], label, str(opts.get("k", "-")),
                         f"{100 * statistics.mean(p):.1f}%" if p else "-",
                         f"{secs:.2f}", f"{toks / secs:.2f}", f"{ref_s / secs:.3f}x",
                         f"{over:.2f}" if over is not None else "-", f"{same}/{len(rs)}"])
    table = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    detail = []
    for task in tasks:
        for label, method, _, _ in configs:
            if method != "pipelined":
                continue
            rs = results[task][label]
            detail.append(
                f"- {TASK_LABELS[task]}, {label}: per decode token, main-worker compute "
                f"{1e3 * statistics.mean(r['main_compute_s'] for r in rs):.1f} ms, send "
                f"{1e3 * statistics.mean(r['send_s'] for r in rs):.2f} ms, wait "
                f"{1e3 * statistics.mean(r['wait_s'] for r in rs):.2f} ms, adopt "
                f"{1e3 * statistics.mean(r['adopt_s'] for r in rs):.2f} ms")
    text = (f"## {args.model} ({args.dtype}): {args.max_new_tokens} tokens, "
            f"{args.limit} prompt(s) per task, {args.repeats} repeat(s)\n\n{table}\n\n"
            + "\n".join(detail))
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "latency.md").write_text(text + "\n")
        write_html(args.out / "report.html", text, args.out)
        (args.out / "latency.json").write_text(json.dumps(
            {t: {lab: [{k: v for k, v in r.items() if k != "tokens"} for r in rs]
                 for lab, rs in d.items()} for t, d in results.items()}, indent=1) + "\n")
    return 0
