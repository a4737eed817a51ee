"""One verify-shaped forward (ROWS new rows after 256 cached tokens, logits on every row) and
the greedy read of its logits (`greedy_tokens(...).tolist()`), ms medians over REPEATS after
3 warm-ups. WAY: kernel (greedy_rows), max (max(-1).indices) or argmax (Tensor.argmax).
usage: verify_time.py MODEL DTYPE ROWS REPEATS WAY"""
import statistics
import sys
import time

import torch

from draftsman.kernels import native
from draftsman.models.loader import load_model
from draftsman.sampling import greedy_tokens
from draftsman.store.resolve import resolve_gguf, resolve_model

name, dtype, rows, repeats, way = sys.argv[1:6]
rows, repeats = int(rows), int(repeats)
torch.set_num_threads(2)
model = load_model(resolve_model(name, pull=False), dtype, gguf=resolve_gguf(name, pull=False))
if way == "max":
    native.greedy_rows_ready = lambda: False
pick = (lambda x: x.argmax(-1)) if way == "argmax" else greedy_tokens
context = 256
cache = model.new_cache(context + rows)
model(torch.randint(0, 1000, (1, context)), torch.arange(context)[None], cache,
      logits_at=slice(-1, None))
ids, pos = torch.randint(0, 1000, (1, rows)), torch.arange(context, context + rows)[None]
forward, read = [], []
for i in range(repeats + 3):
    t0 = time.perf_counter()
    out = model(ids, pos, cache, logits_at=slice(None), start=context)
    t1 = time.perf_counter()
    pick(out.logits[0]).tolist()
    t2 = time.perf_counter()
    if i >= 3:
        forward.append((t1 - t0) * 1e3)
        read.append((t2 - t1) * 1e3)
print(f"{way}: forward {statistics.median(forward):.2f} ms, "
      f"greedy read {statistics.median(read):.3f} ms")
