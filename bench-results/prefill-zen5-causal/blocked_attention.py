"""A prompt's causal attention in blocks of query rows as two matmuls per KV head (scores for
keys 0..block end only), timed against SDPA's is_causal, bf16 and float32, 12 query heads over
2 KV heads of 128: python blocked_attention.py ROWS. Tried, not kept (README)."""

import sys

import torch
import torch.nn.functional as F
from timing import ms  # this folder's


def blocked(q, k, v, block: int = 64) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, T, D] -> [B, T, Hq, D], causal from slot 0."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    out = torch.empty(b, t, hq, d, dtype=q.dtype)
    for s0 in range(0, t, block):
        s1 = min(t, s0 + block)
        qb = q[:, :, s0:s1].reshape(b, hkv, g * (s1 - s0), d)
        # bf16 inputs give bf16 scores here: PyTorch's CPU matmul has no float32 output for them
        scores = torch.matmul(qb, k[:, :, :s1].transpose(-1, -2)).float().mul_(d ** -0.5)
        scores = scores.view(b, hkv, g, s1 - s0, s1)
        scores.masked_fill_(torch.arange(s1)[None] > torch.arange(s0, s1)[:, None], float("-inf"))
        p = torch.softmax(scores, dim=-1).to(q.dtype).view(b, hkv, g * (s1 - s0), s1)
        o = torch.matmul(p, v[:, :, :s1]).view(b, hkv, g, s1 - s0, d)
        out[:, s0:s1] = o.permute(0, 3, 1, 2, 4).reshape(b, s1 - s0, hq, d)
    return out



def row(t: int, dtype: torch.dtype) -> str:
    q = torch.randn(1, 12, t, 128, dtype=dtype)
    k, v = (torch.randn(1, 2, t, 128, dtype=dtype) for _ in range(2))
    cells = [f"blocks of {r}: {ms(lambda r=r: blocked(q, k, v, r)):.1f} ms" for r in (64, 128)]
    causal = ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    return "; ".join([*cells, f"SDPA is_causal: {causal:.1f} ms"])


def main() -> None:
    torch.set_num_threads(2)
    t = int(sys.argv[1])
    for dtype in (torch.bfloat16, torch.float32):
        print(t, str(dtype).removeprefix("torch."), row(t, dtype))


if __name__ == "__main__":
    main()
