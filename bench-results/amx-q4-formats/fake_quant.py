"""Perplexity of the 1.5B with its matrices requantised into tile-friendly 4-bit formats.

Fake quantisation in float32 (transformers), on the same ShareGPT chunks as
scripts/q4_quality.py: every Linear but the LM head (tied to the embeddings, left as it is)
rounded to nearest into int4 groups of G along k, asymmetric (a scale and a minimum per group
and column, levels 0..15) or symmetric (a scale, levels -7.5..7.5). The folder's weights are
the GGUF's Q4_K / Q6_K blocks dequantised, so this measures what requantising them costs.

    .venv/bin/python bench-results/amx-q4-formats/fake_quant.py > fake-quant.txt
"""

import math
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from q4_quality import Settings, select_chunks  # noqa: E402

torch.set_num_threads(2)
folder = Path.home() / ".cache/draftsman/models/qwen2.5-coder-1.5b-instruct"
chunks = select_chunks(folder, Settings(tokens=2000))
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
original = {n: m.weight.data.clone() for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n != "lm_head"}


def requantised(w: torch.Tensor, group: int, symmetric: bool) -> torch.Tensor:
    out, k = w.shape
    x = w.reshape(out, k // group, group)
    if symmetric:
        s = (x.abs().amax(-1, keepdim=True) / 7.5).clamp_min(1e-12)
        q = torch.clamp(torch.round(x / s - 0.5), -8, 7) + 0.5
        return (q * s).reshape(out, k)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    s = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.clamp(torch.round((x - lo) / s), 0, 15)
    return (q * s + lo).reshape(out, k)


def perplexity() -> float:
    nll, n = 0.0, 0
    with torch.no_grad():
        for c in chunks:
            ids = torch.tensor([c])
            logits = model(ids).logits[0, :-1].float()
            nll += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            n += len(c) - 1
    return math.exp(nll / n)


base = perplexity()
print(f"{sum(len(c) - 1 for c in chunks)} scored tokens; as stored (float32): {base:.4f}")
for group, symmetric in [(32, False), (64, False), (128, False), (256, False), (64, True),
                         (128, True)]:
    for name, module in model.named_modules():
        if name in original:
            module.weight.data = requantised(original[name], group, symmetric)
    p = perplexity()
    kind = "symmetric" if symmetric else "asymmetric"
    print(f"int4 {kind} groups of {group}: {p:.4f} ({p / base:.4f}x)", flush=True)
