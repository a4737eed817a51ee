"""`draftsman loadtest`: many concurrent users against running servers, interleaved.

    draftsman loadtest --server ours=http://127.0.0.1:8000 \\
        --server llama-server=http://127.0.0.1:8080 --concurrency 1,4,8 \\
        --dataset code-edit --dataset mt-bench --dataset humaneval --limit 3 --out DIR

A contestant is NAME=URL, optionally with a request extension (NAME=URL#JSON: merged into
every request body, e.g. our `{"draftsman": {"method": "autoregressive"}}`), so one of our
servers can be timed with speculation on and off. Writes DIR/results.jsonl (one row per
round, with the machine and commit), DIR/requests.jsonl and DIR/summary.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from draftsman.bench.load import (
    plot_load,
    reply_record,
    run_arrivals,
    run_round,
    summary_table,
)
from draftsman.cli.common import command_line, positive_ints
from draftsman.errors import InvalidArgumentError

DEFAULT_DATASETS = ("code-edit", "mt-bench", "humaneval")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "loadtest", help="concurrent users against running servers (ours, llama-server)",
        description="Closed-loop clients streaming chat completions from each server in "
                    "turn, at each concurrency: aggregate tokens/s, TTFT, inter-chunk "
                    "latency (p50/p99) and time per output token. Every level and round "
                    "sends the same prompts: start our server with --history-tokens 0 (its "
                    "suffix drafter would otherwise copy earlier replies) and turn off other "
                    "servers' prompt caches (llama-server: #{\"cache_prompt\": false}).")
    p.add_argument("--server", action="append", required=True, metavar="NAME=URL[#JSON]",
                   help="a contestant (repeat); #JSON is merged into every request body")
    p.add_argument("--concurrency", default="1,4", help="clients at once, comma separated "
                   "(default: 1,4)")
    p.add_argument("--rate", default=None,
                   help="also Poisson arrivals at these rates (requests/s, comma separated; "
                        "open loop, the same seeded arrival times for every server)")
    p.add_argument("--dataset", action="append", default=None,
                   help="prompts from these datasets, mixed (default: code-edit, mt-bench, "
                        "humaneval)")
    p.add_argument("--limit", type=int, default=3, help="prompts per dataset (default: 3)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per reply (default: 64)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds per server and concurrency, interleaved (default: 1)")
    p.add_argument("--out", type=Path, default=None, help="folder for the results")
    p.set_defaults(func=run)


def parse_server(text: str) -> tuple[str, str, dict[str, Any] | None]:
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest.startswith("http"):
        raise InvalidArgumentError(f"--server takes NAME=URL[#JSON], got {text!r}")
    url, _, extra = rest.partition("#")
    try:
        body = json.loads(extra) if extra else None
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"--server {name}: the text after # is not JSON: {exc}") \
            from None
    return name, url, body


def load_prompts(datasets: list[str], limit: int) -> list[list[dict[str, str]]]:
    """Chat messages of the first `limit` prompts of each dataset, interleaved by dataset."""
    from draftsman.bench.datasets import load_dataset

    per = [load_dataset(name, limit=limit) for name in datasets]
    mixed = [p for group in zip(*per, strict=False) for p in group]
    return [[{"role": "user", "content": p.text}] for p in mixed]


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from draftsman.bench.results import git_commit, machine

    servers = [parse_server(s) for s in args.server]
    levels: list[int | float] = list(positive_ints(args.concurrency, "concurrency"))
    rates = [float(x) for x in args.rate.split(",")] if args.rate else []
    if any(r <= 0 for r in rates):
        raise InvalidArgumentError("--rate values must be > 0")
    if args.max_tokens < 1 or args.rounds < 1 or args.limit < 1:
        raise InvalidArgumentError("--max-tokens, --rounds and --limit must be >= 1")
    prompts = load_prompts(args.dataset or list(DEFAULT_DATASETS), args.limit)
    env = {**machine(), "git_commit": git_commit()}  # as every bench row records it
    rows, requests = [], []
    loads = [(n, False) for n in levels] + [(r, True) for r in rates]
    total = len(loads) * args.rounds * len(servers)
    with tqdm(total=total, desc="loadtest rounds", file=sys.stderr) as bar:
        for level, open_loop in loads:
            for round_no in range(args.rounds):
                for name, url, extra in servers:
                    bar.set_postfix_str(f"{name} {level}/s" if open_loop else f"{name} x{level}")
                    result = (run_arrivals(name, url, prompts, level, args.max_tokens, extra,
                                           seed=round_no) if open_loop
                              else run_round(name, url, prompts, int(level), args.max_tokens,
                                             extra))
                    row = {**result.summary(), "round": round_no,
                           "max_tokens": args.max_tokens, "prompts": len(prompts),
                           "extra": extra, "env": env}
                    rows.append(row)
                    requests += [{"server": name, "concurrency": result.concurrency,
                                  "round": round_no,
                                  **reply_record(r)} for r in result.replies]
                    bar.update(1)
    table = summary_table(rows)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (args.out / "requests.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in requests))
        (args.out / "summary.md").write_text(
            f"CPU: {env['cpu']} ({env['cores']} cores), commit {env['git_commit']}\n\n"
            f"{table}\n")
        plot_load(rows, args.out / "load.png")
        (args.out / "run.json").write_text(json.dumps(
            {"command": command_line()}) + "\n")
    return 0
