"""Median ms of forwards of T new rows after 256 cached tokens, each row count in turn:
python fwd_rows.py MODEL DTYPE ROWS,... REPEATS (one line: rows:ms ...). An A/B of two
builds or kernel switches runs it alternately (`ab_env.sh`)."""

import statistics
import sys
import time

import torch

from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model

CONTEXT = 256


def loaded(name: str, dtype: str):
    """The model on 2 threads and a cache holding CONTEXT prompt tokens (fwd.py's too)."""
    torch.set_num_threads(2)
    model = load_model(resolve_model(name, pull=False), dtype,
                       gguf=resolve_gguf(name, pull=False))
    cache = model.new_cache(CONTEXT + 32)
    model(torch.randint(0, 1000, (1, CONTEXT)), torch.arange(CONTEXT)[None], cache,
          logits_at=slice(-1, None))
    return model, cache


def main() -> None:
    name, dtype = sys.argv[1], sys.argv[2]
    row_counts, repeats = [int(r) for r in sys.argv[3].split(",")], int(sys.argv[4])
    model, cache = loaded(name, dtype)
    cells = []
    for rows in row_counts:
        ids = torch.zeros(1, rows, dtype=torch.long)
        pos = torch.arange(CONTEXT, CONTEXT + rows)[None]
        for _ in range(3):
            model(ids, pos, cache, logits_at=slice(None), start=CONTEXT)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids, pos, cache, logits_at=slice(None), start=CONTEXT)
            times.append(time.perf_counter() - start)
        cells.append(f"{rows}:{statistics.median(times) * 1e3:.2f}")
    print(" ".join(cells))


if __name__ == "__main__":
    main()
