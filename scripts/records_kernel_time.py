#!/usr/bin/env python3
"""ms per 8960 x 1536 (or `--shape`) Q4_K (or Q6_K, Q8_0, int8-row) matrix on the records kernel
(`kquant_records_mm`), from memory and from cache: an A/B of two builds is this script run
at each commit in turn, a few times.

    scripts/records_kernel_time.py --rows 1,16 [--qtype q6_k]
    scripts/records_kernel_time.py --rows 1,16 --qtype i8_row   # q8's int8 rows
    scripts/records_kernel_time.py --qtype i8_row --shape 9728,896   # the 0.5B's gate/up
    scripts/records_kernel_time.py --qtype q8_0 --shape 9728,896   # the same under q4 (Q5_0)
    DRAFTSMAN_KQUANT_AMX=0 scripts/records_kernel_time.py   # the vector path on an AMX CPU

"from memory": 24 distinct matrices per sweep (more than the caches hold, as a decode step
streams its weights); "from cache": one matrix 24 times (the kernel's compute alone).
Medians of `--repeats` sweeps. Needs a CPU with AVX-512 VNNI (tiles where it has AMX-INT8) or AVX2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_curves import q4k_blocks, q6k_blocks, q8_0_blocks  # noqa: E402

from draftsman.kernels.native import byte_records, kquant_records  # noqa: E402
from draftsman.models.int8_linear import Int8RecordsMatrix  # noqa: E402
from draftsman.models.quant_linear import KQuantRecordsMatrix  # noqa: E402


def sweep(mats: list, x: torch.Tensor) -> float:
    start = time.perf_counter()
    for m in mats:
        m(x)
    return (time.perf_counter() - start) / len(mats) * 1e3


@torch.inference_mode()
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,16", help="activation rows, comma separated")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--qtype", choices=("q4_k", "q6_k", "q8_0", "i8_row"), default="q4_k",
                   help="the weights' block type (i8_row: q8's int8 rows, one scale each)")
    p.add_argument("--shape", default="8960,1536",
                   help="out,in features of each matrix (in: a multiple of 256, "
                        "or of 128 for i8_row)")
    a = p.parse_args()
    out, inner = (int(v) for v in a.shape.split(","))
    if not kquant_records():
        print("this CPU or build has neither AVX-512 VNNI nor AVX2: no K-quant records",
              file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    if a.qtype in ("i8_row", "q8_0"):
        if not byte_records():
            print("this CPU or build has no AVX-512 VNNI: no 8-bit records", file=sys.stderr)
            return 2
        weights = (torch.from_numpy(rng.standard_normal((out, inner), dtype=np.float32))
                   for _ in range(24))
        mats = [Int8RecordsMatrix(w) if a.qtype == "i8_row" else
                KQuantRecordsMatrix([q8_0_blocks(w)]) for w in weights]
    else:
        blocks = q4k_blocks if a.qtype == "q4_k" else q6k_blocks
        mats = [KQuantRecordsMatrix([blocks(out, inner, rng)]) for _ in range(24)]
    print("| rows | from memory ms | from cache ms |\n|---|---|---|")
    for rows in (int(r) for r in a.rows.split(",")):
        x = torch.randn(rows, inner, dtype=torch.bfloat16)
        memory = statistics.median(sweep(mats, x) for _ in range(a.repeats))
        cached = statistics.median(sweep([mats[0]] * 24, x) for _ in range(a.repeats))
        print(f"| {rows} | {memory:.3f} | {cached:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
