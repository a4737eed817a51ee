"""`draftsman bench`: side-by-side timing of decoding methods, tables, plots, HTML report."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from draftsman.bench.metrics import summarise
from draftsman.bench.presets import PRESETS
from draftsman.bench.results import ResultsFile
from draftsman.bench.runner import BenchConfig, run_bench
from draftsman.bench.tables import table_md
from draftsman.cli.common import command_line
from draftsman.cli.generate_cmd import add_model_args, add_sampling_args, static_option
from draftsman.errors import InvalidArgumentError

DEFAULTS = dict(methods=["speculative"], datasets=["humaneval"], limit=5, max_new_tokens=128,
                temperature=0.0, seed=0, repeats=1, peers=[], backend="auto",
                numerics="fast", turns="first", dtype=None)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark decoding methods side by side",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time decoding methods interleaved on the same prompts (after a warm-up), "
                    "write results.jsonl, summary.md, plots and report.html.\n\n"
                    "Method specs: NAME[:KEY=VALUE,...], e.g. speculative:gamma=4, "
                    "speculative:draft=ngram, staged:subdraft=ngram,gamma=4.\n"
                    "Sweeps: gamma=1|2|3 (alternatives), gamma=1..5 (inclusive, step 1), "
                    "fallback=0.3..0.9 (step 0.1: the finest decimal written), "
                    "x=0.2..0.8..0.2 (explicit step); several swept options -> every "
                    "combination. autoregressive is always included as the baseline.\n\n"
                    "Presets: " + "; ".join(f"{k}: {v.description}" for k, v in PRESETS.items()))
    add_model_args(p)
    add_sampling_args(p)
    p.add_argument("--draft", default=None,
                   help="draft model for methods that take one (default: the target's "
                        "default draft); also the assistant of --peer hf")
    p.add_argument("--methods", action="append", default=None, metavar="SPECS",
                   help="comma-separated method specs (repeatable; default: speculative)")
    p.add_argument("--dataset", dest="datasets", default=None, metavar="NAME[,NAME]",
                   help="a name from --list-datasets (humaneval, mt-bench, code-edit, rag-qa, "
                        "grammar, news-summarization, ...) or a .jsonl file "
                        "(default: humaneval)")
    p.add_argument("--list-datasets", action="store_true",
                   help="print every named dataset (records, description) and exit")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each dataset "
                                                           "(default: 5)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per prompt and "
                                                             "method (default: 1)")
    p.add_argument("--peer", dest="peers", action="append", default=None,
                   metavar="hf[:plain,assisted,prompt-lookup,compiled] | "
                           "llama.cpp[:plain,speculative,lookup] | "
                           "openvino[-int8][:plain,speculative,lookup]",
                   help="also time Hugging Face transformers generate (hf = plain, assisted "
                        "and prompt-lookup; compiled = its static cache + torch.compile), "
                        "llama.cpp's own plain, speculative and lookup decoding on the same "
                        "GGUF weights (llama.cpp = all three) or OpenVINO GenAI's on int4 "
                        "exports of the same models (openvino = all three; openvino-int8: on "
                        "int8 exports; `make openvino`); speculative=N / lookup=N set their "
                        "draft length (llama.cpp's default 3, OpenVINO's 5); repeatable")
    p.add_argument("--turns", choices=["first", "all"], default=None,
                   help="multi-turn prompts (MT-Bench): time the first turn or all turns "
                        "(default: first)")
    p.add_argument("--out", default=None,
                   help="results folder (default: bench-results/<preset|run>-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out, skipping rows already measured")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="a named setup; explicit options override it")
    p.add_argument("--warmup-tokens", type=int, default=8)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild summary, plots and report from --out without measuring")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="diff two result folders and exit")
    # None = not given, so a preset can fill it in
    p.set_defaults(func=run, max_new_tokens=None, temperature=None, seed=None, backend=None,
                   numerics=None, dtype=None)


def config_from_args(args: argparse.Namespace):
    preset = PRESETS[args.preset] if args.preset else None
    values = dict(DEFAULTS)
    if preset:
        values.update(methods=list(preset.methods), datasets=list(preset.datasets),
                      limit=preset.limit, max_new_tokens=preset.max_new_tokens,
                      repeats=preset.repeats, peers=list(preset.peers), backend=preset.backend,
                      turns=preset.turns, numerics=preset.numerics)
        if preset.dtype:
            values["dtype"] = preset.dtype
    given = dict(methods=args.methods, limit=args.limit, max_new_tokens=args.max_new_tokens,
                 temperature=args.temperature, seed=args.seed, repeats=args.repeats,
                 peers=args.peers, backend=args.backend, numerics=args.numerics,
                 turns=args.turns, dtype=args.dtype,
                 datasets=[d.strip() for d in args.datasets.split(",") if d.strip()]
                 if args.datasets else None)
    values.update({k: v for k, v in given.items() if v is not None})
    if args.resume and not args.out:
        raise InvalidArgumentError("--resume needs --out (the folder to continue)")
    out = args.out or f"bench-results/{args.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return BenchConfig(
        target=args.target, draft=args.draft, threads=args.threads,
        device=args.device, static=args.static, compile=bool(static_option(args)) and args.compile,
        top_k=args.top_k, top_p=args.top_p, out=out,
        resume=args.resume,
        warmup_tokens=args.warmup_tokens, progress=not args.no_progress,
        command=command_line() if sys.argv[1:] else "", **values)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from draftsman.bench.report import compare, speed_table, write_report  # matplotlib

    if args.list_datasets:
        from draftsman.bench.datasets import list_datasets

        for info in list_datasets():
            print(f"{info.name:20} {info.records:>6}  {info.description}")
        return 0
    if args.compare:
        print(compare(*args.compare))
        return 0
    if args.report_only:
        if not args.out:
            raise InvalidArgumentError("--report-only needs --out")
        rows = ResultsFile(args.out).rows()
        if not rows:
            raise InvalidArgumentError(f"{args.out} has no results.jsonl rows")
        paths = write_report(args.out, rows)
    else:
        # `kill` ends a run like Ctrl-C: rows already measured stay, --resume continues
        signal.signal(signal.SIGTERM, _interrupt)
        result = run_bench(config_from_args(args))
        rows, paths = result.rows, result.paths
        for line in result.skipped:
            print(f"bench: skipped {line}", file=sys.stderr)

    print(table_md(speed_table(summarise(rows))))
    print(f"summary: {paths['summary']}")
    print(f"report:  {paths['html']}")
    return 0
