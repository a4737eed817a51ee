"""Linears on 8-bit weights with one scale per output row, the same weights on three kernels
(weight_formats.int8_kernel picks): draftsman's records against activations in int8 per 256,
oneDNN's int8 GEMM against activations in int8 per row, PyTorch's weight-only int8 kernel
against float activations. Each is batch invariant: a row's output is the same alone or in
any batch.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsman.errors import UnsupportedError
from draftsman.kernels.block_types import I8_ROW as TYPE_I8_ROW
from draftsman.kernels.native import byte_records
from draftsman.kernels.tile_rows import tile_rows
from draftsman.models.weight_formats import activation_bits


def int8_rows(w: torch.Tensor, dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (q [N, K] int8 in -127..127, scale [N] in `dtype`)
    with w ~= q * scale[:, None] within half a step (q is rounded against the scale as
    stored). -128 is never used, so every int8 kernel's sign tricks hold."""
    top = torch.maximum(w.amax(dim=1), -w.amin(dim=1))  # max |w| without an |w| copy
    scale = (top.clamp_min(1e-12) / 127.0).to(dtype)
    step = scale.float()[:, None]
    q = torch.empty(w.shape, dtype=torch.int8)
    for i in range(0, w.shape[0], 1024):  # in slices: no full-size float temporaries (2x faster)
        q[i:i + 1024] = torch.round(w[i:i + 1024] / step[i:i + 1024]).clamp_(-127, 127)
    return q, scale


class Int8Matrix(nn.Module):
    """Symmetric int8 rows, one scale each, for `_weight_int8pack_mm` (float activations)."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        q, scale = int8_rows(w, dtype)
        self.register_buffer("weight_int8", q)
        self.register_buffer("scale", scale)
        self.out_features = w.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight_int8, self.scale)


class OneDnnInt8Matrix(nn.Module):
    """int8 rows (one scale each) times activations quantised to int8 per row, on oneDNN's
    int8 GEMM (`onednn::qlinear_pointwise`, VNNI or AMX where the CPU has them).

    y[m, n] = (sum_k xq[m, k] * wq[n, k]) * w_scale[n] * x_scale[m], xq = round(x / x_scale)
    with x_scale[m] = max_k |x[m, k]| / (2^(bits-1) - 1) (see weight_formats.activation_bits).
    The int32 sum is exact and x_scale depends on row m alone, so a row's output is the same
    alone or in any batch: oneDNN is handed scale 1.0 and a fixed zero point, and each row is
    scaled after the GEMM (one scale per tensor over the batch would break this).
    """

    def __init__(self, w: torch.Tensor, dtype: torch.dtype, bits: int | None = None) -> None:
        super().__init__()
        q, scale = int8_rows(w)
        self.bits = activation_bits() if bits is None else bits
        self.register_buffer("scale", scale)
        self.packed = torch.ops.onednn.qlinear_prepack(q, [1, q.shape[1]])  # opaque, [K, N]
        self.register_buffer("no_zero", torch.zeros(q.shape[0], dtype=torch.int64))
        self.out_features = w.shape[0]

    def __getstate__(self) -> dict:
        # The prepacked tensor is opaque to pickle (pipelined workers): send int8 rows. They
        # are kept on the module: a spawned process receives a tensor as a file descriptor
        # to its shared memory, which must outlive this call (a temporary's is closed before
        # the child starts: "bad value(s) in fds_to_keep").
        if getattr(self, "_rows", None) is None:
            self._rows = self.packed.to_dense().T.contiguous()
        state = self.__dict__.copy()
        state["packed"], state["_rows"] = self._rows, None
        return state

    def __setstate__(self, state: dict) -> None:
        state["packed"] = torch.ops.onednn.qlinear_prepack(state["packed"],
                                                           [1, state["packed"].shape[1]])
        super().__setstate__(state)

    @property
    def weight_int8(self) -> torch.Tensor:
        return self.packed.to_dense().T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = 2 ** (self.bits - 1) - 1
        xf = x.float()
        x_scale = xf.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / top
        xq = torch.round(xf / x_scale).add_(top + 1).to(torch.uint8)  # 1 .. 2 top + 1
        y = torch.ops.onednn.qlinear_pointwise(
            xq, 1.0, top + 1, self.packed, self.scale, self.no_zero, None, 1.0, 0,
            torch.float32, "none", [], "")
        return y.mul_(x_scale).to(x.dtype)


class Int8RecordsMatrix(nn.Module):
    """The same int8 rows and float32 scales as OneDnnInt8Matrix, repacked into records of 16
    rows for draftsman's kernel (`draftsman::int8_pack_records`, kernels/q8_records.h; AVX-512
    VNNI), against activations quantised to int8 per 256 (as the K-quant records):
    y[m, n] = sum over 256-blocks b of d_x[m, b] (sum_k xq[m, k] wq[n, k]) scale[n], each
    block's integer exact. One row streams the weights at memory speed, where oneDNN read
    ~12-20 GB/s on an Emerald Rapids core, and 16 rows cost ~1.5 rows; batch invariant."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        q, scale = int8_rows(w)
        self.register_buffer("packed", torch.ops.draftsman.int8_pack_records(q, scale))
        self.out_features = w.shape[0]

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if not byte_records():
            raise UnsupportedError("this process cannot run the int8 records (no AVX-512 VNNI)")

    def record_operands(self) -> tuple[torch.Tensor, int, int, int]:
        """(packed, qtype, n, tile_rows): `kquant_records_mm`'s operands after x; AMX tiles
        from tile_rows rows where this CPU has them (kernels/tile_rows.py), 0 none."""
        return self.packed, TYPE_I8_ROW, self.out_features, tile_rows(TYPE_I8_ROW)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.bfloat16):
            return self(x.float()).to(x.dtype)
        return torch.ops.draftsman.kquant_records_mm(x, *self.record_operands())
