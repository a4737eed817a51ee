#!/usr/bin/env python3
"""q4 against bf16 on the torch backend: perplexity on ShareGPT text, peak memory, load time.

Issue 22's goal: `--dtype q4` (the GGUF's own Q4_K / Q6_K blocks on kernels/gguf_matmul.cpp)
within 2% of bf16's perplexity. Each dtype loads in a fresh subprocess of this script, so
its peak resident memory (ru_maxrss) and load seconds are its own; the same subprocess then
scores the same token chunks, teacher-forced through the KV cache `--step` tokens at a time.

    scripts/q4_quality.py                      # ~4000 tokens, bench-results/q4-avx2
    scripts/q4_quality.py --tokens 600 --out /tmp/q4-smoke
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GOAL = 0.02  # q4 perplexity at most 2% above bf16's
DTYPES = ("bf16", "q4")


@dataclass
class Settings:
    model: str = "qwen2.5-coder-1.5b-instruct"
    tokens: int = 4000
    chunk: int = 512
    step: int = 512  # one cached forward per chunk: bf16 on AVX2 upcasts weights per forward
    skip: int = 0
    threads: int = 2
    out: Path = Path("bench-results/q4-avx2")
    dtypes: tuple[str, ...] = DTYPES


@dataclass
class Scored:
    """One dtype's run, as its subprocess reports it."""

    dtype: str
    load_s: float
    rss_before_load_gib: float
    peak_rss_after_load_gib: float
    peak_rss_after_eval_gib: float
    weight_gib: float
    eval_s: float
    nll: list[float] = field(default_factory=list)  # summed per chunk
    predicted: list[int] = field(default_factory=list)  # tokens scored per chunk
    top1: list[list[int]] = field(default_factory=list)  # argmax per scored position
    quant_summary: dict[str, int] | None = None

    @property
    def perplexity(self) -> float:
        return math.exp(sum(self.nll) / sum(self.predicted))


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# ----------------------------------------------------------------------------- data


def select_chunks(folder: Path, cfg: Settings) -> list[list[int]]:
    """A fixed selection: ShareGPT conversations in file order (after `skip`) that start
    with a user turn, each rendered with the chat template, its first `chunk` tokens one
    chunk, until `tokens` tokens (the last chunk cut to fit)."""
    from draftsman.bench.dataset_loaders import sharegpt_conversations
    from draftsman.text.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(folder)
    chunks: list[list[int]] = []
    total = 0
    for n, conv in enumerate(sharegpt_conversations()):
        if total >= cfg.tokens:
            break
        messages = [m for m in conv if m["content"].strip()]
        if n < cfg.skip or len(messages) < 2 or messages[0]["role"] != "user":
            continue
        ids = tok.encode_chat(messages)[: min(cfg.chunk, cfg.tokens - total)]
        if len(ids) < min(64, cfg.chunk):  # too short to score much past the template
            continue
        chunks.append(ids)
        total += len(ids)
    if total < cfg.tokens:
        raise SystemExit(f"q4_quality: only {total} ShareGPT tokens found, {cfg.tokens} asked")
    return chunks


# ----------------------------------------------------------------------------- worker


def weight_bytes(model: Any) -> int:
    """Bytes of every distinct tensor storage the model holds (tied weights counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def worker(dtype: str, cfg: Settings, chunks_file: Path) -> Scored:
    """Load `dtype` here (a fresh process), then score every chunk."""
    import torch
    from tqdm import tqdm

    from draftsman.models.loader import load_model
    from draftsman.store.resolve import resolve_gguf, resolve_model

    torch.set_num_threads(cfg.threads)
    chunks = json.loads(chunks_file.read_text())
    folder = resolve_model(cfg.model, pull=False)
    gguf = resolve_gguf(cfg.model, pull=False) if dtype in ("q4", "q8") else None
    before = _peak_rss_bytes()
    start = time.perf_counter()
    model = load_model(folder, dtype, gguf=gguf)
    load_s = time.perf_counter() - start
    after_load = _peak_rss_bytes()
    nll, predicted, top1 = [], [], []
    start = time.perf_counter()
    bar = tqdm(total=sum(len(c) for c in chunks), desc=f"{dtype} perplexity", unit="tok",
               file=sys.stderr)
    with torch.inference_mode():
        for ids in chunks:
            cache = model.new_cache(len(ids))
            logits = []
            for at in range(0, len(ids), cfg.step):
                part = torch.tensor([ids[at:at + cfg.step]])
                pos = torch.arange(at, at + part.shape[1])[None]
                logits.append(model(part, pos, cache).logits[0].float())
                bar.update(part.shape[1])
            scores = torch.cat(logits)[:-1]  # position i predicts token i + 1
            target = torch.tensor(ids[1:])
            nll.append(float(torch.nn.functional.cross_entropy(scores, target, reduction="sum")))
            predicted.append(len(ids) - 1)
            top1.append(scores.argmax(-1).tolist())
    bar.close()
    return Scored(dtype, round(load_s, 2), _gib(before), _gib(after_load),
                  _gib(_peak_rss_bytes()), _gib(weight_bytes(model)),
                  round(time.perf_counter() - start, 1), nll, predicted, top1,
                  getattr(model, "quant_summary", None))


def run_worker(dtype: str, cfg: Settings, chunks_file: Path) -> Scored:
    """This script in a fresh interpreter for `dtype`; its last stdout line is the JSON."""
    cmd = [sys.executable, __file__, "--worker", dtype, "--chunks-file", str(chunks_file),
           "--model", cfg.model, "--threads", str(cfg.threads), "--step", str(cfg.step)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"q4_quality: the {dtype} run failed (exit {proc.returncode})")
    return Scored(**json.loads(proc.stdout.strip().splitlines()[-1]))


# ----------------------------------------------------------------------------- report


def summarise(cfg: Settings, chunks: list[list[int]], runs: dict[str, Scored]) -> dict:
    out: dict[str, Any] = {
        "settings": {**asdict(cfg), "out": str(cfg.out)},
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "chunks": len(chunks), "tokens": sum(len(c) for c in chunks),
        "scored_tokens": sum(len(c) - 1 for c in chunks),
        "dtypes": {},
    }
    for d, r in runs.items():
        row = {k: v for k, v in asdict(r).items() if k not in ("nll", "top1")}
        out["dtypes"][d] = {**row, "perplexity": round(r.perplexity, 4),
                            "nll_per_chunk": [round(x, 3) for x in r.nll]}
    if "bf16" in runs and "q4" in runs:
        ratio = runs["q4"].perplexity / runs["bf16"].perplexity
        same = sum(a == b for x, y in zip(runs["q4"].top1, runs["bf16"].top1, strict=True)
                   for a, b in zip(x, y, strict=True))
        out["q4_vs_bf16"] = {
            "perplexity_ratio": round(ratio, 4), "goal_ratio": 1 + GOAL,
            "within_goal": ratio <= 1 + GOAL,
            "top1_agreement": round(same / out["scored_tokens"], 4),
            "peak_rss_ratio": round(runs["q4"].peak_rss_after_load_gib
                                    / runs["bf16"].peak_rss_after_load_gib, 3),
        }
    return out


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# q4 vs bf16: {s['model']}", "",
             f"{result['scored_tokens']} scored tokens in {result['chunks']} ShareGPT chunks "
             f"(≤{s['chunk']} tokens, fed {s['step']} at a time through the KV cache), "
             f"{s['threads']} threads, {result['machine']['cpu']}.", "",
             "| dtype | perplexity | load s | peak RSS after load GiB | peak RSS after eval GiB "
             "| weights held GiB | eval s |",
             "|---|---|---|---|---|---|---|"]
    for d, r in result["dtypes"].items():
        lines.append(f"| {d} | {r['perplexity']:.4f} | {r['load_s']:.1f} "
                     f"| {r['peak_rss_after_load_gib']:.2f} | {r['peak_rss_after_eval_gib']:.2f} "
                     f"| {r['weight_gib']:.2f} | {r['eval_s']:.0f} |")
    cmp = result.get("q4_vs_bf16")
    if cmp:
        verdict = "within" if cmp["within_goal"] else "NOT within"
        lines += ["", f"q4 / bf16 perplexity: **{cmp['perplexity_ratio']:.4f}** ({verdict} the "
                      f"{GOAL:.0%} goal); top-1 agreement {cmp['top1_agreement']:.1%}; "
                      f"peak RSS ratio {cmp['peak_rss_ratio']:.2f}."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=d.model, help="catalogue name, with folder and GGUF pulled")
    p.add_argument("--tokens", type=int, default=d.tokens, help="tokens to score, about")
    p.add_argument("--chunk", type=int, default=d.chunk, help="tokens per conversation chunk")
    p.add_argument("--step", type=int, default=d.step, help="tokens per cached forward")
    p.add_argument("--skip", type=int, default=d.skip, help="ShareGPT records to skip first")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads")
    p.add_argument("--dtypes", default=",".join(d.dtypes), help="comma-separated, e.g. bf16,q4")
    p.add_argument("--out", type=Path, default=d.out, help="folder for results.json / .md")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--chunks-file", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for name in ("tokens", "chunk", "step", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    cfg = Settings(a.model, a.tokens, a.chunk, a.step, a.skip, a.threads, a.out,
                   tuple(x.strip() for x in a.dtypes.split(",") if x.strip()))
    return cfg, a


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    if args.worker:
        print(json.dumps(asdict(worker(args.worker, cfg, args.chunks_file))))
        return 0
    from draftsman.store.resolve import resolve_model

    started = time.perf_counter()
    chunks = select_chunks(resolve_model(cfg.model, pull=False), cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    chunks_file = cfg.out / "chunks.json"
    chunks_file.write_text(json.dumps(chunks))
    print(f"{sum(map(len, chunks))} tokens in {len(chunks)} chunks -> {chunks_file}",
          file=sys.stderr)
    runs = {d: run_worker(d, cfg, chunks_file) for d in cfg.dtypes}
    result = summarise(cfg, chunks, runs)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    (cfg.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (cfg.out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
