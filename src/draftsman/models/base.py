"""The forward contract every model implements, and the pieces both families share.

`forward(tokens, positions, cache, *, mask, layers, inputs_embeds, hidden_from, logits_at,
start) -> Output` is a pure function of its inputs and the cache slots before `start`; it
writes keys/values for the new tokens at slots start..start+T of the layers it runs and sets
`cache.length = start + T`. It never samples.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from draftsman.errors import UnsupportedError
from draftsman.kernels.greedy import greedy_tokens
from draftsman.kernels.native import (
    attention_amx,
    attention_bf16_pairs,
    kquant_available,
    unavailable_reason,
)
from draftsman.models.cache import KVCache
from draftsman.models.config import ModelConfig
from draftsman.models.protocol import Capabilities
from draftsman.models.ragged import RaggedCaches

if TYPE_CHECKING:
    from draftsman.models.fused_cpu_step import FusedCpuStep

ALL = slice(None)
LAST = slice(-1, None)
CACHED_MASK_ROWS = 64  # verify/draft batches; a long prefill's mask is built once per request
MATMUL_ATTENTION_ROWS = 16  # up to this many new tokens, CPU attention skips SDPA (see below)
AMX_ATTENTION_ROWS = 64  # the same where the fused op runs on AMX-BF16 tiles (attention_rows)
CAUSAL_BLOCK_ROWS = 128  # new rows a fused call takes in a long causal run (blocks of 64-256 level)
CAUSAL_BLOCKS_MAX_SLOTS = 4096  # past this, SDPA: the blocks' biases are cached_causal_bias's

# Without AVX-512 BF16, PyTorch's CPU bf16 matmul has no native dot product and its cost grows
# linearly with the rows: a 128-token prefill costs 4x the same matmul done in float32 on
# upcast weights. Short batches (decode, verify) stay in bf16, where reading half the bytes wins.
UPCAST_MIN_ROWS = 32
_NATIVE_BF16 = "AVX512" in torch.backends.cpu.get_cpu_capability()


class Linear(nn.Linear):
    """nn.Linear; long bf16 batches on CPUs without native bf16 compute run in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype == torch.bfloat16 and not _NATIVE_BF16 and x.device.type == "cpu"
                and x.numel() >= UPCAST_MIN_ROWS * x.shape[-1]):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


@dataclass
class Output:
    logits: torch.Tensor | None  # [B, T', V] for the positions asked for (None: no head run)
    hidden: torch.Tensor  # [B, T, H] residual stream after the last layer run
    tokens: torch.Tensor | None = None  # [B, T'] greedy tokens instead of logits (greedy=True)


def attention_mask(
    start: int,
    length: int,
    mask: torch.Tensor | None,
    device: torch.device,
    positions: torch.Tensor | None = None,
    sliding_window: int | None = None,
    additive: bool = False,
) -> torch.Tensor | None:
    """Boolean mask [B or 1, 1, T, start + T] (True = may attend), or None when all may.

    `mask` may be the full [B, T, start + T] mask or only its new-token part [B, T, T] /
    [T, T], in which case every new token also sees the whole committed prefix (the tree
    case). Default: causal among the new tokens, the prefix visible to all. `additive`:
    the same mask as float32 0 / -inf (what `matmul_attention` adds to its scores).
    """
    if mask is not None:
        if mask.dim() == 2:
            mask = mask.unsqueeze(0)
        if mask.shape[-1] == length:  # tree part only: prepend the visible prefix
            prefix = torch.ones(mask.shape[0], length, start, dtype=torch.bool, device=device)
            mask = torch.cat([prefix, mask.to(device=device, dtype=torch.bool)], dim=-1)
        mask = mask.to(device=device, dtype=torch.bool).unsqueeze(1)
        return additive_mask(mask) if additive else mask
    if sliding_window is not None and positions is not None and start + length > sliding_window:
        # key slot j (= position j for a linear sequence) visible iff q - window < j <= q
        keys = torch.arange(start + length, device=device)
        q = positions[:, :, None]
        mask = ((keys <= q) & (keys > q - sliding_window)).unsqueeze(1)
        return additive_mask(mask) if additive else mask
    if length == 1:
        return None
    if length <= CACHED_MASK_ROWS:
        return (cached_causal_bias if additive else cached_causal_mask)(start, length, device)
    if not additive:
        return default_causal_mask(start, length, device)
    return additive_mask(causal_mask(start, length, device))


# The plain causal masks `attention_mask` built and still alive, by id: is_default_causal
# knows one by identity, however many a step holds (a ragged step's prompts)
_DEFAULT_CAUSAL: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def default_causal_mask(start: int, length: int, device: torch.device) -> torch.Tensor:
    """`causal_mask(start, length)`, remembered as plain causal while it lives."""
    mask = causal_mask(start, length, device)
    _DEFAULT_CAUSAL[id(mask)] = mask
    return mask


@lru_cache(maxsize=32)
def cached_causal_mask(start: int, length: int, device: torch.device) -> torch.Tensor:
    """`default_causal_mask` built once per shape and shared, so read-only."""
    return default_causal_mask(start, length, device)


@lru_cache(maxsize=32)
def cached_causal_bias(start: int, length: int, device: torch.device) -> torch.Tensor:
    """`cached_causal_mask` as an additive float mask, shared, so read-only."""
    return additive_mask(cached_causal_mask(start, length, device))


def is_default_causal(mask: torch.Tensor | None, start: int, t: int) -> bool:
    """Whether `mask` is the plain causal mask of T new rows after `start` cached slots that
    `attention_mask` built (not a tree's or a sliding window's), known by identity."""
    return (mask is not None and _DEFAULT_CAUSAL.get(id(mask)) is mask
            and tuple(mask.shape[-2:]) == (t, start + t))


def sdpa_is_causal(mask: torch.Tensor | None, start: int, t: int, device: torch.device) -> bool:
    """Whether SDPA may take `is_causal` for `mask`: the default causal mask from slot 0 (SDPA's
    causal mask is top-left aligned), on the CPU.

    Why: given the mask as a tensor, PyTorch's CPU flash attention scores every key block and
    adds -inf past the diagonal; with `is_causal` it skips those blocks (the 1.5B's 658-token
    prompt: 452 -> 351 ms of attention). The bits are the same: a skipped block would have
    added exp(-inf) = 0 to every sum and left every running maximum as it was. Not on CUDA,
    where `is_causal` picks another kernel."""
    return start == 0 and device.type == "cpu" and is_default_causal(mask, start, t)


def runs_causal_in_blocks(mask: torch.Tensor | None, start: int, t: int, dtype: torch.dtype,
                          device: torch.device) -> bool:
    """Whether a long causal run of new rows (a prompt's prefill, a chunk of one) attends on the
    fused CPU op in blocks (`causal_attention_in_blocks`) instead of SDPA: bf16 rows where the
    op scores them on AVX512-BF16 pairs or AMX-BF16 tiles (declared capabilities,
    `attention_bf16_pairs`, `attention_amx`), the default causal mask, at most
    CAUSAL_BLOCKS_MAX_SLOTS slots.

    Why: there the op beats PyTorch's flash kernel at every length measured; RoPE, the cache
    write and the 1.5B's attention of one layer on a Zen 5 EPYC, 2 threads: 300 / 658 / 1,500
    rows 0.8-1.8 / 2.9-4.5 / 13-16 ms in blocks of 128, against 3.3 / 12-14 / 44 for SDPA's
    causal attention alone; the 658-token prefill 1,749 -> 1,344 ms
    (bench-results/prefill-zen5-causal). Each block sees only the slots up to its end, which
    is what skips the masked ones. On an AMX Xeon, where PyTorch's flash kernel runs on tiles
    too, the two attend alike (1,500 rows: 327-330 ms against 333-339 over 28 layers) and the
    658-token prefill is 3-5% faster in blocks, whose call also rotates and stores the keys
    (bench-results/prefill-amx-slices)."""
    return (device.type == "cpu" and dtype == torch.bfloat16
            and start + t <= CAUSAL_BLOCKS_MAX_SLOTS
            and (attention_bf16_pairs() or attention_amx())
            and is_default_causal(mask, start, t))


def causal_attention_in_blocks(cache: KVCache, layer: int, start: int, qkv: torch.Tensor,
                               cos: torch.Tensor, sin: torch.Tensor, n_heads: int,
                               n_kv: int) -> torch.Tensor:
    """`KVCache.write_rotated_and_attend` over T causal rows after `start` in blocks of
    CAUSAL_BLOCK_ROWS: block [s0, s1) stores its keys and values at slots start + s0.. and
    attends over the slots before start + s1 with its causal bias -> [B, T, Hq D].
    Invariant: each row's bits are those of one call over all T rows with the whole causal
    bias (the op's rows are each their own; a masked slot adds exact zeros)."""
    t = qkv.shape[1]
    out = []
    for s0 in range(0, t, CAUSAL_BLOCK_ROWS):
        s1 = min(t, s0 + CAUSAL_BLOCK_ROWS)
        bias = cached_causal_bias(start + s0, s1 - s0, qkv.device)
        out.append(cache.write_rotated_and_attend(
            layer, start + s0, qkv[:, s0:s1].contiguous(), cos[:, s0:s1].contiguous(),
            sin[:, s0:s1].contiguous(), bias, n_heads, n_kv))
    return torch.cat(out, dim=1)


def causal_mask(start: int, length: int, device: torch.device) -> torch.Tensor:
    """[1, 1, T, start + T]: new token q sees slots 0..start+q."""
    keys = torch.arange(start + length, device=device)
    queries = torch.arange(start, start + length, device=device)
    return (keys[None, :] <= queries[:, None])[None, None]


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """Boolean mask -> float32 0 where True, -inf where False."""
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf"))


def attention_rows(fused: bool, dtype: torch.dtype) -> int:
    """Up to how many new rows CPU attention skips SDPA: MATMUL_ATTENTION_ROWS, or
    AMX_ATTENTION_ROWS where the fused op takes bf16 rows on AMX-BF16 tiles (a declared
    capability, native.attention_amx): there the 1.5B q4 forward of 17-48 rows was 5-15%
    cheaper than with SDPA (bench-results/profile-amx), while on vectors a long prefill
    chunk is cheaper on SDPA. Each row's result is its own either way (the op's tasks take
    16 rows, a row's padding the same whatever the others)."""
    if fused and dtype == torch.bfloat16 and attention_amx():
        return AMX_ATTENTION_ROWS
    return MATMUL_ATTENTION_ROWS


def uses_matmul_attention(rows: int, device: torch.device,
                          limit: int = MATMUL_ATTENTION_ROWS) -> bool:
    """Whether `cached_attention` over `rows` new tokens takes `matmul_attention`.

    On the CPU, SDPA's flash kernel costs 100-200 us per call whatever the work, and in bf16
    its one-row path grows 4-7x faster with the context than two float32 matmuls (per layer
    of a 1.5B model on a 2-core AVX2 EPYC, context 100 / 500 / 2000: 213 / 830 / 3330 us
    against 90 / 140 / 330 us). Up to MATMUL_ATTENTION_ROWS rows the matmuls win or tie;
    a long prefill keeps SDPA. On that model at q4 the matmul path also gave verify rows
    (T = 4, 16) the bits of one-token decodes, which SDPA did not (an argmax differed at
    T = 16); BLAS does not promise this for every shape.
    """
    return device.type == "cpu" and rows <= limit


def growing_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """Where a forward's key length changes from call to call (every dynamic forward: decode
    adds a slot each token), SDPA on CUDA without its cuDNN backend. cuDNN builds an execution
    plan per shape, which costs tens to hundreds of ms and is cached per key length, so each
    new token would pay one: on an H200 our eager AR took 77 ms a token in the benchmark, whose
    lengths are new, over 20-28 ms where the same lengths were met before (step_breakdown
    --loop, gpu-h200). Static steps attend over one fixed shape and keep cuDNN."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def matmul_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Grouped-query attention as two float32 matmuls per KV head -> [B, T, Hq * D].

    q [B, Hq, T, D]; keys/values [B, Hkv, S, D]; mask [B or 1, 1, T, S], additive float32
    (or boolean, converted here). Query head h reads KV head h // G: the G heads of one KV
    head are stacked as G*T rows of one matmul, so K and V are never repeated.
    """
    b, hq, t, d = q.shape
    hkv, s = keys.shape[1], keys.shape[2]
    g = hq // hkv
    qf = q.new_empty((b, hq, t, d), dtype=torch.float32).copy_(q).mul_(d ** -0.5)
    scores = torch.matmul(qf.view(b, hkv, g * t, d), keys.float().transpose(-1, -2))
    if mask is not None:
        bias = additive_mask(mask) if mask.dtype == torch.bool else mask
        scores.view(b, hkv, g, t, s).add_(bias.unsqueeze(2))
    out = torch.matmul(torch.softmax(scores, dim=-1), values.float())  # [B, Hkv, G*T, D]
    res = q.new_empty((b, t, hq, d)).copy_(out.view(b, hq, t, d).transpose(1, 2))
    return res.view(b, t, hq * d)


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    layer: int,
    start: int,
    mask: torch.Tensor | None,
    fused: bool = False,
) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, T, D] for the new tokens -> [B, T, Hq * D].

    `mask` as `attention_mask` builds it, additive where `uses_matmul_attention`; there,
    `fused` computes it in one call to draftsman's own CPU kernel (kernels/attention_ops.cpp,
    float32 within, each query row on its own) instead of ~15 PyTorch operators."""
    keys, values = cache.write(layer, start, k, v)  # [B, Hkv, start+T, D]
    if uses_matmul_attention(q.shape[2], q.device, attention_rows(fused, q.dtype)):
        if fused:
            bias = additive_mask(mask) if mask is not None and mask.dtype == torch.bool else mask
            return torch.ops.draftsman.short_attention(q, keys, values, bias,
                                                       q.shape[-1] ** -0.5)
        return matmul_attention(q, keys, values, mask)
    causal = sdpa_is_causal(mask, start, q.shape[2], q.device)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=None if causal else mask, is_causal=causal,
        enable_gqa=q.shape[1] != keys.shape[1]
    )
    b, h, t, d = out.shape
    return out.transpose(1, 2).reshape(b, t, h * d)


class DecoderLM(nn.Module):
    """Shared decode loop; a family supplies `embed`, `layers`, `norm` and `lm_head`."""

    config: ModelConfig
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Linear
    fused_cpu_ops = False  # set by use_fused_cpu_ops, with every module that declares it
    _fused_cpu_step: FusedCpuStep | None = None  # a family's flat plan (fused_step), built lazily

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def layer_context(self, positions: torch.Tensor) -> object:
        """Per-forward data every layer needs (RoPE tables for Llama, nothing for GPT-2)."""
        return None

    @property
    def dtype(self) -> torch.dtype:
        """Activation and KV-cache dtype (the final norm's, which quantisation never touches)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def capabilities(self) -> Capabilities:
        """Our own models expose every part of the forward contract."""
        return Capabilities(backend="torch", layer_ranges=True, input_embeddings=True,
                            hidden_states=True, exact_tree_keep=True, max_tree_rows=None,
                            device=self.device.type, numerics=None, ragged_batches=True,
                            ragged_trees=True, greedy_head=True)

    def fused_step(self, x: torch.Tensor, context: object, cache: KVCache,
                   rows: int) -> FusedCpuStep | None:
        """The flat plan that runs this forward's layers on the fused CPU ops
        (models/fused_cpu_step.py), or None: the module tree runs them. A family whose blocks
        take such a plan overrides this."""
        return None

    def _apply(self, fn, recurse: bool = True):
        self._fused_cpu_step = None  # .to() and friends replace tensors the plan holds
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())  # a copy: the live model keeps its plan
        state.pop("_fused_cpu_step", None)  # closures over this process's tensors: rebuilt
        return state

    def __setstate__(self, state: dict) -> None:
        # unpickled in another process (the pipelined workers): load the fused ops there too
        super().__setstate__(state)
        if self.fused_cpu_ops and not kquant_available():
            raise UnsupportedError(f"the fused CPU ops do not load here: {unavailable_reason()}")

    def use_fused_cpu_ops(self, on: bool = True) -> None:
        """Run the small ops of a step (RMSNorm, SwiGLU's silu * up, attention over up to
        `attention_rows()` new rows) as one call each to draftsman's own CPU kernels
        (kernels/decode_ops.cpp, attention_ops.cpp) instead of several PyTorch operators.
        They are batch invariant like the PyTorch path but round attention differently, so a
        model keeps one choice for its whole life; `quantize_model` takes them where they
        build.
        UnsupportedError where the kernels do not build."""
        if on and not kquant_available():
            raise UnsupportedError(f"the fused CPU ops do not load here: {unavailable_reason()}")
        for module in self.modules():
            if hasattr(module, "fused_cpu_ops"):
                module.fused_cpu_ops = on

    def attention_rows(self) -> int:
        """Up to how many new rows this model's CPU attention skips SDPA (`attention_rows`)."""
        return attention_rows(self.fused_cpu_ops, self.dtype)

    def new_cache(self, capacity: int, batch: int = 1) -> KVCache:
        c = self.config
        return KVCache(
            c.num_layers, c.num_kv_heads, c.head_dim, capacity,
            batch=batch, dtype=self.dtype, device=self.device,
        )

    def head(self, hidden: torch.Tensor, exit_head: nn.Module | None = None) -> torch.Tensor:
        """Final norm + LM head (or a trained exit head) on any residual-stream state."""
        normed = self.norm(hidden)
        return (exit_head or self.lm_head)(normed)

    def greedy_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, H] -> [B, T] greedy tokens: greedy_tokens(head(hidden)), the same
        tokens; an LM head with a greedy product of its own (QuantLinear.greedy_product: the
        records kernel picks as it multiplies) never stores the logits (a 16-row verify's
        151,936 columns: ~0.6 ms of the 0.5B q8's head on an AMX Xeon)."""
        normed = self.norm(hidden)
        pick = getattr(self.lm_head, "greedy_product", None)
        direct = pick(normed.dtype) if pick is not None else None
        if direct is None or not normed.is_contiguous():
            return greedy_tokens(self.lm_head(normed))
        return direct(normed.reshape(-1, normed.shape[-1])).view(normed.shape[:-1])

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor | None,
        positions: torch.Tensor,
        cache: KVCache,
        *,
        mask: torch.Tensor | None = None,
        layers: range | None = None,
        inputs_embeds: torch.Tensor | None = None,
        hidden_from: torch.Tensor | None = None,
        logits_at: slice | torch.Tensor | None = ALL,
        start: int | None = None,
        greedy: bool = False,
    ) -> Output:
        """tokens/positions [B, T]; see the module docstring for the contract.

        `layers` runs only layers[i..j) taking `hidden_from` [B, T, H] as input when i > 0;
        logits are computed only if the range ends at the last layer and `logits_at` selects
        positions (a slice or an index tensor over T; None skips the head). `greedy`: the
        head gives those positions' greedy tokens (Output.tokens) instead of logits.
        """
        if isinstance(cache, RaggedCaches):
            if mask is not None or layers is not None or inputs_embeds is not None:
                raise UnsupportedError("a ragged forward takes token ids of whole models; "
                                       "tree masks go in its segments")
            return self._ragged_forward(tokens, positions, cache, logits_at, greedy)
        n_layers = self.config.num_layers
        layers = layers if layers is not None else range(n_layers)
        # callers build token ids and positions on the host; `.to` is a no-op on the CPU. Not
        # blocking: a blocking copy to a GPU waits for all its queued work, and a decode loop
        # that keeps the host a step ahead (Autoregressive) queues the next step meanwhile
        device = self.device
        positions = positions.to(device, non_blocking=True)
        if tokens is not None:
            tokens = tokens.to(device, non_blocking=True)
        start = cache.length if start is None else start
        length = positions.shape[1]
        cache.check_room(start + length)
        if layers.start == 0:
            x = inputs_embeds if inputs_embeds is not None else self.embed(tokens, positions)
        else:
            if hidden_from is None:
                raise ValueError("a layer range that starts after layer 0 needs hidden_from")
            x = hidden_from
        attn_mask = attention_mask(
            start, length, mask, x.device, positions, self.config.sliding_window,
            additive=uses_matmul_attention(length, x.device, self.attention_rows()),
        )
        ctx = self.layer_context(positions)
        step = self.fused_step(x, ctx, cache, length)
        with growing_attention(device):
            if step is not None:
                x = step.run(x, ctx, cache, layers, start, attn_mask)
            else:
                for i in layers:
                    x = self.layers[i](x, ctx, cache, i, start, attn_mask)
        cache.set_length(start + length)
        if layers.stop != n_layers:
            logits_at = None
        return self._head_output(x, logits_at, greedy)

    def _head_output(self, x: torch.Tensor, logits_at: slice | torch.Tensor | None,
                     greedy: bool) -> Output:
        if logits_at is None:
            return Output(logits=None, hidden=x)
        if greedy:
            return Output(logits=None, hidden=x, tokens=self.greedy_head(x[:, logits_at]))
        return Output(logits=self.head(x[:, logits_at]), hidden=x)

    def _ragged_forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                        caches: RaggedCaches, logits_at: slice | torch.Tensor | None,
                        greedy: bool) -> Output:
        """tokens/positions [1, N]: the segments' rows end to end (models/ragged.py)."""
        device = self.device
        tokens = tokens.to(device, non_blocking=True)
        positions = positions.to(device, non_blocking=True)
        if positions.shape != (1, caches.rows):
            raise ValueError(f"a ragged forward over {caches.rows} rows got positions "
                             f"{tuple(positions.shape)}")
        caches.check_room()
        x = self.embed(tokens, positions)
        # each segment's mask exactly as a forward of that sequence alone builds it
        masks = [attention_mask(seg.start, seg.rows, seg.mask, device, pos,
                                self.config.sliding_window,
                                additive=uses_matmul_attention(seg.rows, device,
                                                               self.attention_rows()))
                 for seg, pos in zip(caches.segments, caches.split(positions), strict=True)]
        ctx = self.layer_context(positions)
        with growing_attention(device):
            for i, layer in enumerate(self.layers):
                x = layer(x, ctx, caches, i, 0, masks)
        caches.commit()
        return self._head_output(x, logits_at, greedy)
