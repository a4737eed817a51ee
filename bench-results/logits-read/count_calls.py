"""Every Tensor.argmax / Tensor.max call (shape, dtype, count, ms) in one `generate` of 128 new
tokens with the default method on the torch backend, q4 (the record this CPU's bench left:
staged suffix -> narrowed 0.5B, bypass), after one warm-up generate.
Run from a tree: PYTHONPATH=<tree>/src python count_calls.py"""
import collections
import time

import torch

from draftsman import engine

PROMPT = ("Write a Python function that parses an ISO 8601 date string and returns a "
          "datetime, with tests.")
stats: dict = collections.defaultdict(lambda: [0, 0.0])


def counted(name: str) -> None:
    original = getattr(torch.Tensor, name)

    def call(self, *args, **kwargs):
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        s = stats[(name, tuple(self.shape), str(self.dtype))]
        s[0] += 1
        s[1] += time.perf_counter() - start
        return out

    setattr(torch.Tensor, name, call)


for name in ("argmax", "max"):
    counted(name)
e = engine.load(backend="torch", dtype="q4")
e.generate("warm up", max_new_tokens=16)
stats.clear()
start = time.perf_counter()
e.generate(PROMPT, max_new_tokens=128)
print("total s", time.perf_counter() - start)
for key, (count, seconds) in sorted(stats.items(), key=lambda kv: -kv[1][1])[:12]:
    print(key, count, round(seconds * 1e3, 1), "ms")
