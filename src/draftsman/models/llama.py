"""Llama-family decoder: Llama 2/3, Mistral, SmolLM/SmolLM2, Qwen2/2.5 (QKV bias), Qwen3 (Q/K norm).

Pre-norm blocks: x += attn(rmsnorm(x)); x += swiglu(rmsnorm(x)). Grouped-query attention
with RoPE. Q/K/V and gate/up projections are fused into one matrix each at load time (one
weight read per block half instead of three / two).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftsman.models.base import (
    DecoderLM,
    Linear,
    additive_mask,
    attention_rows,
    cached_attention,
    causal_attention_in_blocks,
    runs_causal_in_blocks,
    uses_matmul_attention,
)
from draftsman.models.cache import KVCache
from draftsman.models.config import ModelConfig
from draftsman.models.fused_cpu_step import FusedCpuStep, swiglu_product
from draftsman.models.ragged import RaggedCaches
from draftsman.models.rope import RotaryTable, apply_rotary

# Our fused projections and the Hugging Face matrices they stack, in row order.
FUSED_LINEARS: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


class RMSNorm(nn.Module):
    fused_cpu_ops = False  # see DecoderLM.use_fused_cpu_ops

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_cpu_ops and x.is_cpu:  # the same roundings, one call
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            return torch.ops.draftsman.rms_norm(rows, self.weight, self.eps).view(x.shape)
        # normalise in float32, scale in the model dtype (as the reference implementations
        # do); F.rms_norm is the same arithmetic as the spelled-out float32 ops, in one call
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    fused_cpu_ops = False  # see DecoderLM.use_fused_cpu_ops

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.qkv_proj = Linear(c.hidden_size, q_dim + 2 * kv_dim, bias=c.attention_bias)
        self.o_proj = Linear(q_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None

    def forward(self, x, rope, cache: KVCache | RaggedCaches, layer: int, start: int,
                mask) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if isinstance(cache, RaggedCaches):  # several sequences: `mask` holds one per segment
            return self.o_proj(cache.attend_each(
                qkv, rope, mask, lambda part, r, c, s, m: self.attend(part, r, c, layer, s, m)))
        return self.o_proj(self.attend(qkv, rope, cache, layer, start, mask))

    def attend(self, qkv: torch.Tensor, rope, cache: KVCache, layer: int, start: int,
               mask) -> torch.Tensor:
        """qkv [B, T, (Hq + 2 Hkv) D] of the new rows -> attention output [B, T, Hq D]."""
        b, t, _ = qkv.shape
        nq, nkv, d = self.n_heads, self.n_kv, self.head_dim
        cos, sin = rope
        # one call for RoPE, the cache write and attention, on a KVCache's contiguous slots
        # (a static step's SlotWriter takes the path below); the mask is additive there
        if (self.fused_cpu_ops and self.q_norm is None and cos.shape[0] == b
                and isinstance(cache, KVCache)):
            if uses_matmul_attention(t, qkv.device, attention_rows(True, qkv.dtype)):
                bias = mask
                if mask is not None and mask.dtype == torch.bool:
                    bias = additive_mask(mask)
                return cache.write_rotated_and_attend(layer, start, qkv.contiguous(), cos, sin,
                                                      bias, nq, nkv)
            if runs_causal_in_blocks(mask, start, t, qkv.dtype, qkv.device):
                return causal_attention_in_blocks(cache, layer, start, qkv.contiguous(), cos,
                                                  sin, nq, nkv)
        if self.q_norm is None:  # q and k heads side by side: one rotation for both
            qk = apply_rotary(qkv[..., : (nq + nkv) * d].view(b, t, nq + nkv, d), cos, sin)
            q, k = qk.split((nq, nkv), dim=2)
        else:
            q = self.q_norm(qkv[..., : nq * d].view(b, t, nq, d))
            k = self.k_norm(qkv[..., nq * d : (nq + nkv) * d].view(b, t, nkv, d))
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        v = qkv[..., (nq + nkv) * d :].view(b, t, nkv, d)
        return cached_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                cache, layer, start, mask,
                                fused=self.fused_cpu_ops)  # [B, H, T, D] views


class SwiGLU(nn.Module):
    fused_cpu_ops = False  # see DecoderLM.use_fused_cpu_ops

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_cpu_ops and x.is_cpu:  # silu(gate) * up as the fused steps take it
            act = swiglu_product(self.gate_up_proj, x.dtype)(
                x.reshape(-1, x.shape[-1]).contiguous())
            return self.down_proj(act.view(*x.shape[:-1], act.shape[-1]))
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class Block(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = SwiGLU(c)

    def forward(self, x, rope, cache, layer, start, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, layer, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(DecoderLM):
    def __init__(self, config: ModelConfig, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._max_positions = max_positions or config.max_position_embeddings
        self._rope: RotaryTable | None = None

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)

    def fused_step(self, x: torch.Tensor, context: object, cache: KVCache,
                   rows: int) -> FusedCpuStep | None:
        """Where every block would take its fused CPU path (Attention.attend's condition),
        the flat plan of them, built once and again whenever a block's weights change."""
        cos, _ = context
        # x in another dtype: the tree's products convert it first, the plan's direct calls
        # would not
        if not (self.fused_cpu_ops and x.is_cpu and x.dtype == self.dtype
                and not self.config.qk_norm and isinstance(cache, KVCache)
                and cos.shape[0] == x.shape[0]
                and uses_matmul_attention(rows, x.device, self.attention_rows())):
            return None
        if self._fused_cpu_step is None or not self._fused_cpu_step.matches(self.layers):
            self._fused_cpu_step = FusedCpuStep(self.layers, self.dtype)
        return self._fused_cpu_step

    def layer_context(self, positions: torch.Tensor):
        if (self._rope is None or self._rope.cos.dtype != self.dtype
                or self._rope.cos.device != self.device):
            self._rope = RotaryTable(self.config, self._max_positions, self.dtype, self.device)
        return self._rope.lookup(positions)

    @staticmethod
    def convert_hf_state(state: dict[str, torch.Tensor], config: ModelConfig) -> dict:
        """Hugging Face names -> ours: drop the `model.` prefix, fuse qkv and gate/up."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            key = name.removeprefix("model.")
            if "rotary_emb" in key:
                continue
            out[key] = tensor
        for i in range(config.num_layers):
            p = f"layers.{i}."
            for fused, names in FUSED_LINEARS.items():
                for kind in ("weight", "bias"):
                    parts = [out.pop(f"{p}{n}.{kind}", None) for n in names]
                    if all(t is not None for t in parts):
                        out[f"{p}{fused}.{kind}"] = torch.cat(parts, dim=0)
        if config.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out
