"""Forwards of T new rows after 256 cached tokens, timed after a marker file appears, for
`perfrun.sh` to sample: python fwd.py MODEL DTYPE ROWS FORWARDS."""

import sys
import time
from pathlib import Path

import torch

from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model

CONTEXT = 256


def main() -> None:
    name, dtype, rows, forwards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(2)
    model = load_model(resolve_model(name, pull=False), dtype,
                       gguf=resolve_gguf(name, pull=False))
    cache = model.new_cache(CONTEXT + 32)
    model(torch.randint(0, 1000, (1, CONTEXT)), torch.arange(CONTEXT)[None], cache,
          logits_at=slice(-1, None))
    ids = torch.zeros(1, rows, dtype=torch.long)
    pos = torch.arange(CONTEXT, CONTEXT + rows)[None]
    for _ in range(5):
        model(ids, pos, cache, logits_at=slice(None), start=CONTEXT)
    Path("/tmp/w/marker").write_text("go")  # perfrun.sh starts sampling here
    start = time.perf_counter()
    for _ in range(forwards):
        model(ids, pos, cache, logits_at=slice(None), start=CONTEXT)
    print(rows, f"ms/forward {(time.perf_counter() - start) / forwards * 1e3:.2f}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
