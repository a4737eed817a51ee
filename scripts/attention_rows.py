#!/usr/bin/env python3
"""The fused attention op alone (`torch.ops.draftsman.rope_attention`, kernels/attention_ops.cpp):
ms for one forward's worth of calls (28 layers of the 1.5B: 12 query heads, 2 KV heads, head
size 128) over T new rows after `--context` cached tokens, best of 7.

    scripts/attention_rows.py                       # bf16, 256 cached tokens
    scripts/attention_rows.py --context 1500 --rows 1,8
"""

from __future__ import annotations

import argparse
import time

import torch

from draftsman.kernels.native import kquant_available, unavailable_reason


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,4,8,16,32", help="comma-separated new-row counts")
    p.add_argument("--context", type=int, default=256, help="cached tokens before the rows")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", default="12,2,128",
                   help="query heads, KV heads, head size (default the 1.5B's; the 0.5B: 14,2,64)")
    a = p.parse_args()
    if not kquant_available():
        raise SystemExit(f"the kernels do not load here: {unavailable_reason()}")
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    nq, nkv, d = (int(v) for v in a.heads.split(","))
    rows = [int(r) for r in a.rows.split(",")]
    capacity = a.context + max(rows)
    k = torch.randn(1, nkv, capacity, d).to(dtype)
    v = torch.randn(1, nkv, capacity, d).to(dtype)
    print(f"| rows | ms per {a.layers} layers ({a.dtype}, {a.context} cached tokens) |")
    print("|---|---|")
    for t in rows:
        qkv = torch.randn(1, t, (nq + 2 * nkv) * d).to(dtype)
        cos, sin = torch.randn(1, t, 1, d).to(dtype), torch.randn(1, t, 1, d).to(dtype)
        bias = torch.zeros(1, 1, t, a.context + t)
        bias[0, 0, :, a.context:] = torch.full((t, t), float("-inf")).triu(1)

        args = (qkv, cos, sin, k, v, a.context, bias, d ** -0.5, nq, nkv)

        def call(args: tuple = args) -> None:
            torch.ops.draftsman.rope_attention(*args)

        for _ in range(3):
            call()
        best = float("inf")
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(a.layers):
                call()
            best = min(best, time.perf_counter() - start)
        print(f"| {t} | {best * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
