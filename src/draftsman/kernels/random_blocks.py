"""Random valid GGML blocks: weights of a real matrix's shape and block type whose values do
not matter, for timing the kernels (a quantised product's cost depends on the shapes and
block types, never on the values)."""

from __future__ import annotations

import numpy as np

from draftsman.kernels.block_types import GGMLType as G

# GGML type: (weights per block, bytes per block, offsets of its fp16 scales)
LAYOUTS = {G.Q4_0: (32, 18, (0,)), G.Q4_1: (32, 20, (0, 2)), G.Q5_0: (32, 22, (0,)),
           G.Q5_1: (32, 24, (0, 2)), G.Q8_0: (32, 34, (0,)), G.Q4_K: (256, 144, (0, 2)),
           G.Q5_K: (256, 176, (0, 2)), G.Q6_K: (256, 210, (208,))}
FLOATS = {0: np.float32, 1: np.float16}


def random_block_rows(qtype: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """[n, bytes per row] of valid random blocks of `qtype`: random bytes, then fp16 scales
    small enough that activations stay finite through a random model's layers."""
    if qtype in FLOATS:
        w = (rng.standard_normal((n, k), dtype=np.float32) * 0.02).astype(FLOATS[qtype])
        return w.view(np.uint8).reshape(n, -1)
    if qtype not in LAYOUTS:
        raise ValueError(f"no random blocks for GGML type {qtype}")
    width, size, scales = LAYOUTS[qtype]
    rows = rng.integers(0, 256, (n, k // width, size), dtype=np.uint8)
    for at in scales:
        high = 2e-5 if qtype == G.Q6_K else 1.5e-4 if at == 0 else 2e-3
        rows[..., at:at + 2] = (rng.uniform(0.5, 1, (n, k // width, 1)) * high).astype(
            np.float16).view(np.uint8)
    return rows.reshape(n, -1)
