#!/usr/bin/env python3
"""How cheap could the 0.5B draft be in 4 bits? (issue 30, MT-Bench turn 1)

    .venv/bin/python scripts/draft_int4_cost.py

Times one-row forwards after 256 cached tokens, in five rounds, of the 1.5B under `--dtype
q4`, the 0.5B as `--dtype q4` loads it (its GGUF's Q5_0 / Q8_0 matrices become int8 rows),
and the 0.5B with every such int8 matrix requantised to int4 groups of 32 (asymmetric,
lossy: a draft needs no exactness). c = a draft forward / a target forward.
"""
import statistics

import torch

import draftsman
from draftsman.models import quant_linear as ql
from draftsman.profiling import measure_latency

torch.set_num_threads(2)
target = draftsman.load("qwen2.5-coder-1.5b-instruct", dtype="q4", backend="torch").target.model
draft = draftsman.load("qwen2.5-coder-0.5b-instruct", dtype="q4", backend="torch").target.model
small = draftsman.load("qwen2.5-coder-0.5b-instruct", dtype="q4", backend="torch").target.model

def int4_of(m: torch.nn.Module) -> ql.Int4Matrix:
    """An int8-row matrix requantised to int4 groups of 32, min/max per group."""
    w = m.weight_int8.float() * m.scale.float()[:, None]
    n, k = w.shape
    g = w.view(n, k // 32, 32)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    rows = ql.Int4Rows(q.view(n, k), scale, lo + 8 * scale)
    return ql.Int4Matrix(rows, torch.bfloat16)

swapped = 0
for mod in small.modules():
    if isinstance(mod, ql.QuantLinear):
        for i, part in enumerate(mod.parts):
            int8 = isinstance(part, (ql.OneDnnInt8Matrix, ql.Int8Matrix))
            if int8 and part.weight_int8.shape[1] % 32 == 0:
                mod.parts[i] = int4_of(part)
                swapped += 1
print("int8 matrices requantised to int4:", swapped)
times = {"1.5B q4": [], "0.5B q4 (int8 rows)": [], "0.5B int4": []}
for _ in range(5):
    for name, m in (("1.5B q4", target), ("0.5B q4 (int8 rows)", draft), ("0.5B int4", small)):
        times[name].append(measure_latency(m, [1], context=256, repeats=5)[1])
base = statistics.median(times["1.5B q4"])
for name, t in times.items():
    print(f"{name}: {statistics.median(t) * 1e3:.1f} ms, c = {statistics.median(t) / base:.2f}")
