"""Prefill of a random N-token prompt on the 1.5B q4 (or MODEL), 2 threads, timed R times:
python prefill.py N R [MODEL] (one line a prefill: N, ms, ms a token)."""

import sys
import time

import torch

from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model

NAME = "qwen2.5-coder-1.5b-instruct"


def main() -> None:
    torch.set_num_threads(2)
    n, repeats = int(sys.argv[1]), int(sys.argv[2])
    name = sys.argv[3] if len(sys.argv) > 3 else NAME
    model = load_model(resolve_model(name, pull=False), "q4", gguf=resolve_gguf(name, pull=False))
    ids = torch.randint(0, 1000, (1, n))
    for _ in range(repeats):
        cache = model.new_cache(n + 32)
        start = time.perf_counter()
        model(ids, torch.arange(n)[None], cache, logits_at=slice(-1, None))
        ms = (time.perf_counter() - start) * 1e3
        print(n, f"{ms:.0f} ms", f"{ms / n:.2f} ms/token", flush=True)


if __name__ == "__main__":
    main()
