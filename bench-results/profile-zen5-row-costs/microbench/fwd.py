"""Forwards of T new rows after 256 cached tokens, timed after a marker file appears, for
`perfrun.sh` to sample: python fwd.py MODEL DTYPE ROWS FORWARDS."""

import sys
import time
from pathlib import Path

import torch
from fwd_rows import CONTEXT, loaded  # this folder: the script's own on sys.path


def main() -> None:
    name, dtype, rows, forwards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    model, cache = loaded(name, dtype)
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
