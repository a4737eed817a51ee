#!/usr/bin/env python3
"""Rank a tokenizer's tokens by how often ShareGPT conversations use them, for drafts whose
head scores only the most frequent ones (`--option draft_vocab=N`, models/draft_vocab.py).

    scripts/token_ranks.py --model qwen2.5-coder-0.5b-instruct
    scripts/token_ranks.py --model /path/to/folder --out /path/to/folder/token_ranks.npy

Writes the ids of every token seen, most frequent first (ties by id), as uint32: by default
into src/draftsman/assets/token_ranks/<tokenizer key>.npy, which every model sharing that
tokenizer.json uses. Both sides of each conversation are counted (ShareGPT V3, the first
`--conversations` complete records; none of the benchmark's prompts come from it).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from draftsman.bench.data_sources import ensure
from draftsman.models.draft_vocab import tokenizer_key
from draftsman.store.resolve import resolve_model

ASSETS = Path(__file__).resolve().parents[1] / "src" / "draftsman" / "assets" / "token_ranks"


def conversations(path: Path, limit: int) -> list[str]:
    """Every turn's text of the first `limit` complete records (the file is cut off
    mid-record: decoded one record at a time)."""
    text = path.read_text()
    decoder, i, turns, n = json.JSONDecoder(), text.index("[") + 1, [], 0
    while n < limit:
        while i < len(text) and text[i] in " ,\n\r\t":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the cut-off tail
        turns += [t["value"] for t in record.get("conversations", []) if t.get("value")]
        n += 1
    return turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct",
                   help="catalogue name or model folder (its tokenizer.json)")
    p.add_argument("--conversations", type=int, default=6000)
    p.add_argument("--out", type=Path, default=None,
                   help="default: the shipped asset for this tokenizer")
    a = p.parse_args()
    folder = resolve_model(a.model)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    turns = conversations(ensure("sharegpt"), a.conversations)
    counts: Counter[int] = Counter()
    batch = 512
    for start in tqdm(range(0, len(turns), batch), desc="tokenising", unit="batch"):
        for enc in tokenizer.encode_batch(turns[start:start + batch]):
            counts.update(enc.ids)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    out = a.out or ASSETS / f"{tokenizer_key(folder)}.npy"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, np.asarray(ranked, dtype=np.uint32))
    total = sum(counts.values())
    print(f"{len(turns)} turns, {total} tokens, {len(ranked)} distinct -> {out}")
    for n in (8192, 16384, 32768, 65536):
        covered = sum(counts[t] for t in ranked[:n]) / total
        print(f"  top {n}: {covered:.4f} of the corpus' tokens")


if __name__ == "__main__":
    main()
