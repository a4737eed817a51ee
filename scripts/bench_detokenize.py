"""Detokenisation cost per generated token: full re-decode every step vs the incremental one.

    flock /tmp/cpu.lock python scripts/bench_detokenize.py --out bench-results/detokenize

Token ids are real text (assistant turns from ShareGPT, multilingual) through the real Qwen
tokenizer, fed one token per step as autoregressive decoding does. Contestants, interleaved
round by round so drift hits both alike:
  before  ids.extend(step); text = tok.decode(ids)   (what engine.py did every step)
  after   Detokenizer.push(step)                     (text/detokenizer.py)
  stream  TextStream.push(step) with a stop string   (the engine's whole text path now)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from draftsman.bench.data_sources import ensure
from draftsman.store.resolve import resolve_model
from draftsman.text.detokenizer import Detokenizer
from draftsman.text.stops import StopMatcher
from draftsman.text.stream import TextStream
from draftsman.text.tokenizer import Tokenizer

MODEL = "qwen2.5-coder-1.5b-instruct"
LENGTHS = (128, 1024, 4096)


def sharegpt_text(min_chars: int) -> str:
    """Assistant turns of the first ShareGPT conversations, joined (the file is cut off
    mid-record, so records are read one by one)."""
    with ensure("sharegpt").open(encoding="utf-8") as f:
        raw = f.read(200 * min_chars)  # the first conversations are plenty
    decoder, pos, parts, size = json.JSONDecoder(), 0, [], 0
    while size < min_chars:
        record, pos = decoder.raw_decode(raw, raw.index("{", pos))
        for turn in record.get("conversations", []):
            if turn.get("from") == "gpt":
                parts.append(turn["value"])
                size += len(turn["value"])
    return "\n\n".join(parts)


def before(tok: Tokenizer, ids: list[int]) -> float:
    t0 = time.perf_counter()
    seen: list[int] = []
    for t in ids:
        seen.extend([t])
        tok.decode(seen)
    return time.perf_counter() - t0


def after(tok: Tokenizer, ids: list[int]) -> float:
    t0 = time.perf_counter()
    detok = Detokenizer(tok.decode)
    for t in ids:
        detok.push([t])
    return time.perf_counter() - t0


def stream(tok: Tokenizer, ids: list[int]) -> float:
    t0 = time.perf_counter()
    text = TextStream(tok.decode, StopMatcher(("<|never|>",)))
    for t in ids:
        text.push([t])
    return time.perf_counter() - t0


CONTESTANTS = {"before": before, "after": after, "stream": stream}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json/md")
    args = parser.parse_args()

    tok = Tokenizer.from_folder(resolve_model(MODEL, pull=False))
    ids = tok.encode(sharegpt_text(8 * max(LENGTHS)), special=False)[: max(LENGTHS)]
    assert len(ids) == max(LENGTHS), "not enough text"
    rows = []
    for n in LENGTHS:
        times: dict[str, list[float]] = {name: [] for name in CONTESTANTS}
        for _ in range(args.rounds):
            for name, run in CONTESTANTS.items():
                times[name].append(run(tok, ids[:n]))
        rows.append({"tokens": n, **{f"{name}_us_per_token": statistics.median(ts) / n * 1e6
                                     for name, ts in times.items()}})
    lines = ["| new tokens | before (µs/token) | after (µs/token) | stream (µs/token) | speed-up |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['before_us_per_token']:.1f} | "
                     f"{r['after_us_per_token']:.1f} | {r['stream_us_per_token']:.1f} | "
                     f"{r['before_us_per_token'] / r['after_us_per_token']:.0f}x |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"model": MODEL, "rounds": args.rounds, "rows": rows}, indent=2) + "\n")
        (args.out / "results.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
