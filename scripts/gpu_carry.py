#!/usr/bin/env python3
"""Prepare what `make gpu-check` needs beside the tree on an offline GPU machine.

    scripts/gpu_carry.py [--carry .gpu-carry] [--part-size 33M]

Writes (the folder is git-ignored; the device tool's `carry` takes it):
  base/wheels/       pure-Python wheels of our dependencies that machine lacks (gguf,
                     rouge-score, nltk), built here with `pip wheel --no-deps`
  base/like/NAME/    the default pair's config.json and tokenizer (gzipped): random-weight
                     folders of their shapes are drawn there (`draftsman models random`);
                     gguf-types.json, the GGML type of each matrix of its GGUF, for random
                     quantised models of the same blocks (bench/quant_curves.py)
  base/datasets/     HumanEval and MT-Bench as the store keeps them (hash-checked there)
  partK/             SmolLM2's GGUF in parts (scripts/split_gguf.py), the manifest in the
                     last: each call carries base once and one part, so the parts arrive
                     over consecutive calls while the machine stays warm (its files stay)
A call sends the tree plus what it carries, at most 64 MiB: the part size is chosen so that
base and one part fit beside today's tree (24 MB).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

from draftsman.bench.quant_curves import TYPES_FILE

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ("gguf==0.19.0", "rouge-score==0.1.2", "nltk==3.9.2")
PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
SMALL = "smollm2-135m-instruct"
LIKE_FILES = ("config.json", "tokenizer_config.json", "generation_config.json")
DATASETS = ("HumanEval.jsonl.gz", "mt_bench_question.jsonl")


def draftsman(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "draftsman", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def write_block_types(name: str, path: Path) -> None:
    """The GGML type of every matrix of `name`'s GGUF, by Hugging Face name."""
    from draftsman.store.gguf_blocks import read_gguf_blocks

    gguf = Path(draftsman("models", "path", name, "--gguf"))
    path.write_text(json.dumps(read_gguf_blocks(gguf).qtypes(), indent=0, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--carry", type=Path, default=ROOT / ".gpu-carry")
    p.add_argument("--part-size", default="33M")
    args = p.parse_args(argv)
    base = args.carry / "base"
    shutil.rmtree(args.carry, ignore_errors=True)
    (base / "wheels").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(base / "wheels"), *WHEELS], check=True)
    for name in PAIR:
        folder = Path(draftsman("models", "path", name))
        like = base / "like" / name
        like.mkdir(parents=True)
        for file in LIKE_FILES:
            if (folder / file).is_file():
                shutil.copy2(folder / file, like / file)
        (like / "tokenizer.json.gz").write_bytes(
            gzip.compress((folder / "tokenizer.json").read_bytes(), 9))
        write_block_types(name, like / TYPES_FILE)
    home = Path(draftsman("models", "path", PAIR[0])).parent.parent
    (base / "datasets").mkdir()
    for file in DATASETS:
        shutil.copy2(home / "datasets" / file, base / "datasets" / file)
    gguf = Path(draftsman("models", "path", SMALL, "--gguf"))
    split = args.carry / "split"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "split_gguf.py"), str(gguf),
                    args.part_size, "--out-dir", str(split)], check=True)
    parts = sorted(split.glob(f"{gguf.name}.part[0-9]*"))
    for i, part in enumerate(parts):
        (args.carry / f"part{i}").mkdir()
        part.rename(args.carry / f"part{i}" / part.name)
    manifest = split / f"{gguf.name}.parts.json"
    manifest.rename(args.carry / f"part{len(parts) - 1}" / manifest.name)
    split.rmdir()
    for folder in sorted(args.carry.iterdir()):
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(f"{folder.name}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
