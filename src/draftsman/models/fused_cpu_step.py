"""A Llama-family step's layers on the fused CPU ops, called straight from a flat plan.

On the fused CPU path (`DecoderLM.use_fused_cpu_ops`) a decoder block is eight kernel calls:
the QKV product, RoPE + cache write + attention, the output product, a residual add with the
RMSNorm after it, the gate/up product, silu * up, the down product, a residual add with the
next block's RMSNorm (the first block's norm and the last add alone). Where the gate/up
product runs on AVX-512 VNNI records, silu * up is done in the same call (seven calls, the
same bits: `QuantLinear.swiglu_product`). Through the module
tree each also pays `nn.Module.__call__`, attribute lookups and the reshapes that make any
input shape work: on the 0.5B's one-row draft step (24 layers, ~20 ms) that bookkeeping was
~3 ms, as long as all its attention. `FusedCpuStep` takes each block's weights out of the tree
once and runs the same calls, in the same order on the same tensors, on the rows [B T, H]:
the same bits as the modules (tests/test_fused_cpu_step.py), a fraction of the Python.

Where every product is records-kernel calls (QuantLinear.record_parts) and the cache is a
plain KVCache, the whole loop runs in one call instead (`draftsman::decoder_layers`,
kernels/decoder_layers.cpp: the same ops in the same order through the dispatcher, the same
bits; DRAFTSMAN_LAYERS_CALL=0 keeps it in Python): on the 0.5B's one-row step the main
thread had spent ~1 ms a forward in Python frames and dispatch while the other thread waited.

Invariant: a plan holds the modules it was built from; `matches` says whether the model still
has exactly those (a replaced Linear or norm makes the model build a new plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest

import torch
from torch import nn

from draftsman.kernels.native import layers_in_one_call
from draftsman.models.cache import KVCache

Rows = Callable[[torch.Tensor], torch.Tensor]
NO_BIAS = torch.empty(0)  # decoder_layers' "no bias"


def rows_product(linear: nn.Module, dtype: torch.dtype) -> Rows:
    """x [M, K] contiguous in `dtype` -> linear(x) [M, N], the module's own product without
    its shape handling: a QuantLinear's direct kernel call where it has one."""
    direct = getattr(linear, "rows_product", None)
    return (direct(dtype) if direct is not None else None) or linear.forward


def swiglu_product(gate_up: nn.Module, dtype: torch.dtype) -> Rows:
    """x [M, K] contiguous in `dtype` -> silu(gate) * up [M, N / 2] of a fused gate/up
    projection: one kernel call where the module has one (QuantLinear.swiglu_product), else
    its product and then silu_mul; the same bits either way."""
    fused = getattr(gate_up, "swiglu_product", None)
    direct = fused(dtype) if fused is not None else None
    if direct is not None:
        return direct
    product, silu_mul = rows_product(gate_up, dtype), torch.ops.draftsman.silu_mul
    return lambda x: silu_mul(product(x))


@dataclass(frozen=True)
class BlockOps:
    """One decoder block as the fused ops take it (llama.Block's pre-norm residual form)."""

    norm1: torch.Tensor
    eps1: float
    qkv: Rows
    o: Rows
    norm2: torch.Tensor
    eps2: float
    gate_up: Rows  # silu(gate) * up: swiglu_product
    down: Rows
    n_heads: int
    n_kv: int


@dataclass(frozen=True)
class FlatLayers:
    """Every block's operands for `draftsman::decoder_layers`, flat, in the layout its file
    states; `starts`: where each layer's tensors and ints begin."""

    tensors: list[torch.Tensor]
    ints: list[int]
    floats: list[float]
    starts: list[int]


def flat_layers(blocks: nn.ModuleList, dtype: torch.dtype) -> FlatLayers | None:
    """The blocks' operands for one decoder_layers call, or None where some product is not
    records-kernel calls in `dtype` (then the loop stays in Python)."""
    if not layers_in_one_call():
        return None
    flat = FlatLayers([], [], [], [])
    for block in blocks:
        a, m = block.self_attn, block.mlp
        flat.starts.extend([len(flat.tensors), len(flat.ints)])
        flat.tensors.extend([block.input_layernorm.weight, block.post_attention_layernorm.weight])
        flat.ints.extend([a.n_heads, a.n_kv])
        flat.floats.extend([block.input_layernorm.eps, block.post_attention_layernorm.eps])
        for linear in (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj):
            parts = getattr(linear, "record_parts", lambda _: None)(dtype)
            if parts is None:
                return None
            # as swiglu_product calls it: one SwiGLU call where the module has it
            fused = linear is m.gate_up_proj and linear.swiglu_product(dtype) is not None
            flat.ints.extend([int(fused), len(parts)])
            for packed, qtype, n, tile_rows in parts:
                flat.tensors.append(packed)
                flat.ints.extend([qtype, n, tile_rows])
            flat.tensors.append(NO_BIAS if linear.bias is None else linear.bias)
    return flat


class FusedCpuStep:
    """The blocks of a Llama-family model (llama.Block: input_layernorm, self_attn with a
    fused qkv_proj and no Q/K norm, post_attention_layernorm, SwiGLU mlp) as BlockOps."""

    def __init__(self, blocks: nn.ModuleList, dtype: torch.dtype) -> None:
        self.sources = [self._parts(b) for b in blocks]
        self.blocks = [self._ops(b, dtype) for b in blocks]
        self.dtype = dtype
        self.flat = flat_layers(blocks, dtype)

    @staticmethod
    def _parts(block: nn.Module) -> tuple[object, ...]:
        # read from the modules' own dicts: `matches` runs every forward, where nn.Module's
        # attribute lookups took ~230 us a step on the 0.5B's 24 blocks
        mods = block._modules
        attn, mlp = mods["self_attn"]._modules, mods["mlp"]._modules
        return (mods["input_layernorm"]._parameters["weight"], attn["qkv_proj"], attn["o_proj"],
                mods["post_attention_layernorm"]._parameters["weight"], mlp["gate_up_proj"],
                mlp["down_proj"])

    @staticmethod
    def _ops(block: nn.Module, dtype: torch.dtype) -> BlockOps:
        a, m = block.self_attn, block.mlp
        return BlockOps(
            norm1=block.input_layernorm.weight, eps1=block.input_layernorm.eps,
            qkv=rows_product(a.qkv_proj, dtype), o=rows_product(a.o_proj, dtype),
            norm2=block.post_attention_layernorm.weight, eps2=block.post_attention_layernorm.eps,
            gate_up=swiglu_product(m.gate_up_proj, dtype), down=rows_product(m.down_proj, dtype),
            n_heads=a.n_heads, n_kv=a.n_kv)

    def matches(self, blocks: nn.ModuleList) -> bool:
        """Whether `blocks` still hold the very weights and products this plan was built on
        (a model's `_apply`, as `.to()` runs it, drops its plan: buffers replaced in place)."""
        return len(blocks) == len(self.sources) and all(
            all(x is y for x, y in zip(self._parts(b), s, strict=True))
            for b, s in zip(blocks._modules.values(), self.sources, strict=True))

    def run(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache,
            layers: range, start: int, bias: torch.Tensor | None) -> torch.Tensor:
        """x [B, T, H] through `layers`, as llama.Block's fused path computes it: the new rows'
        k and v written at slots start..start+T, `bias` the additive attention mask."""
        b, t, hidden = x.shape
        cos, sin = rope
        rows = x.reshape(b * t, hidden).contiguous()
        ops = torch.ops.draftsman
        norm, add_norm = ops.rms_norm, ops.add_rms_norm
        if not layers:
            return x
        if (self.flat is not None and layers.step == 1 and type(cache) is KVCache
                and rows.dtype == self.dtype):
            # write_rotated_and_attend's own call and scale, for every layer at once
            flat = self.flat
            out = ops.decoder_layers(rows, flat.tensors, flat.ints, flat.floats, flat.starts,
                                     layers.start, layers.stop, cos, sin, cache.k, cache.v,
                                     start, bias, cache.k.shape[-1] ** -0.5, b)
            return out.view(b, t, hidden)
        first = self.blocks[layers[0]]
        normed = norm(rows, first.norm1, first.eps1)
        # each layer with the one after it (None past the last): a range's slice, no list
        for i, after in zip_longest(layers, layers[1:]):
            op = self.blocks[i]
            qkv = op.qkv(normed)
            att = cache.write_rotated_and_attend(i, start, qkv.view(b, t, -1), cos, sin, bias,
                                                 op.n_heads, op.n_kv)
            # each residual add with the norm after it, one call (the same bits as the two)
            rows, normed = add_norm(rows, op.o(att.view(b * t, -1)), op.norm2, op.eps2)
            mlp = op.down(op.gate_up(normed))
            if after is None:
                rows = rows + mlp
            else:
                nxt = self.blocks[after]
                rows, normed = add_norm(rows, mlp, nxt.norm1, nxt.eps1)
        return rows.view(b, t, hidden)
