"""Forward parity with the Hugging Face implementations on tiny random models (fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import FAMILIES, tiny_pair

from draftsman.models.base import additive_mask, causal_mask, matmul_attention

ATOL = 2e-4


def hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids).logits


def positions_for(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n)[None]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_full_forward_matches_reference(family):
    hf, ours = tiny_pair(family)
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(1))
    cache = ours.new_cache(64)
    out = ours(ids, positions_for(0, 20), cache)
    torch.testing.assert_close(out.logits, hf_logits(hf, ids), atol=ATOL, rtol=1e-4)
    assert cache.length == 20


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_incremental_and_rollback_match_reference(family):
    hf, ours = tiny_pair(family)
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(2))
    ref = hf_logits(hf, ids)
    cache = ours.new_cache(64)
    ours(ids[:, :10], positions_for(0, 10), cache)
    # one token at a time
    for t in range(10, 16):
        out = ours(ids[:, t : t + 1], positions_for(t, 1), cache)
        torch.testing.assert_close(out.logits[:, -1], ref[:, t], atol=ATOL, rtol=1e-4)
    # write garbage past 12, roll back, then continue with a chunk: stale slots must not leak
    cache.truncate(12)
    ours(torch.full((1, 4), 5), positions_for(12, 4), cache)
    cache.truncate(12)
    out = ours(ids[:, 12:24], positions_for(12, 12), cache)
    torch.testing.assert_close(out.logits, ref[:, 12:24], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_tree_mask_matches_each_branch(family):
    """Two branches after a shared prefix in one forward: each node sees only its ancestors."""
    hf, ours = tiny_pair(family)
    prefix = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(3))
    a, b, c = 11, 22, 33
    # tree: root a (pos 8); children b and c (both pos 9)
    tree_tokens = torch.tensor([[a, b, c]])
    tree_pos = torch.tensor([[8, 9, 9]])
    tree_mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    cache = ours.new_cache(32)
    ours(prefix, positions_for(0, 8), cache)
    out = ours(tree_tokens, tree_pos, cache, mask=tree_mask)
    ref_b = hf_logits(hf, torch.cat([prefix, torch.tensor([[a, b]])], 1))
    ref_c = hf_logits(hf, torch.cat([prefix, torch.tensor([[a, c]])], 1))
    torch.testing.assert_close(out.logits[:, 0], ref_b[:, 8], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(out.logits[:, 1], ref_b[:, 9], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(out.logits[:, 2], ref_c[:, 9], atol=ATOL, rtol=1e-4)
    # keep the path a -> c, then the next token must match the reference continuation
    cache.keep([8, 10], start=8)
    d = 44
    nxt = ours(torch.tensor([[d]]), positions_for(10, 1), cache)
    ref = hf_logits(hf, torch.cat([prefix, torch.tensor([[a, c, d]])], 1))
    torch.testing.assert_close(nxt.logits[:, -1], ref[:, -1], atol=ATOL, rtol=1e-4)


def test_layer_ranges_compose_and_head_reads_any_hidden():
    hf, ours = tiny_pair("llama")
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(4))
    full = ours(ids, positions_for(0, 12), ours.new_cache(32))
    cache = ours.new_cache(32)
    low = ours(ids, positions_for(0, 12), cache, layers=range(0, 1))
    assert low.logits is None
    high = ours(ids, positions_for(0, 12), cache, layers=range(1, 3), hidden_from=low.hidden,
                start=0)
    torch.testing.assert_close(high.logits, full.logits)
    torch.testing.assert_close(ours.head(high.hidden), full.logits)
    # early exit: reference hidden state after layer 1 through the shared norm + head
    with torch.no_grad():
        ref_hidden = hf(ids, output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(ours.head(low.hidden), hf.lm_head(hf.model.norm(ref_hidden)),
                               atol=ATOL, rtol=1e-4)


def test_inputs_embeds_replace_lookup():
    hf, ours = tiny_pair("qwen2")
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(5))
    embeds = ours.embed(ids, positions_for(0, 6)).clone()
    out = ours(None, positions_for(0, 6), ours.new_cache(16), inputs_embeds=embeds)
    torch.testing.assert_close(out.logits, hf_logits(hf, ids), atol=ATOL, rtol=1e-4)


def test_overflow_is_refused_before_work():
    from draftsman.errors import ContextOverflowError

    _, ours = tiny_pair("llama")
    cache = ours.new_cache(8)
    with pytest.raises(ContextOverflowError):
        ours(torch.zeros(1, 9, dtype=torch.long), positions_for(0, 9), cache)
    assert cache.length == 0


def test_q8_weights_approximate_and_stay_self_consistent():
    from draftsman.models.quant_linear import quantize_model

    hf, ours = tiny_pair("qwen2")
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(6))
    ref = ours(ids, positions_for(0, 10), ours.new_cache(16)).logits
    q = quantize_model(ours, "q8")
    assert q.dtype == torch.float32  # activations keep the norm's dtype
    out = q(ids.clone(), positions_for(0, 10), q.new_cache(16)).logits
    assert (out.float() - ref).abs().max() < 0.05 * ref.abs().max()
    # chunked and one-token forwards agree on the quantised model too
    cache = q.new_cache(16)
    q(ids[:, :6], positions_for(0, 6), cache)
    step = q(ids[:, 6:7], positions_for(6, 1), cache).logits
    torch.testing.assert_close(step[:, -1].float(), out[:, 6].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 3, 16])
def test_matmul_attention_matches_sdpa_and_each_row_alone(dtype, t):
    """The short-batch CPU attention: SDPA's answer, and row i of a T-row call attends as
    it would alone over its own prefix."""
    g = torch.Generator().manual_seed(t)
    b, hq, hkv, d, start = 2, 6, 2, 32, 40
    q = torch.randn(b, hq, t, d, generator=g).to(dtype)
    keys, values = (torch.randn(b, hkv, start + t, d, generator=g).to(dtype) for _ in "kv")
    mask = causal_mask(start, t, torch.device("cpu"))
    got = matmul_attention(q, keys, values, None if t == 1 else additive_mask(mask))
    want = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(b, t, -1), atol=tol, rtol=tol)
    assert torch.equal(got, matmul_attention(q, keys, values, mask))  # boolean mask: same
    for i in range(t):
        n = start + i + 1
        alone = matmul_attention(q[:, :, i : i + 1], keys[:, :, :n], values[:, :, :n], None)
        torch.testing.assert_close(got[:, i : i + 1], alone, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [40, 100])  # the shared short mask's rows, a long prefill's
def test_a_prompts_prefill_skips_masked_key_blocks_with_the_masks_bits(dtype, t, monkeypatch):
    """A whole prompt from slot 0 goes to SDPA as `is_causal` (masked key blocks skipped), with
    exactly the logits and cache the explicit mask gives; a later chunk keeps its mask."""
    from draftsman.models import base

    _, ours = tiny_pair("qwen2")
    ours = ours.to(dtype)
    ids = torch.randint(0, 97, (1, t + 20), generator=torch.Generator().manual_seed(3))
    causal: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        causal.append(kwargs.get("is_causal", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(base.F, "scaled_dot_product_attention", spy)

    def prefill_then_chunk() -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
        causal.clear()
        cache = ours.new_cache(t + 32)
        out = ours(ids[:, :t], positions_for(0, t), cache)
        seen = list(causal)
        chunk = ours(ids[:, t:], positions_for(t, 20), cache)
        assert causal[len(seen):] == [False] * len(seen)  # start > 0: the mask, always
        return torch.cat([out.logits, chunk.logits], dim=1), cache.k, seen

    logits, keys, seen = prefill_then_chunk()
    assert seen == [True] * 3  # every layer skipped
    monkeypatch.setattr(base, "sdpa_is_causal", lambda *args: False)
    ref_logits, ref_keys, ref_seen = prefill_then_chunk()
    assert ref_seen == [False] * 3
    assert torch.equal(logits, ref_logits) and torch.equal(keys, ref_keys)


def test_another_square_mask_from_slot_0_is_not_taken_for_causal(monkeypatch):
    """Two independent sequences of 20 in one forward from slot 0 (a block-diagonal mask, the
    shape of a prompt's causal one): SDPA gets the mask, and each half is its sequence alone."""
    from draftsman.models import base

    _, ours = tiny_pair("llama")
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(4))
    tril = torch.ones(20, 20, dtype=torch.bool).tril()
    mask = torch.zeros(40, 40, dtype=torch.bool)
    mask[:20, :20] = mask[20:, 20:] = tril
    causal: list[bool] = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(base.F, "scaled_dot_product_attention",
                        lambda *a, **k: causal.append(k.get("is_causal", False)) or sdpa(*a, **k))
    both = ours(ids, torch.cat([positions_for(0, 20)] * 2, dim=1), ours.new_cache(48),
                mask=mask).logits
    assert causal == [False] * 3
    second = ours(ids[:, 20:], positions_for(0, 20), ours.new_cache(24)).logits
    torch.testing.assert_close(both[:, 20:], second, atol=1e-5, rtol=1e-5)
