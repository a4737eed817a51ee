"""Could a cheaper copy of the LM head screen a greedy pick exactly? For each position of a
real text: the head's logits as the kernels compute them (exact), a Q4_K requantisation's
(screen), and the Cauchy-Schwarz bound |exact - screen| <= ||w_c - w'_c|| ||x~|| (x~ the
kernel's int8 activations, ||x~|| <= 1.07 ||x||, plus a 1e-3 ||w_c|| ||x~|| slack). The
candidates are the columns whose screen + bound reaches the best screen - bound; the fewer,
the cheaper an exact pick among them.

    python bench-results/head-screen/screen.py qwen2.5-coder-1.5b-instruct q4
"""
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from draftsman.models.loader import load_model
from draftsman.models.quant_linear import requantized_q4k
from draftsman.store.resolve import resolve_gguf, resolve_model

name, dtype = sys.argv[1], sys.argv[2]
torch.set_num_threads(2)
m = load_model(resolve_model(name, pull=False), dtype, gguf=resolve_gguf(name, pull=False))
head = m.lm_head
start = time.time()
W = head.weight.float()  # [V, K] as the kernels compute them
screen = requantized_q4k(W)
What = screen(torch.eye(W.shape[1])).T.contiguous()
r = (W.double() - What.double()).norm(dim=1).float()
wn = W.norm(dim=1)
print(f"head {tuple(W.shape)}, screen built in {time.time() - start:.1f} s; "
      f"median ||w - w'|| / ||w|| {(r / wn).median().item():.4f}")
text = Path("bench-results/logits-read/prompt.txt").read_text()
tok = Tokenizer.from_file(str(resolve_model(name, pull=False) / "tokenizer.json"))
ids = torch.tensor(tok.encode(text).ids[:600])[None]
cache = m.new_cache(ids.shape[1] + 1)
hidden = m(ids, torch.arange(ids.shape[1])[None], cache, logits_at=None).hidden
normed = m.norm(hidden)[0]  # [T, K]
exact, approx = head(normed).float(), screen(normed).float()
eps = (r[None] + 1e-3 * wn[None]) * normed.float().norm(dim=1, keepdim=True) * 1.07
floor = (approx - eps).max(dim=1, keepdim=True).values
candidates = approx + eps >= floor - 0.02 * floor.abs()
counts = candidates.sum(1).float()
top = exact.argmax(1)
err = (exact - approx).abs()
print(f"{ids.shape[1]} positions; argmax always a candidate: "
      f"{bool(candidates[torch.arange(len(top)), top].all())}")
print(f"candidates median {counts.median().item():.0f}, p90 {counts.quantile(0.9).item():.0f}, "
      f"max {counts.max().item():.0f} of {W.shape[0]}")
print(f"bound median {eps.median().item():.3f}, actual |exact - screen| median "
      f"{err.median().item():.3f}, largest actual / bound {(err / eps).max().item():.3f}")
