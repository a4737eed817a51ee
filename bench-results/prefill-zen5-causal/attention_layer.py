"""One layer's prefill attention (12 query heads over 2 KV heads of 128, bf16) timed with the
causal mask as a tensor, with SDPA's is_causal, and as draftsman's two-matmul attention:
python attention_layer.py [ROWS] (default 658)."""

import sys

import torch
import torch.nn.functional as F
from timing import ms  # this folder's

from draftsman.models.base import additive_mask, causal_mask, matmul_attention


def main() -> None:
    torch.set_num_threads(2)
    t = int(sys.argv[1]) if len(sys.argv) > 1 else 658
    q = torch.randn(1, 12, t, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, t, 128, dtype=torch.bfloat16) for _ in range(2))
    mask = causal_mask(0, t, torch.device("cpu"))
    bias = additive_mask(mask)
    sdpa = F.scaled_dot_product_attention
    print(f"SDPA, mask: {ms(lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True)):.1f} ms")
    print(f"SDPA, is_causal: {ms(lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)):.1f} ms")
    print(f"matmul_attention: {ms(lambda: matmul_attention(q, k, v, bias)):.1f} ms")


if __name__ == "__main__":
    main()
