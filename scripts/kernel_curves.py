#!/usr/bin/env python3
"""The verify cost curve of every CPU matrix kernel the project can use, side by side.

v(k) = time(k activation rows) / time(1 row) over `--matrices` distinct weight matrices of
the 1.5B's largest shape (8960 x 1536 by default: more bytes than the caches hold, so every
sweep streams the weights from memory, as a decode step does). Kernels are timed interleaved
(each repeat runs every kernel at every k) so load on the machine hits them alike:
- onednn-int8: int8 weights x int8 activations per row (quant_linear.OneDnnInt8Matrix);
- int8pack: PyTorch's weight-only int8 (`_weight_int8pack_mm`, bf16 activations);
- int4pack: PyTorch's weight-only int4 groups of 32 (`_weight_int4pack_mm_for_cpu`);
- kquant-q4k: draftsman's K-quant kernel on Q4_K blocks (where it builds), its widest vector
  path (`kquant_isa`); kquant-q4k-avx2 beside it where that is AVX-512, and the same blocks
  repacked into records of 16 rows where the CPU has AVX-512 VNNI or AVX2:
  kquant-q4k-records (vectors) or, where it has AMX, kquant-q4k-amx (tiles from the row count
  kernels/tile_rows.py measured);
- int8-records: onednn-int8's int8 rows and scales repacked into records of 16 rows
  (int8_linear.Int8RecordsMatrix, AVX-512 VNNI), activations in int8 per 256: q8's kernel
  there; q8_0-records: the same weights as Q8_0 blocks of 32 on records (the 0.5B's Q5_0 /
  Q8_0 matrices under q4);
- bf16: a dense bf16 matmul.
Writes one JSON line per (kernel, k) with the CPU's name and flags.

    python scripts/kernel_curves.py --out bench-results/kernels-avx2/results.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from draftsman.bench.quant_curves import random_block_rows
from draftsman.hardware import cpu_flags, cpu_model
from draftsman.kernels.native import (
    byte_records,
    kquant_amx,
    kquant_available,
    kquant_isa,
    kquant_records,
)
from draftsman.models.int8_linear import Int8Matrix, Int8RecordsMatrix, OneDnnInt8Matrix
from draftsman.models.quant_linear import (
    Int4Matrix,
    KQuantMatrix,
    KQuantRecordsMatrix,
    decode_int4,
)
from draftsman.models.weight_formats import activation_bits
from draftsman.store.gguf_blocks import BlockTensor

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def q4k_blocks(n: int, k: int, rng: np.random.Generator) -> BlockTensor:
    """Random valid Q4_K rows (bench/quant_curves.random_block_rows)."""
    return BlockTensor("w", 12, (n, k), random_block_rows(12, n, k, rng))


def q6k_blocks(n: int, k: int, rng: np.random.Generator) -> BlockTensor:
    """Random valid Q6_K rows (bench/quant_curves.random_block_rows)."""
    return BlockTensor("w", 14, (n, k), random_block_rows(14, n, k, rng))


def q8_0_blocks(w: torch.Tensor) -> BlockTensor:
    """w as Q8_0 blocks (gguf's own quantiser)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    rows = quantize(w.numpy(), GGMLQuantizationType.Q8_0)
    return BlockTensor("w", int(GGMLQuantizationType.Q8_0), tuple(w.shape), rows)


def make_kernels(n: int, k: int, count: int) -> dict[str, list[Callable]]:
    """Per kernel, `count` distinct matrices as callables x -> y."""
    rng = np.random.default_rng(0)
    kernels: dict[str, list[Callable]] = {"onednn-int8": [], "int8pack": [], "int4pack": [],
                                          "bf16": []}
    if kquant_available():
        kernels["kquant-q4k"] = []
        if kquant_isa() != "avx2":
            kernels["kquant-q4k-avx2"] = []
        if kquant_records():  # AMX tiles where kquant_amx
            kernels["kquant-q4k-amx" if kquant_amx() else "kquant-q4k-records"] = []
        if byte_records():
            kernels["int8-records"], kernels["q8_0-records"] = [], []
    for _ in range(count):
        blocks = q4k_blocks(n, k, rng)
        w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32)) * 0.02
        kernels["onednn-int8"].append(OneDnnInt8Matrix(w, torch.bfloat16))
        kernels["int8pack"].append(Int8Matrix(w, torch.bfloat16))
        kernels["int4pack"].append(Int4Matrix(decode_int4(blocks), torch.bfloat16))
        kernels["bf16"].append(torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16))
        if "kquant-q4k" in kernels:
            kernels["kquant-q4k"].append(KQuantMatrix([blocks]))
        for name in ("kquant-q4k-amx", "kquant-q4k-records"):
            if name in kernels:
                kernels[name].append(KQuantRecordsMatrix([blocks]))
        if "int8-records" in kernels:
            kernels["int8-records"].append(Int8RecordsMatrix(w))
            kernels["q8_0-records"].append(KQuantRecordsMatrix([q8_0_blocks(w)]))
        if "kquant-q4k-avx2" in kernels:
            rows = kernels["kquant-q4k"][-1].blocks
            kernels["kquant-q4k-avx2"].append(
                lambda x, rows=rows: torch.ops.draftsman.kquant_mm(x, rows, 12, 1))
    return kernels


def sweep(mats: list[Callable], x: torch.Tensor) -> float:
    start = time.perf_counter()
    for m in mats:
        m(x)
    return time.perf_counter() - start


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,4,8,16,32", help="activation rows k, comma separated")
    p.add_argument("--shape", default="8960x1536", help="N x K of each matrix")
    p.add_argument("--matrices", type=int, default=24, help="distinct matrices per sweep")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n, k = (int(v) for v in args.shape.lower().split("x"))
    rows = [int(r) for r in args.rows.split(",")]
    kernels = make_kernels(n, k, args.matrices)
    xs = {r: torch.randn(r, k, dtype=torch.bfloat16) for r in rows}
    times: dict[tuple[str, int], list[float]] = {(name, r): [] for name in kernels for r in rows}
    for mats in kernels.values():  # warm-up: first-touch and oneDNN's primitive cache
        for r in rows:
            sweep(mats, xs[r])
    for _ in range(args.repeats):
        for r in rows:
            for name, mats in kernels.items():
                times[(name, r)].append(sweep(mats, xs[r]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    env = {"cpu": cpu_model(), "isa": sorted(cpu_flags() & set(ISA_FLAGS)),
           "threads": torch.get_num_threads(), "torch": torch.__version__,
           "machine": platform.machine(), "commit": commit,
           "onednn_activation_bits": activation_bits(), "kquant_isa": kquant_isa()}
    lines = []
    print(f"{args.matrices} x {n}x{k} per sweep, {env['threads']} threads, {env['cpu']}")
    print(f"{'kernel':<16}" + "".join(f"{f'k={r}':>16}" for r in rows))
    for name in kernels:
        one = statistics.median(times[(name, rows[0])])
        cells = []
        for r in rows:
            med = statistics.median(times[(name, r)])
            cells.append(f"{med * 1e3:8.1f} ({med / one:4.2f})")
            lines.append({"kernel": name, "rows": r, "ms": med * 1e3, "v": med / one,
                          "best_ms": min(times[(name, r)]) * 1e3, "shape": [n, k],
                          "matrices": args.matrices, "env": env})
        print(f"{name:<16}" + "".join(f"{c:>16}" for c in cells))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
