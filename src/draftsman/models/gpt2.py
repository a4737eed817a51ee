"""GPT-2 decoder (gpt2, distilgpt2, gpt2-medium, gpt2-large).

Pre-norm blocks with LayerNorm, learned absolute positions, fused QKV, GELU (tanh) MLP,
LM head tied to the token embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftsman.models.base import DecoderLM, Linear, cached_attention
from draftsman.models.cache import KVCache
from draftsman.models.config import ModelConfig
from draftsman.models.ragged import RaggedCaches


class Attention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = c.num_heads, c.head_dim
        self.c_attn = Linear(c.hidden_size, 3 * c.hidden_size)
        self.c_proj = Linear(c.hidden_size, c.hidden_size)

    def forward(self, x, cache: KVCache | RaggedCaches, layer: int, start: int,
                mask) -> torch.Tensor:
        qkv = self.c_attn(x)
        if isinstance(cache, RaggedCaches):  # several sequences: `mask` holds one per segment
            return self.c_proj(cache.attend_each(
                qkv, None, mask, lambda part, _, c, s, m: self.attend(part, c, layer, s, m)))
        return self.c_proj(self.attend(qkv, cache, layer, start, mask))

    def attend(self, qkv: torch.Tensor, cache: KVCache, layer: int, start: int,
               mask) -> torch.Tensor:
        """qkv [B, T, 3 H] of the new rows -> attention output [B, T, H]."""
        b, t, h3 = qkv.shape
        q, k, v = qkv.split(h3 // 3, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        return cached_attention(q, k, v, cache, layer, start, mask)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c_fc = Linear(c.hidden_size, c.intermediate_size)
        self.c_proj = Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, ctx, cache, layer, start, mask) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer, start, mask)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(DecoderLM):
    def __init__(self, config: ModelConfig, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.wte(tokens) + self.wpe(positions)

    @staticmethod
    def convert_hf_state(state: dict[str, torch.Tensor], config: ModelConfig) -> dict:
        """HF GPT-2 uses Conv1D ([in, out] weights): transpose to Linear's [out, in]."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            key = name.removeprefix("transformer.")
            if key.endswith(".attn.bias") or key.endswith(".attn.masked_bias"):
                continue  # causal-mask buffers in old checkpoints
            if key == "lm_head.weight":
                continue  # tied to wte
            key = key.replace("h.", "layers.", 1) if key.startswith("h.") else key
            key = "norm." + key.removeprefix("ln_f.") if key.startswith("ln_f.") else key
            if key.endswith(".weight") and any(
                f".{m}." in key for m in ("c_attn", "c_proj", "c_fc")
            ):
                tensor = tensor.t().contiguous()
            out[key] = tensor
        return out
