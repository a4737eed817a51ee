"""A GGUF's blocks decoded into PyTorch tensors for the Linears in quant_linear.py: the exact
int4 form of Q4_0 / Q4_1 / Q4_K tensors (groups of 32, scale and zero per group), any type's
float32 weights, and a tensor's rows as stored."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from draftsman.errors import UnsupportedError
from draftsman.kernels.block_types import GGMLType
from draftsman.kernels.native import kquant_available
from draftsman.store.gguf_blocks import BlockTensor

GROUP = 32  # int4 group size: one Q4_0/Q4_1 block, one Q4_K sub-block
_Q4_0, _Q4_1, _Q4_K = GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K


@dataclass
class Int4Rows:
    """w[n, k] = (q[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32]; q uint8 in 0..15."""

    q: torch.Tensor  # [N, K] uint8
    scale: torch.Tensor  # [N, K / 32] float32
    zero: torch.Tensor  # [N, K / 32] float32

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The float32 weights this packing computes with scale and zero rounded to `dtype`."""
        s = self.scale.to(dtype).float().repeat_interleave(GROUP, dim=1)
        z = self.zero.to(dtype).float().repeat_interleave(GROUP, dim=1)
        return (self.q.float() - 8) * s + z


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float32 (little-endian fp16)."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def decode_int4(t: BlockTensor) -> Int4Rows:
    """The exact int4 form of a Q4_0 / Q4_1 / Q4_K tensor (see the module docstring)."""
    n, k = t.shape
    raw = torch.from_numpy(np.array(t.rows))  # a writable copy of the memory-mapped rows
    if t.qtype in (_Q4_0, _Q4_1):
        b = raw.reshape(n, k // 32, -1)
        d = _f16(b[..., 0:2])
        head = 2 if t.qtype == _Q4_0 else 4
        qs = b[..., head:]  # 16 bytes: elements 0..15 in low nibbles, 16..31 in high
        q = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(n, k)
        zero = torch.zeros_like(d) if t.qtype == _Q4_0 else 8 * d + _f16(b[..., 2:4])
        return Int4Rows(q, d, zero)
    if t.qtype == _Q4_K:
        b = raw.reshape(n, k // 256, 144)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sb = b[..., 4:16].reshape(n, -1, 3, 4).int()
        lo, hi, mix = sb[..., 0, :], sb[..., 1, :], sb[..., 2, :]
        sc = torch.cat([lo & 63, (mix & 15) | ((lo >> 2) & 48)], dim=-1)  # 8 six-bit scales
        mn = torch.cat([hi & 63, (mix >> 4) | ((hi >> 2) & 48)], dim=-1)  # 8 six-bit mins
        qs = b[..., 16:].reshape(n, -1, 4, 1, 32)  # run j: sub-block 2j low, 2j+1 high
        q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(n, k)
        scale = (d[..., None] * sc).reshape(n, -1)
        zero = (8 * scale - (dmin[..., None] * mn).reshape(n, -1))
        return Int4Rows(q, scale, zero)
    raise UnsupportedError(f"{t.name}: {t.type_name} has no exact int4 form")


# GGML types kernels/gguf_convert.cpp decodes (bit-identical to gguf-py, ~20x faster)
NATIVE_DECODE = frozenset(GGMLType)


def dequantize_rows(t: BlockTensor) -> torch.Tensor:
    """[N, K] float32 weights of any type gguf can dequantise; UnsupportedError otherwise."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    if t.qtype in NATIVE_DECODE and kquant_available():
        rows = t.rows if t.rows.flags.writeable else np.array(t.rows)  # torch wants writable
        return torch.ops.draftsman.dequantize_blocks(
            torch.from_numpy(np.ascontiguousarray(rows)), t.qtype, t.shape[1])
    try:
        qtype = GGMLQuantizationType(t.qtype)
        if qtype == GGMLQuantizationType.F32:
            w = t.rows.view(np.float32)
        elif qtype == GGMLQuantizationType.F16:
            w = t.rows.view(np.float16).astype(np.float32)
        else:
            w = dequantize(t.rows, qtype)
    except (ValueError, NotImplementedError):
        raise UnsupportedError(
            f"tensor {t.name}: GGUF type {t.type_name} cannot be loaded as q4/q8 here") from None
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(t.shape)


def block_rows(blocks: list[BlockTensor]) -> torch.Tensor:
    """The blocks' rows stacked as one uint8 [N, bytes] tensor."""
    if len(blocks) == 1 and blocks[0].rows.flags.writeable:
        rows = np.ascontiguousarray(blocks[0].rows)  # the reader's fresh array: no copy
    else:
        rows = np.concatenate([np.asarray(b.rows) for b in blocks])
    return torch.from_numpy(rows)
