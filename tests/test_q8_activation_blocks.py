"""The int8 activation blocks every quantised product multiplies against (kquant_blocks.h).

Each row of x is cut into blocks of 256 (zero-padded past K) and each block quantised on its
own: d = max|x| / 127, q = round-half-even(x * (127 / max|x|)), then the sums the paths read
(of 16 and of 32 q, and the offsets made from them). Held here byte for byte to that rule
written out in numpy, and bf16 activations to the same values given as float32: the two
dtypes take different SIMD code (bf16 is taken apart into even and odd elements), and must
give the same bytes, subnormal blocks included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftsman.kernels.native import kquant_available

pytestmark = pytest.mark.skipif(not kquant_available(), reason="no C++ compiler here")

QK = 256
# field offsets within a block's bytes (the Q8Block struct, padding left out)
Q, D, BSUMS, PSUMS, Q6_OFFSETS, Q8_OFFSETS, I8_OFFSETS, END = 0, 256, 260, 292, 308, 372, 404, 412


def blocks(x: torch.Tensor, nb: int) -> np.ndarray:
    from draftsman.kernels import native

    native._load()
    return torch.ops.draftsman.q8_activation_blocks(x, nb).numpy()


def rule(x: torch.Tensor, nb: int) -> np.ndarray:
    """The blocks' bytes by the documented rule, in numpy (normal magnitudes: no overflow)."""
    xf = np.zeros((x.shape[0], nb * QK), np.float32)
    xf[:, : x.shape[1]] = x.float().numpy()
    b = xf.reshape(x.shape[0], nb, QK)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint((b * inv).astype(np.float32)).astype(np.int32)
    sums16 = q.reshape(*q.shape[:2], 16, 16).sum(-1)
    sums32 = sums16.reshape(*q.shape[:2], 8, 2).sum(-1)
    offsets = -128 * sums32
    by_parity = np.stack([offsets[..., 0::2].sum(-1), offsets[..., 1::2].sum(-1)], -1)
    out = np.zeros((*q.shape[:2], END), np.uint8)
    fields = [
        (Q, q.astype(np.int8)),
        (D, (amax / np.float32(127)).astype(np.float32)),
        (BSUMS, sums16.astype(np.int16)),
        (PSUMS, sums32.astype(np.int16)),
        (Q6_OFFSETS, (-32 * sums16).astype(np.int32)),
        (Q8_OFFSETS, offsets.astype(np.int32)),
        (I8_OFFSETS, by_parity.astype(np.int32)),
    ]
    for at, values in fields:
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(*q.shape[:2], -1)
        out[..., at: at + raw.shape[-1]] = raw
    return out


def awkward_rows(k: int, dtype: torch.dtype, subnormal: bool = False) -> torch.Tensor:
    """Rows of mixed magnitudes: a zero block, a block of few distinct values, a huge one,
    and (`subnormal`) a block of subnormals, whose 127 / max|x| overflows."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(5, k, generator=g) * torch.logspace(-3, 3, 5)[:, None]
    x[1, :QK] = 0
    x[2, : min(k, QK)] = torch.arange(min(k, QK)) % 7 * 0.5 - 1.5  # steps of a half
    x[3, -1] = 3e4
    if subnormal:
        x[4, : min(k, QK)] = torch.randn(min(k, QK), generator=g) * 1e-39
    return x.to(dtype)


@pytest.mark.parametrize("k", [64, 256, 896, 1000, 1536, 4864])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_follow_the_rule_byte_for_byte(k, dtype):
    x = awkward_rows(k, dtype)
    nb = -(-k // QK)
    got, want = blocks(x, nb), rule(x, nb)
    assert got.shape == want.shape
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]


@pytest.mark.parametrize("k", [256, 896, 4864])
def test_bf16_rows_give_the_bytes_of_their_float32_values(k):
    x = awkward_rows(k, torch.bfloat16, subnormal=True)
    nb = -(-k // QK)
    assert np.array_equal(blocks(x, nb), blocks(x.float(), nb))


def test_a_corrupted_rule_is_told_apart():
    """Negative control: the comparison sees one q off by one in one block."""
    x = awkward_rows(896, torch.bfloat16)
    want = rule(x, 4)
    want[3, 2, Q + 17] ^= 1
    assert not np.array_equal(blocks(x, 4), want)


def test_bad_input_is_one_line():
    with pytest.raises(RuntimeError, match="nb blocks of 256 must cover K"):
        blocks(torch.randn(2, 600), 2)
