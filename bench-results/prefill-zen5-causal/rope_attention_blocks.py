"""One layer's RoPE, cache write and attention (12 query heads over 2 KV heads of 128, bf16) on
draftsman's fused op: ROWS causal rows from slot 0 in blocks of 64 / 128 / 256 rows (each
block's causal bias), against one call with the whole causal bias; says whether the outputs
are bit for bit the one call's: python rope_attention_blocks.py ROWS."""

import sys

import torch
from timing import ms  # this folder's

from draftsman.kernels.native import kquant_available
from draftsman.models.base import additive_mask, cached_causal_bias, causal_mask
from draftsman.models.cache import KVCache

N_HEADS, N_KV, D = 12, 2, 128
CPU = torch.device("cpu")



def main() -> None:
    if not kquant_available():
        sys.exit("the fused CPU ops do not load here")
    torch.set_num_threads(2)
    t, dtype = int(sys.argv[1]), torch.bfloat16
    qkv = torch.randn(1, t, (N_HEADS + 2 * N_KV) * D, dtype=dtype)
    angles = torch.randn(1, t, 1, D // 2)
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype).contiguous()
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype).contiguous()
    cache = KVCache(1, N_KV, D, t + 8, dtype=dtype)

    def blocks(rows: int) -> torch.Tensor:
        out = []
        for s0 in range(0, t, rows):
            s1 = min(t, s0 + rows)
            out.append(cache.write_rotated_and_attend(
                0, s0, qkv[:, s0:s1].contiguous(), cos[:, s0:s1].contiguous(),
                sin[:, s0:s1].contiguous(), cached_causal_bias(s0, s1 - s0, CPU), N_HEADS, N_KV))
        return torch.cat(out, 1)

    whole = additive_mask(causal_mask(0, t, CPU))

    def one_call() -> torch.Tensor:
        return cache.write_rotated_and_attend(0, 0, qkv, cos, sin, whole, N_HEADS, N_KV)

    ref = one_call()
    for rows in (64, 128, 256):
        same = torch.equal(blocks(rows), ref)
        took = ms(lambda r=rows: blocks(r), 3)
        print(t, f"blocks of {rows}: {took:.1f} ms, the one call's bits: {same}")
    print(t, f"one call, the whole bias: {ms(one_call, 3):.1f} ms")


if __name__ == "__main__":
    main()
