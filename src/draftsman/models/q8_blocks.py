"""Q8_0 blocks on the records kernel (kernels/q8_records.h), for a GGUF's 8-bit and 5-bit
matrices under q4 (the 0.5B's GGUF keeps most in Q5_0 and some in Q8_0).

A Q8_0 block is GGML's: 32 weights w = d q, d one float16, q int8 (34 bytes). Where the CPU
has AVX-512 VNNI (weight_formats.int8_kernel() == "records") they are repacked into records
of 16 rows and multiplied against activations in int8 per 256, so that verifying 16 rows
costs little more than one. They come from:
- a GGUF's Q8_0 blocks, as stored;
- a GGUF's Q5_0 blocks, exactly: w = d (q5 - 16) with q5 in 0..31 is the Q8_0 block with the
  same d and q = q5 - 16 (1 byte a weight instead of 0.69, for a kernel that reads whole
  bytes with nothing to unpack; 1 byte is what the int8 rows these matrices took before
  read, with per-row scales instead of the GGUF's).
"""

from __future__ import annotations

import numpy as np

from draftsman.errors import UnsupportedError
from draftsman.kernels.block_types import GGMLType
from draftsman.store.gguf_blocks import BlockTensor

Q5_0, Q8_0 = GGMLType.Q5_0, GGMLType.Q8_0
BLOCK = 32  # weights per block
Q5_0_BYTES, Q8_0_BYTES = 22, 34
EXACT = {Q5_0: "Q5_0", Q8_0: "Q8_0"}  # block types Q8_0 holds as they are


def fits(width: int) -> bool:
    """Whether rows of `width` weights are whole Q8_0 blocks."""
    return width % BLOCK == 0


def q8_0_from_blocks(t: BlockTensor) -> BlockTensor:
    """`t` (Q8_0 or Q5_0) as Q8_0 blocks with the same weights, bit for bit."""
    if t.qtype == Q8_0:
        return t
    if t.qtype != Q5_0:
        raise UnsupportedError(f"{t.name}: {t.type_name} has no exact Q8_0 form")
    n, k = t.shape
    b = np.asarray(t.rows).reshape(n, k // BLOCK, Q5_0_BYTES)
    high = b[..., 2:6].copy().view(np.uint32)  # [n, blocks, 1]: bit j is element j's bit 4
    bits = (high >> np.arange(BLOCK, dtype=np.uint32)) & 1  # [n, blocks, 32]
    qs = b[..., 6:]
    low = np.concatenate([qs & 15, qs >> 4], axis=-1)  # elements 0..15 low, 16..31 high
    q = (low | (bits.astype(np.uint8) << 4)).astype(np.int16) - 16
    out = np.empty((n, k // BLOCK, Q8_0_BYTES), dtype=np.uint8)
    out[..., :2] = b[..., :2]
    out[..., 2:] = q.astype(np.int8).view(np.uint8)
    return BlockTensor(t.name, Q8_0, t.shape, out.reshape(n, -1))

