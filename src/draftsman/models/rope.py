"""Rotary position embeddings with the scaling variants the Llama family uses.

Half-split ("NeoX") layout as in Hugging Face checkpoints: dimension i pairs with i + D/2.
"""

from __future__ import annotations

import math

import torch

from draftsman.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Per-pair frequencies [D/2] and the attention scale applied to cos/sin (YaRN)."""
    dim = config.head_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "default":
        return inv_freq.float(), 1.0
    if kind == "linear":
        return (inv_freq / factor).float(), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling, factor).float(), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, scaling, factor, config)
    raise ValueError(f"unsupported rope scaling {kind!r}")


def _llama3(inv_freq: torch.Tensor, scaling: dict, factor: float) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between blended.
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, blended, scaled)


def _yarn(
    inv_freq: torch.Tensor, scaling: dict, factor: float, config: ModelConfig
) -> tuple[torch.Tensor, float]:
    dim = config.head_dim
    base = config.rope_theta
    old_ctx = float(scaling.get("original_max_position_embeddings", config.max_position_embeddings))
    beta_fast = float(scaling.get("beta_fast", 32.0))
    beta_slow = float(scaling.get("beta_slow", 1.0))
    mscale = scaling.get("attention_factor")
    if mscale is None:
        mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1 keeps the original frequency, 0 interpolates
    mixed = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return mixed.float(), float(mscale)


class RotaryTable:
    """cos/sin for every position up to `max_positions`, computed once in float32.

    `sin` has its first half negated: `apply_rotary` then rotates with one flip instead of
    a slice, a negation and a concatenation (the same bits: (-a) * b == a * (-b))."""

    def __init__(self, config: ModelConfig, max_positions: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        """Computed on the CPU whatever `device`, so every device reads the same table."""
        inv_freq, scale = inverse_frequencies(config)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [P, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, D]
        sign = torch.cat([-torch.ones_like(inv_freq), torch.ones_like(inv_freq)])
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * scale * sign).to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, T, 1, D] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x [B, T, H, D], cos/sin from `RotaryTable.lookup`: rotate each (i, i + D/2) pair by
    its position's angle."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)  # (x2, x1), a fresh tensor
    return (x * cos).add_(swapped.mul_(sin))
