"""Optional weight-only int8: per-output-channel symmetric scales, bf16 activations.

Decoding reads every weight once per forward, so halving the bytes read halves the floor on
latency; PyTorch's int8-weight matmul kernel also keeps its cost nearly flat for the 2-16
token batches that verification runs, where bf16 matmuls on CPUs without AVX-512 BF16 grow
linearly. Quantisation changes the model: compare int8 runs with int8 runs.
"""

from __future__ import annotations

import torch
from torch import nn


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # [out, in]
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def weight(self) -> torch.Tensor:
        """Dequantised view, for code that inspects weights (dtype/device probes)."""
        return self.scale[:, None] * self.weight_int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16),
                                      self.weight_int8, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear (LM head included) by an Int8Linear, in place."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize_int8(child)
    return model
