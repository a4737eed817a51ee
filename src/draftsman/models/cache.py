"""Preallocated, position-indexed KV cache.

Slots 0..length-1 hold the keys and values of the committed sequence (slot i holds the
token at position i for a linear sequence; a tree verify writes its nodes after `length`
and `keep` compacts the accepted path back into place). Rolling back is moving `length`:
stale slots past it are never read, because every forward attends to slots < start + T
only, and are overwritten by the next write.

Invariant: only this class changes cache state; models write through `write`, strategies
roll back through `truncate` and `keep`.
"""

from __future__ import annotations

import torch

from draftsman.errors import ContextOverflowError


class KVCache:
    """keep() moves a tree path's entries next to the prefix: later forwards are then
    identical to those after a linear decode of the same tokens (exact_tree_keep)."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, batch, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H_kv, S, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    @classmethod
    def from_buffers(cls, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        """An empty cache over existing k, v [L, B, H_kv, S, D] buffers (whatever they hold
        is stale: slots at and past `length` are never read)."""
        cache = cls.__new__(cls)
        cache.k, cache.v = k, v
        cache.capacity = k.shape[3]
        cache.length = 0
        return cache

    def check_room(self, end: int) -> None:
        if end > self.capacity:
            raise ContextOverflowError(
                f"sequence of {end} tokens does not fit the KV cache of {self.capacity} slots"
            )

    def write(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, H_kv, T, D] at slots start..start+T; return views of slots 0..start+T."""
        end = start + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def write_rotated_and_attend(self, layer: int, start: int, qkv: torch.Tensor,
                                 cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None,
                                 n_heads: int, n_kv: int) -> torch.Tensor:
        """One fused CPU call (kernels/attention_ops.cpp): q and k of qkv [B, T, (Hq + 2 Hkv) D]
        rotated by cos/sin [B, T, 1, D] (as `apply_rotary` rounds), k and v stored at slots
        start..start+T like `write`, then the new rows attend over slots < start + T
        (`bias` additive float32 [B or 1, 1, T, start + T], None: all visible) -> [B, T, Hq D]."""
        d = self.k.shape[-1]
        return torch.ops.draftsman.rope_attention(qkv, cos, sin, self.k[layer], self.v[layer],
                                                  start, bias, d ** -0.5, n_heads, n_kv)

    def set_length(self, length: int) -> None:
        self.check_room(length)
        self.length = length

    def truncate(self, length: int) -> None:
        """Forget every slot from `length` on. O(1): nothing is moved or cleared."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self.length = length

    def keep(self, slots: torch.Tensor | list[int], start: int) -> None:
        """Compact `slots` (ascending slot indices >= start) to start..start+len(slots).

        Used after a tree verify: the accepted path's nodes move next to the committed
        prefix, in order, and everything after them is forgotten.
        """
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.k.device)
        n = int(slots.numel())
        if n:
            src = slots
            dst = torch.arange(start, start + n, device=self.k.device)
            if not torch.equal(src, dst):
                self.k[:, :, :, dst] = self.k[:, :, :, src]
                self.v[:, :, :, dst] = self.v[:, :, :, src]
        self.length = start + n

    def reset(self) -> None:
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
