"""The fused CPU ops between a step's matrices (kernels/decode_ops.cpp).

Each is held to the PyTorch arithmetic it replaces, every output row to itself computed
alone (batch invariance: what exact decoding on them rests on), and the attention's mask to
a negative control: a masked key must not matter, a visible one must.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_pair

from draftsman.kernels.native import attention_amx, attention_bf16_pairs, kquant_available
from draftsman.models.base import additive_mask, causal_mask, matmul_attention
from draftsman.models.config import ModelConfig
from draftsman.models.rope import RotaryTable, apply_rotary

pytestmark = pytest.mark.skipif(not kquant_available(), reason="no C++ compiler here")
ops = torch.ops.draftsman
DTYPES = [torch.float32, torch.bfloat16]


def rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * F.rms_norm(x.float(), w.shape, eps=eps).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [64, 1536, 100])
def test_rms_norm_matches_pytorch_and_is_batch_invariant(dtype, width):
    torch.manual_seed(0)
    x = (torch.randn(9, width) * 3).to(dtype)
    w = torch.randn(width).to(dtype)
    got = ops.rms_norm(x, w, 1e-6)
    want = rms_reference(x, w, 1e-6)
    # the sum of squares runs in another order: at most a rounding apart
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 8e-3,
                               atol=1e-5)
    if dtype == torch.bfloat16:  # float32 differs in last bits; bf16 rounds them away
        assert (got == want).float().mean() > 0.95
    for r in (0, 4, 8):
        assert torch.equal(ops.rms_norm(x[r:r + 1].contiguous(), w, 1e-6)[0], got[r])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 100])
def test_add_rms_norm_is_the_add_then_the_norm_bit_for_bit(dtype, width):
    """The residual add rounds as PyTorch's add (the float sum to the dtype), the norm is
    rms_norm's on that sum; each row the same alone; a changed delta changes both."""
    torch.manual_seed(2)
    x, delta = (torch.randn(2, 11, width) * 3).to(dtype)
    w = torch.randn(width).to(dtype)
    total, normed = ops.add_rms_norm(x, delta, w, 1e-6)
    assert torch.equal(total, x + delta)
    assert torch.equal(normed, ops.rms_norm(x + delta, w, 1e-6))
    for r in (0, 5, 10):
        alone = ops.add_rms_norm(x[r:r + 1].contiguous(), delta[r:r + 1].contiguous(), w, 1e-6)
        assert torch.equal(alone[0][0], total[r]) and torch.equal(alone[1][0], normed[r])
    other = delta.clone()
    other[3, 7] += 1
    assert not torch.equal(ops.add_rms_norm(x, other, w, 1e-6)[1][3], normed[3])
    with pytest.raises(RuntimeError, match="one dtype"):
        ops.add_rms_norm(x, delta[:, :-1].contiguous(), w, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_pytorch_and_is_batch_invariant(dtype):
    torch.manual_seed(1)
    gate_up = (torch.randn(5, 2 * 1100) * 6).to(dtype)  # 1100: vector body and scalar tail
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -90.0])
    gate, up = gate_up.chunk(2, dim=-1)
    got = ops.silu_mul(gate_up)
    want = F.silu(gate).mul_(up)
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 8e-3,
                               atol=1e-6)
    assert torch.isfinite(got).all()
    for r in (0, 3):
        assert torch.equal(ops.silu_mul(gate_up[r:r + 1].contiguous())[0], got[r])


def attention_inputs(dtype, t=4, start=37, hq=6, hkv=2, d=40, seed=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, t, d, generator=g).to(dtype)
    keys = torch.randn(1, hkv, start + t, d, generator=g).to(dtype)
    values = torch.randn(1, hkv, start + t, d, generator=g).to(dtype)
    return q, keys, values


# head sizes: 40 takes the 8-wide path everywhere, 64 and 128 the AVX-512 one where the CPU
# has it (kernels/attention_ops.cpp)
HEAD_SIZES = [40, 64, 128]


@pytest.mark.parametrize("d", HEAD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_short_attention_matches_matmul_attention(dtype, d):
    q, keys, values = attention_inputs(dtype, d=d)
    bias = additive_mask(causal_mask(37, 4, q.device))
    got = ops.short_attention(q, keys, values, bias, q.shape[-1] ** -0.5)
    want = matmul_attention(q, keys, values, bias)
    assert got.shape == want.shape == (1, 4, 6 * d)
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-2,
                               atol=1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize(("d", "rows"), [(40, 5), (64, 5), (128, 11), (128, 40)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_short_attention_rows_are_one_row_calls(dtype, d, rows):
    # the AVX-512 path's tasks: 11 rows one chunk or (one thread a head) several; 40 rows
    # chunks of at most 16; 37 + t keys: a padded last block. Any thread count, the same bits.
    q, keys, values = attention_inputs(dtype, t=rows, d=d)
    bias = additive_mask(causal_mask(37, rows, q.device))
    got = ops.short_attention(q, keys, values, bias, 0.1)
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert torch.equal(ops.short_attention(q, keys, values, bias, 0.1), got), n
    finally:
        torch.set_num_threads(threads)
    for t in range(rows):
        end = 37 + t + 1  # the slots a one-token decode at this position would see
        alone = ops.short_attention(q[:, :, t:t + 1], keys[:, :, :end], values[:, :, :end],
                                    None, 0.1)
        assert torch.equal(alone[:, 0], got[:, t]), t


@pytest.mark.parametrize("d", [40, 64])
def test_short_attention_mask_hides_exactly_the_masked_slots(d):
    q, keys, values = attention_inputs(torch.float32, t=3, d=d)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[:, 10] = False  # a tree mask: slot 10 hidden from every row
    bias = additive_mask(mask[None, None])
    base = ops.short_attention(q, keys, values, bias, 0.2)
    hidden = values.clone()
    hidden[:, :, 10] = 1e6
    assert torch.equal(ops.short_attention(q, keys, hidden, bias, 0.2), base)
    seen = values.clone()
    seen[:, :, 11] += 1.0  # the negative control: a visible slot changes the answer
    assert not torch.allclose(ops.short_attention(q, keys, seen, bias, 0.2), base)


def check_bf16_pair_attention(hq: int, rows: int, cached: int, d: int) -> None:
    """The bf16 attentions that multiply bf16 pairs (AMX tiles; AVX512-BF16 vectors, scores
    only): 16 rows of 6 or 7 query heads a KV head (the 1.5B, head size 128; the 0.5B, 64),
    keys padded to passes of 64, a tree mask hiding one slot from the last row; near the fp32
    reference, each row bit for bit itself alone, and the hidden slot a negative control."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, hq, rows, d, generator=g).bfloat16()
    keys = torch.randn(1, 2, cached + rows, d, generator=g).bfloat16()
    values = torch.randn(1, 2, cached + rows, d, generator=g).bfloat16()
    mask = causal_mask(cached, rows, q.device).clone()
    mask[..., rows - 1, cached // 2] = False  # a tree mask: one slot hidden from the last row
    bias = additive_mask(mask)
    scale = d ** -0.5
    got = ops.short_attention(q, keys, values, bias, scale)
    want = matmul_attention(q.float(), keys.float(), values.float(), bias)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=1e-2)
    for t in range(rows):
        alone = ops.short_attention(q[:, :, t:t + 1], keys, values, bias[:, :, t:t + 1], scale)
        assert torch.equal(alone[:, 0], got[:, t]), t
    hidden = values.clone()
    hidden[:, :, cached // 2] = 1e4  # the hidden slot does not matter to the last row ...
    assert torch.equal(ops.short_attention(q, keys, hidden, bias, scale)[:, -1], got[:, -1])
    # ... and does to the others (the negative control)
    assert not torch.equal(ops.short_attention(q, keys, hidden, bias, scale)[:, 0], got[:, 0])


BF16_PAIR_CASES = [(12, 16, 300, 128), (14, 16, 64, 64), (14, 16, 64, 128), (12, 3, 1000, 128),
                   (12, 2, 5, 128)]


@pytest.mark.skipif(not attention_amx(), reason="bf16 attention on AMX tiles needs an AMX CPU")
@pytest.mark.parametrize(("hq", "rows", "cached", "d"), BF16_PAIR_CASES)
def test_amx_attention_matches_the_reference_and_each_row_alone(hq, rows, cached, d):
    check_bf16_pair_attention(hq, rows, cached, d)  # kernels/attention_amx.cpp


@pytest.mark.skipif(not attention_bf16_pairs(),
                    reason="bf16 scores on AVX512-BF16 pairs need AVX512-BF16 and no AMX")
@pytest.mark.parametrize(("hq", "rows", "cached", "d"), BF16_PAIR_CASES)
def test_bf16_pair_attention_matches_the_reference_and_each_row_alone(hq, rows, cached, d):
    check_bf16_pair_attention(hq, rows, cached, d)  # kernels/attention_bf16.cpp


def test_short_attention_groups_query_heads_onto_their_kv_head():
    q, keys, values = attention_inputs(torch.float32, t=1, hq=6, hkv=2)
    got = ops.short_attention(q, keys, values, None, 0.3)
    # reference with K/V repeated per query head: head h reads KV head h // 3
    k = keys.repeat_interleave(3, dim=1)
    v = values.repeat_interleave(3, dim=1)
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1)
    want = (p @ v).transpose(1, 2).reshape(1, 1, -1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


ROPE_NQ, ROPE_NKV, ROPE_START = 4, 2, 5  # query heads, KV heads, cached tokens


def rope_case(dtype, d: int, t: int, seed: int, spare: int):
    """cos, sin of positions ROPE_START.. for t rows of head size d, the rows' qkv and
    k / v caches of ROPE_START + t + spare random slots."""
    nq, nkv, start = ROPE_NQ, ROPE_NKV, ROPE_START
    config = ModelConfig.from_dict(dict(
        model_type="llama", vocab_size=10, hidden_size=nq * d, intermediate_size=8,
        num_hidden_layers=1, num_attention_heads=nq, num_key_value_heads=nkv,
        max_position_embeddings=64, rope_theta=10000.0))
    cos, sin = RotaryTable(config, 64, dtype).lookup(torch.arange(start, start + t)[None])
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(1, t, (nq + 2 * nkv) * d, generator=g) * 2).to(dtype)
    k_cache = torch.randn(1, nkv, start + t + spare, d, generator=g).to(dtype)
    v_cache = torch.randn(1, nkv, start + t + spare, d, generator=g).to(dtype)
    return cos, sin, qkv, k_cache, v_cache


@pytest.mark.parametrize(("d", "t"), [(16, 3), (128, 10), (64, 16), (64, 17)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_attention_rotates_stores_and_attends_as_the_separate_steps(dtype, d, t):
    """Up to 16 rows (AVX-512 with d a multiple of 64, or bf16 on AMX tiles) each attention
    task rotates and writes its own KV head's rows; 17 take a rotation pass first: the same
    bits either way."""
    nq, nkv, start = ROPE_NQ, ROPE_NKV, ROPE_START
    cos, sin, qkv, k_cache, v_cache = rope_case(dtype, d, t, seed=3, spare=4)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    bias = additive_mask(causal_mask(start, t, qkv.device))
    got = ops.rope_attention(qkv, cos, sin, k_cache, v_cache, start, bias, d ** -0.5, nq, nkv)
    # the same steps apart: apply_rotary, a cache write, short_attention
    qk = apply_rotary(qkv[..., : (nq + nkv) * d].view(1, t, nq + nkv, d), cos, sin)
    q, k = qk.split((nq, nkv), dim=2)
    want_k[:, :, start:start + t] = k.transpose(1, 2)
    want_v[:, :, start:start + t] = qkv[..., (nq + nkv) * d:].view(1, t, nkv, d).transpose(1, 2)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    want = ops.short_attention(q.transpose(1, 2), want_k[:, :, :start + t],
                               want_v[:, :, :start + t], bias, d ** -0.5)
    assert torch.equal(got, want)


@pytest.mark.parametrize("t", [16, 17])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_attention_rows_at_once_are_the_one_row_calls(dtype, t):
    """A verify's rows in one call (16: each task rotating its own head's rows; 17: a rotation
    pass first) give each row the bits of decoding it alone, one call a row."""
    nq, nkv, d, start = ROPE_NQ, ROPE_NKV, 64, ROPE_START
    cos, sin, qkv, k_cache, v_cache = rope_case(dtype, d, t, seed=4, spare=0)
    k_one, v_one = k_cache.clone(), v_cache.clone()
    together = ops.rope_attention(qkv, cos, sin, k_cache, v_cache, start,
                                  additive_mask(causal_mask(start, t, qkv.device)), d ** -0.5,
                                  nq, nkv)
    for i in range(t):
        alone = ops.rope_attention(qkv[:, i:i + 1].contiguous(), cos[:, i:i + 1].contiguous(),
                                   sin[:, i:i + 1].contiguous(), k_one, v_one, start + i,
                                   additive_mask(causal_mask(start + i, 1, qkv.device)),
                                   d ** -0.5, nq, nkv)
        assert torch.equal(alone[0, 0], together[0, i]), i
    assert torch.equal(k_one, k_cache) and torch.equal(v_one, v_cache)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_model_on_fused_ops_matches_the_pytorch_path(family):
    _, model = tiny_pair(family)
    tokens = torch.tensor([[5, 9, 2, 44, 17, 3, 60, 8]])
    positions = torch.arange(8)[None]
    want = model(tokens, positions, model.new_cache(16)).logits
    model.use_fused_cpu_ops()
    assert model.fused_cpu_ops and model.layers[0].mlp.fused_cpu_ops
    prefix = model.new_cache(16)
    model(tokens[:, :5], positions[:, :5], prefix)  # then 3 rows on the short attention
    got = model(tokens[:, 5:], positions[:, 5:], prefix).logits
    torch.testing.assert_close(got, want[:, 5:], rtol=1e-4, atol=1e-4)


def test_static_steps_on_fused_ops_match_the_dynamic_forward():
    # --static feeds the layers a SlotWriter and a boolean mask over the whole buffer
    from draftsman.models.static_step import StaticConfig, StaticModel

    _, model = tiny_pair("llama")
    model.use_fused_cpu_ops()
    static = StaticModel(model, StaticConfig())
    dyn, sta = model.new_cache(64), static.new_cache(64)
    for start, tokens in ((0, [5, 9, 2, 44, 17]), (5, [3]), (6, [60, 8, 1])):
        ids, pos = torch.tensor([tokens]), torch.arange(start, start + len(tokens))[None]
        want = model(ids, pos, dyn).logits
        got = static(ids, pos, sta).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _forward_in_child(model, tokens, queue) -> None:
    logits = model(tokens, torch.arange(tokens.shape[1])[None], model.new_cache(16)).logits
    queue.put(logits.tolist())  # plain floats: a tensor would live in the child's memory


def test_a_fused_model_runs_in_a_spawned_process():
    # the pipelined workers receive the model pickled into a fresh interpreter, where the
    # operators exist only once the kernels are loaded there
    _, model = tiny_pair("llama")
    model.use_fused_cpu_ops()
    tokens = torch.tensor([[5, 9, 2, 44]])
    want = model(tokens, torch.arange(4)[None], model.new_cache(16)).logits
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_forward_in_child, args=(model, tokens, queue))
    child.start()
    got = queue.get(timeout=120)
    child.join(timeout=30)
    assert torch.equal(torch.tensor(got), want)


@pytest.mark.skipif(not (kquant_available() and (attention_bf16_pairs() or attention_amx())),
                    reason="a long causal run attends in blocks where the fused op scores bf16 "
                           "rows on AVX512-BF16 pairs or AMX-BF16 tiles; this CPU or build has "
                           "neither")
@pytest.mark.parametrize("rows, start", [(300, 0), (150, 40)])
def test_a_long_causal_run_attends_in_blocks_with_one_calls_bits(rows, start, monkeypatch):
    """A prompt of 300 rows, and a chunk of 150 after 40 cached: fused calls of
    CAUSAL_BLOCK_ROWS rows give the logits and cache of one call over all rows with the whole
    causal bias, and agree with SDPA's attention to bf16's precision."""
    from draftsman.models import base, llama
    from draftsman.models.cache import KVCache

    _, model = tiny_pair("qwen2", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512)
    model = model.to(torch.bfloat16)
    model.use_fused_cpu_ops()
    ids = torch.randint(0, 97, (1, start + rows), generator=torch.Generator().manual_seed(5))
    calls: list[int] = []
    write = KVCache.write_rotated_and_attend

    def spy(self, layer, at, qkv, *args):
        calls.append(qkv.shape[1])
        return write(self, layer, at, qkv, *args)

    monkeypatch.setattr(KVCache, "write_rotated_and_attend", spy)

    def run() -> tuple[torch.Tensor, ...]:
        cache = model.new_cache(start + rows + 8)
        if start:
            model(ids[:, :start], torch.arange(start)[None], cache)
        calls.clear()
        out = model(ids[:, start:], torch.arange(start, start + rows)[None], cache)
        return out.logits, cache.k, cache.v

    got = run()
    step = base.CAUSAL_BLOCK_ROWS
    blocks = [min(step, rows - s0) for s0 in range(0, rows, step)]
    assert len(blocks) > 1 and calls == blocks * model.config.num_layers
    monkeypatch.setattr(base, "CAUSAL_BLOCK_ROWS", 10**6)
    one_call = run()
    assert calls == [rows] * model.config.num_layers
    assert all(torch.equal(a, b) for a, b in zip(got, one_call, strict=True))
    monkeypatch.setattr(llama, "runs_causal_in_blocks", lambda *args: False)
    sdpa = run()
    assert calls == []
    torch.testing.assert_close(got[0].float(), sdpa[0].float(), rtol=0.05, atol=0.05)


@pytest.mark.skipif(not (kquant_available() and (attention_bf16_pairs() or attention_amx())),
                    reason="a long causal run attends in blocks where the fused op scores bf16 "
                           "rows on AVX512-BF16 pairs or AMX-BF16 tiles; this CPU or build has "
                           "neither")
def test_long_prompts_in_one_ragged_step_attend_as_each_alone():
    """Two prompts of other lengths (90 and 150 rows) and a decode row in one ragged forward:
    each prompt's plain causal mask is known as such beside the other's, so each attends in
    blocks as it does alone, and its logits and cache are its own bit for bit."""
    from draftsman.models.ragged import RaggedCaches, Segment

    _, model = tiny_pair("qwen2", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512)
    model = model.to(torch.bfloat16)
    model.use_fused_cpu_ops()
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (90, 150)]
    alone = []
    for p in prompts:
        cache = model.new_cache(160)
        alone.append((model(torch.tensor([p]), torch.arange(len(p))[None], cache).logits[0],
                      cache))
    decoding, single = model.new_cache(160), model.new_cache(160)
    for cache in (decoding, single):
        model(torch.tensor([[3, 4, 5]]), torch.arange(3)[None], cache)
    step = model(torch.tensor([[6]]), torch.tensor([[3]]), single).logits[0]
    caches = [model.new_cache(160) for _ in prompts]
    segments = [Segment(c, 0, len(p)) for c, p in zip(caches, prompts, strict=True)]
    ids = torch.tensor([prompts[0] + [6] + prompts[1]])
    pos = torch.tensor([list(range(90)) + [3] + list(range(150))])
    segments.insert(1, Segment(decoding, 3, 1))
    out = model(ids, pos, RaggedCaches(segments)).logits[0]
    assert torch.equal(out[:90], alone[0][0]) and torch.equal(out[91:], alone[1][0])
    assert torch.equal(out[90:91], step)
    for (_, ref), mine in zip(alone, caches, strict=True):
        assert torch.equal(mine.k[:, :, :, :ref.length], ref.k[:, :, :, :ref.length])
