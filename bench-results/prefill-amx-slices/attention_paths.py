"""A prompt's prefill on the 1.5B q4 with its causal attention on SDPA and on the fused op in
blocks (`runs_causal_in_blocks`, where the model takes it), each profiled:
python attention_paths.py N [ROUNDS] (the top operators of each, self CPU time; the two
alternated in ABBA order over ROUNDS rounds, 1 by default)."""

import sys
import time

import torch
from torch.profiler import profile

from draftsman.models import llama
from draftsman.models.loader import load_model
from draftsman.store.resolve import resolve_gguf, resolve_model

NAME = "qwen2.5-coder-1.5b-instruct"


def prefill(model: torch.nn.Module, ids: torch.Tensor) -> float:
    n = ids.shape[1]
    cache = model.new_cache(n + 32)
    start = time.perf_counter()
    model(ids, torch.arange(n)[None], cache, logits_at=slice(-1, None))
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    model = load_model(resolve_model(NAME, pull=False), "q4", gguf=resolve_gguf(NAME, pull=False))
    in_blocks = llama.runs_causal_in_blocks
    n, rounds = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
    ids = torch.randint(0, 1000, (1, n))
    order = [(False, True), (True, False)]
    for blocks in (b for r in range(rounds) for b in order[r % 2]):
        llama.runs_causal_in_blocks = in_blocks if blocks else lambda *args: False
        ms = [prefill(model, ids) for _ in range(3)]
        with profile() as p:
            prefill(model, ids)
        print(f"## attention in blocks: {blocks}; prefill of {n} tokens: "
              + " / ".join(f"{v:.0f}" for v in ms) + " ms")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
