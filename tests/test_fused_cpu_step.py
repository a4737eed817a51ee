"""The flat plan of a step's layers on the fused CPU ops (models/fused_cpu_step.py) computes
what the module tree computes, bit for bit, and steps aside where the tree must run."""

from __future__ import annotations

import pickle

import pytest
import test_quant
import torch
from gguf.constants import GGMLQuantizationType as Q
from test_quant import gguf_model, make_blocks, quantised
from tiny import tiny_pair

from draftsman.kernels.native import (
    attention_amx,
    kquant_available,
    kquant_records,
    layers_in_one_call,
    records_swiglu,
)
from draftsman.models import base, fused_cpu_step
from draftsman.models.fused_cpu_step import FusedCpuStep
from draftsman.models.quant_linear import quantize_model
from draftsman.models.weight_formats import int8_kernel

pytestmark = pytest.mark.skipif(not kquant_available(),
                                reason="the fused CPU ops do not build here")


def steps(model, use_plan: bool, monkeypatch) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Logits of a prefill past the short-attention rows, a decode row, a verify of 5 rows
    under a tree mask and a layer range, and the cache they leave, with the plan or without."""
    with monkeypatch.context() as m:
        if not use_plan:
            m.setattr(model, "fused_step", lambda *args: None)
        cache = model.new_cache(64)
        out = []
        ids = torch.arange(3, 23)[None] % model.config.vocab_size
        # 20 rows: SDPA and no plan, except bf16 on AMX-BF16 tiles (base.attention_rows)
        out.append(model(ids, torch.arange(20)[None], cache).logits)
        out.append(model(torch.tensor([[7]]), torch.tensor([[20]]), cache).logits)
        tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                             [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], dtype=torch.bool)
        out.append(model(torch.tensor([[4, 9, 11, 2, 30]]), torch.tensor([[21, 22, 22, 23, 23]]),
                         cache, mask=tree).logits)
        half = model(torch.tensor([[5, 6]]), torch.tensor([[26, 27]]), cache,
                     layers=range(0, 1), logits_at=None).hidden
        out.append(model(None, torch.tensor([[26, 27]]), cache, layers=range(1, len(model.layers)),
                         hidden_from=half, start=26).logits)
        return out, torch.cat([cache.k.flatten(), cache.v.flatten()])


def assert_plan_matches_the_tree(model, monkeypatch) -> None:
    got, got_cache = steps(model, True, monkeypatch)
    assert isinstance(model._fused_cpu_step, FusedCpuStep)
    want, want_cache = steps(model, False, monkeypatch)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert torch.equal(got_cache, want_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_the_plan_gives_the_module_trees_bits(kind, dtype, monkeypatch):
    """A q4 model of mixed blocks (Q4_K/Q6_K records, int4 and Q8_0 parts: direct kernel
    calls and QuantLinear.forward side by side) and a q8 model, in float32 and bfloat16."""
    config, state, blocks = gguf_model("qwen2")
    model = quantised(config, state, blocks, kind, dtype)
    assert model.fused_cpu_ops
    assert_plan_matches_the_tree(model, monkeypatch)
    linears = [m for b in model.layers for m in (b.self_attn.qkv_proj, b.self_attn.o_proj,
                                                  b.mlp.gate_up_proj, b.mlp.down_proj)]
    direct = any(m.rows_product(dtype) is not None for m in linears)
    # single-part records matrices: q8's int8 rows, q4's Q8_0 down projection (its Q4_K
    # matrices here are fused with other block types into several parts)
    assert direct == (int8_kernel() == "records")


@pytest.mark.skipif(not kquant_records(),
                    reason="neither AVX-512 VNNI nor AVX2 on this CPU: no K-quant records")
def test_a_draft_of_half_records_takes_direct_calls_with_the_same_bits(monkeypatch):
    """q4-draft requantises every matrix to Q4_K records, here 64 and 128 wide: half
    records, each block's products one direct kernel call."""
    hf, model = tiny_pair("qwen2")  # a QKV bias, added after the direct call
    blocks = {name: make_blocks(name, w, Q.Q8_0) for name, w in hf.state_dict().items()
              if w.dim() == 2}
    model = quantize_model(model, "q4-draft", blocks)
    assert all(m.rows_product(torch.float32) is not None
               for b in model.layers for m in (b.self_attn.qkv_proj, b.mlp.down_proj))
    assert model.layers[0].mlp.down_proj.parts[0].packed.shape[1] == 320 + 1024  # a half record
    # silu * up in the gate/up call where the records have the epilogue (AVX-512 VNNI)
    fused = model.layers[0].mlp.gate_up_proj.swiglu_product(torch.float32)
    assert (fused is not None) == records_swiglu()
    assert_plan_matches_the_tree(model, monkeypatch)


# A Q4_K_M-like file: Q4_K q and k beside a Q6_K v (a QKV product of two records parts),
# Q4_K gate and up (one part: one SwiGLU call where the records have it), a Q6_K down.
RECORDS_TYPES = {"q_proj": Q.Q4_K, "k_proj": Q.Q4_K, "v_proj": Q.Q6_K, "o_proj": Q.Q4_K,
                 "gate_proj": Q.Q4_K, "up_proj": Q.Q4_K, "down_proj": Q.Q6_K,
                 "lm_head": Q.Q6_K, "embed_tokens": Q.Q8_0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["q8", "q4"])
def test_the_layers_in_one_call_give_the_python_loops_bits(kind, dtype, monkeypatch):
    """A model whose every product is records calls (and a QKV bias, qwen2) runs its layers
    in one decoder_layers call: q8's int8 rows, one call a product; q4's Q4_K and Q6_K
    records, the QKV product in two parts. Every step's logits and the cache it leaves are
    the Python loop's, bit for bit, whole and over layer ranges. A plan without the call's
    operands (a product that is not records calls, or DRAFTSMAN_LAYERS_CALL=0) loops."""
    records = int8_kernel() == "records" if kind == "q8" else kquant_records()
    if not records or not layers_in_one_call():
        pytest.skip(f"no {kind} records on this CPU, or DRAFTSMAN_LAYERS_CALL=0")
    monkeypatch.setattr(test_quant, "TYPES", RECORDS_TYPES)
    config, state, blocks = gguf_model("qwen2")
    model = quantised(config, state, blocks, kind, dtype)
    qkv = model.layers[0].self_attn.qkv_proj
    assert len(qkv.record_parts(dtype)) == (2 if kind == "q4" else 1)
    calls = []
    real = torch.ops.draftsman.decoder_layers
    monkeypatch.setattr(torch.ops.draftsman, "decoder_layers",
                        lambda *a: calls.append(a[5:7]) or real(*a))
    one_call, one_call_cache = steps(model, True, monkeypatch)
    assert model._fused_cpu_step.flat is not None and calls
    monkeypatch.setattr(fused_cpu_step, "flat_layers", lambda *_: None)
    model._fused_cpu_step = None
    count = len(calls)
    loop, loop_cache = steps(model, True, monkeypatch)
    assert model._fused_cpu_step.flat is None and len(calls) == count
    for g, w in zip(one_call, loop, strict=True):
        assert torch.equal(g, w)
    assert torch.equal(one_call_cache, loop_cache)
    with monkeypatch.context() as m:
        m.setattr(fused_cpu_step, "layers_in_one_call", lambda: False)
        assert fused_cpu_step.flat_layers(model.layers, dtype) is None


@pytest.mark.parametrize("rows", [5, 9, 16])
@pytest.mark.parametrize("kind", ["q8", "q4"])
def test_the_layers_in_one_call_give_each_row_its_own_bits(kind, rows, monkeypatch):
    """Batch invariance of the one-call step: `rows` new tokens verified in one forward get
    the logits and cache each gets decoded alone, one forward a token (few-row, paired and
    one-pass record paths on both sides)."""
    records = int8_kernel() == "records" if kind == "q8" else kquant_records()
    if not records or not layers_in_one_call():
        pytest.skip(f"no {kind} records on this CPU, or DRAFTSMAN_LAYERS_CALL=0")
    monkeypatch.setattr(test_quant, "TYPES", RECORDS_TYPES)
    config, state, blocks = gguf_model("qwen2")
    model = quantised(config, state, blocks, kind, torch.bfloat16)
    prompt = torch.arange(3, 23)[None] % config.vocab_size
    new = torch.arange(40, 40 + rows)[None] % config.vocab_size
    caches = []
    for _ in range(2):
        caches.append(model.new_cache(64))
        model(prompt, torch.arange(20)[None], caches[-1])
    together = model(new, torch.arange(20, 20 + rows)[None], caches[0], start=20).logits
    assert model._fused_cpu_step.flat is not None
    for i in range(rows):
        alone = model(new[:, i:i + 1], torch.tensor([[20 + i]]), caches[1], start=20 + i).logits
        assert torch.equal(alone[0, 0], together[0, i]), i
    assert torch.equal(caches[0].k[..., :20 + rows, :], caches[1].k[..., :20 + rows, :])


def test_a_replaced_weight_rebuilds_the_plan_and_a_pickled_model_drops_it(monkeypatch):
    _, model = tiny_pair("llama")
    _, other = tiny_pair("llama", seed=1)
    for m in (model, other):
        quantize_model(m, "q8")
    ids, pos = torch.tensor([[5, 9, 2]]), torch.arange(3)[None]
    model(ids, pos, model.new_cache(8))
    plan = model._fused_cpu_step
    model.layers[1].mlp.down_proj = other.layers[1].mlp.down_proj
    got = model(ids, pos, model.new_cache(8)).logits
    assert model._fused_cpu_step is not plan
    with monkeypatch.context() as m:
        m.setattr(model, "fused_step", lambda *args: None)
        assert torch.equal(got, model(ids, pos, model.new_cache(8)).logits)
    model.float()  # .to() and friends may replace tensors a plan holds: it is dropped
    assert model._fused_cpu_step is None
    copy = pickle.loads(pickle.dumps(model))
    assert copy._fused_cpu_step is None
    assert torch.equal(copy(ids, pos, copy.new_cache(8)).logits, got)


def test_models_with_q_k_norms_keep_the_module_tree():
    _, model = tiny_pair("qwen3")
    quantize_model(model, "q8")
    cache = model.new_cache(8)
    x = model.embed(torch.tensor([[5]]), torch.tensor([[0]]))
    assert model.fused_step(x, model.layer_context(torch.tensor([[0]])), cache, 1) is None
    _, llama = tiny_pair("llama")
    quantize_model(llama, "q8")
    ctx = llama.layer_context(torch.tensor([[0]]))
    assert isinstance(llama.fused_step(x, ctx, cache, 1), FusedCpuStep)
    assert llama.fused_step(x, ctx, cache, 17) is None  # past the short-attention rows
    assert llama.fused_step(x.bfloat16(), ctx, cache, 1) is None  # not the model's dtype


def test_attention_stays_fused_past_16_rows_only_for_bf16_on_amx_tiles(monkeypatch):
    monkeypatch.setattr(base, "attention_amx", lambda: True)
    assert base.attention_rows(True, torch.bfloat16) == base.AMX_ATTENTION_ROWS > 16
    assert (base.attention_rows(True, torch.float32) == base.attention_rows(False, torch.bfloat16)
            == base.MATMUL_ATTENTION_ROWS == 16)
    monkeypatch.setattr(base, "attention_amx", lambda: False)
    assert base.attention_rows(True, torch.bfloat16) == base.MATMUL_ATTENTION_ROWS


@pytest.mark.skipif(not attention_amx(), reason="no AMX-BF16 attention on this CPU")
def test_a_bf16_verify_past_16_rows_takes_the_fused_attention_and_agrees_with_sdpa(monkeypatch):
    """40 new rows under a tree-like mask after 20 cached: one fused call a layer (the plan),
    close to the same forward on SDPA (the fused ops off), the same argmax; each row its own
    (rows 0..39 alone in pieces of 16, 16 and 8 give the same bits)."""
    config, state, blocks = gguf_model("qwen2")
    model = quantised(config, state, blocks, "q4", torch.bfloat16)
    ids = torch.arange(3, 63)[None] % config.vocab_size
    mask = torch.ones(40, 60, dtype=torch.bool)  # the 20 cached tokens visible to all
    mask[:, 20:] = torch.tril(mask[:, 20:])
    mask[20:, 30:40] = False  # a second branch: rows 20.. skip rows 10..19

    def verify(fused: bool, pieces=(40,)) -> torch.Tensor:
        model.use_fused_cpu_ops(fused)
        cache = model.new_cache(64)
        model(ids[:, :20], torch.arange(20)[None], cache)
        out, at = [], 0
        for n in pieces:
            sub = mask[None, at:at + n, :20 + at + n]
            out.append(model(ids[:, 20 + at:20 + at + n], torch.arange(20 + at, 20 + at + n)[None],
                             cache, mask=sub, start=20 + at).logits)
            at += n
        return torch.cat(out, dim=1).float()

    calls = []
    real = model.new_cache(1).__class__.write_rotated_and_attend
    monkeypatch.setattr(type(model.new_cache(1)), "write_rotated_and_attend",
                        lambda self, *a: calls.append(a[2].shape[1]) or real(self, *a))
    fused = verify(True)
    assert calls and set(calls[-len(model.layers):]) == {40}
    assert torch.equal(verify(True, (16, 16, 8)), fused)
    sdpa = verify(False)
    model.use_fused_cpu_ops(True)
    torch.testing.assert_close(fused, sdpa, rtol=0.05, atol=0.05 * float(sdpa.abs().max()))
    assert torch.equal(fused.argmax(-1), sdpa.argmax(-1))
