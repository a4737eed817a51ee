"""q4 / q8: a GGUF's own blocks on PyTorch's packed CPU kernels (models/quant_linear.py).

Tiny random models whose matrices are GGUF blocks made in the test (gguf's quantiser where it
has one, random valid blocks for Q4_K / Q6_K): the packed form equals gguf's dequantisation
(exact maps) or stays within half an int8 step (requantised types); the packed forward
matches the dequantised model's; every exact method emits its own autoregressive tokens on
the q4 model (float32 activations, as the torch exactness tests run); bad types are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from test_speculative import prompts, run
from tiny import hf_model

from draftsman.errors import DraftsmanError, UnsupportedError
from draftsman.kernels.native import kquant_available
from draftsman.models import quant_linear
from draftsman.models.config import ModelConfig
from draftsman.models.int8_linear import Int8Matrix
from draftsman.models.loader import build_model
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.models.quant_linear import (
    Int4Matrix,
    QuantLinear,
    decode_int4,
    dequantize_rows,
    quantize_model,
)
from draftsman.models.weight_formats import int8_kernel, parse_dtype
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.store.dequant import permute_rotary
from draftsman.store.gguf_blocks import BlockTensor, read_gguf_blocks
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.parallel_prompt import ParallelPrompt
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative
from draftsman.trees.sparse import PRIOR_ACCURACY, make_trees
from draftsman.verification.prompt_tree import TreeDecoder

BF16_REL = 2.0 ** -7  # bf16 ulp relative to a value in [1, 2): rounding is half of it


def random_blocks(qtype: Q, n: int, k: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Valid random K-quant (or Q8_0) blocks (gguf has no quantiser for K-quants): random
    bytes, then small fp16 block scales so the weights look like an initialised model's."""
    rng = np.random.default_rng(seed)
    size, width = {Q.Q4_K: (144, 256), Q.Q6_K: (210, 256), Q.Q8_0: (34, 32)}[qtype]
    b = rng.integers(0, 256, (n, k // width, size), dtype=np.uint8)

    def f16(high: float) -> np.ndarray:
        return (rng.uniform(0.5, 1, (n, k // width, 1)) * high * scale).astype(
            np.float16).view(np.uint8)

    if qtype == Q.Q4_K:
        b[..., 0:2], b[..., 2:4] = f16(1.5e-4), f16(2e-3)
    elif qtype == Q.Q8_0:
        b[..., 0:2] = f16(2e-4)
    else:
        b[..., 208:210] = f16(2e-5)
    return b.reshape(n, -1)


def make_blocks(name: str, w: torch.Tensor, qtype: Q, seed: int = 0,
                scale: float = 1.0) -> BlockTensor:
    n, k = w.shape
    if qtype in (Q.Q4_K, Q.Q6_K):
        rows = random_blocks(qtype, n, k, seed, scale)
    else:
        rows = quantize(w.float().numpy() * scale, qtype)
    return BlockTensor(name, int(qtype), (n, k), rows)


def deq(t: BlockTensor) -> torch.Tensor:
    return torch.from_numpy(dequantize(t.rows, Q(t.qtype)).astype(np.float32)).reshape(t.shape)


# Mixed on purpose: the fused q/k/v of Q4_K q, k and Q6_K v holds an int4 and an int8 matrix.
TYPES = {"q_proj": Q.Q4_K, "k_proj": Q.Q4_K, "v_proj": Q.Q6_K, "o_proj": Q.Q4_1,
         "gate_proj": Q.Q4_K, "up_proj": Q.Q4_0, "down_proj": Q.Q8_0, "lm_head": Q.Q4_K,
         "embed_tokens": Q.Q8_0}
DIMS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2)


def gguf_model(family: str = "llama", seed: int = 0, lm_scale: float = 1.0):
    """(config, state with every matrix = its blocks dequantised, blocks by HF name)."""
    hf = hf_model(family, seed, **DIMS)
    config = ModelConfig.from_dict(hf.config.to_dict())
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    blocks = {}
    for i, (name, w) in enumerate(sorted(state.items())):
        kind = name.split(".")[-2]
        if w.dim() != 2 or kind not in TYPES:
            continue
        scale = lm_scale if kind == "lm_head" else 1.0
        blocks[name] = make_blocks(name, w, TYPES[kind], seed=seed * 1000 + i, scale=scale)
        state[name] = deq(blocks[name])
    return config, state, blocks


def quantised(config, state, blocks, kind="q4", dtype=torch.float32):
    return quantize_model(build_model(config, state, dtype), kind, blocks)


# ----------------------------------------------------------------------------- block maps


BLOCK = {Q.Q4_0: (32, 18), Q.Q4_1: (32, 20), Q.Q5_0: (32, 22), Q.Q5_1: (32, 24),
         Q.Q8_0: (32, 34), Q.Q4_K: (256, 144), Q.Q5_K: (256, 176), Q.Q6_K: (256, 210)}


@pytest.mark.skipif(not kquant_available(), reason="the kernels do not build here")
@pytest.mark.parametrize("qtype", list(BLOCK))
def test_native_decoding_is_ggufs_bit_for_bit(qtype):
    """kernels/gguf_convert.cpp's decoder (q8 and q4-draft load through it) against
    gguf-py's numpy one, on random blocks with sane fp16 scales (fp16 fields at their
    offsets: d (and m / dmin) first, Q6_K's d last)."""
    size, nbytes = BLOCK[qtype]
    rng = np.random.default_rng(int(qtype))
    n, k = 24, 512
    rows = rng.integers(0, 256, (n, k // size, nbytes), dtype=np.uint8)
    fields = [208] if qtype == Q.Q6_K else [0, 2] if qtype in (Q.Q4_1, Q.Q5_1, Q.Q4_K,
                                                                     Q.Q5_K) else [0]
    for at in fields:
        rows[..., at:at + 2] = (rng.uniform(0.1, 1, (n, k // size, 1)) * 0.01).astype(
            np.float16).view(np.uint8)
    rows = rows.reshape(n, -1)
    want = torch.from_numpy(dequantize(rows, qtype).astype(np.float32)).reshape(n, k)
    got = dequantize_rows(BlockTensor("w", int(qtype), (n, k), rows))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    rows[0, 5] ^= 0x11  # the decoder reads the bytes it is given
    assert not torch.equal(dequantize_rows(BlockTensor("w", int(qtype), (n, k), rows)), got)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_int4_forms_equal_ggufs_dequantisation(qtype):
    w = torch.randn(48, 512) * 0.05
    t = make_blocks("w", w, qtype, seed=3)
    ref = deq(t)
    rows = decode_int4(t)
    assert rows.q.dtype == torch.uint8 and int(rows.q.max()) <= 15
    assert rows.scale.shape == (48, 512 // 32)
    exact = (rows.weight(torch.float32) - ref).abs().max()
    assert exact <= 1e-6 * ref.abs().max()  # float32 scale and zero: equal up to rounding
    # bf16 scale and zero (what the bf16 model runs): within one rounding of each
    s = rows.scale.repeat_interleave(32, 1)
    z = rows.zero.repeat_interleave(32, 1)
    bound = (BF16_REL / 2) * ((rows.q.float() - 8).abs() * s.abs() + z.abs()) + 1e-7
    err = (rows.weight(torch.bfloat16) - ref).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    # measured on these blocks: error relative to the largest weight
    assert float(err.max() / ref.abs().max()) < 2 ** -7


def test_int4_decoder_is_not_a_tautology():
    """Swapping the nibble order breaks the comparison above (so it can fail)."""
    t = make_blocks("w", torch.randn(16, 256), Q.Q4_K, seed=1)
    rows = decode_int4(t)
    swapped = rows.q.reshape(16, -1, 2, 32).flip(2).reshape(16, 256)
    rows.q = swapped
    assert (rows.weight(torch.float32) - deq(t)).abs().max() > 1e-3


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q6_K])
def test_wider_types_requantise_to_int8_within_half_a_step(qtype):
    w = torch.randn(40, 512) * 0.05
    ref = deq(make_blocks("w", w, qtype, seed=2))
    m = Int8Matrix(ref, torch.float32)
    back = m.weight_int8.float() * m.scale[:, None]
    err = (back - ref).abs()
    assert bool((err <= m.scale[:, None] / 2 * (1 + 1e-5)).all())
    assert float(err.max() / ref.abs().max()) <= 1 / 254 + 1e-6


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_packed_kernels_compute_the_unpacked_weights(dtype, tol):
    t = make_blocks("w", torch.randn(40, 512) * 0.05, Q.Q4_K, seed=4)  # 40 rows: padded
    rows = decode_int4(t)
    x = torch.randn(5, 512)
    got = Int4Matrix(rows, dtype)(x.to(dtype)).float()
    want = x.to(dtype).float() @ rows.weight(dtype).T
    assert got.shape == (5, 40)
    assert (got - want).abs().max() <= tol * want.abs().max()
    w8 = deq(make_blocks("w", torch.randn(40, 512) * 0.05, Q.Q8_0))
    m = Int8Matrix(w8, dtype)
    want8 = x.to(dtype).float() @ (m.weight_int8.float() * m.scale.float()[:, None]).T
    assert (m(x.to(dtype)).float() - want8).abs().max() <= tol * want8.abs().max()


def test_unsupported_type_is_one_clear_line():
    bad = BlockTensor("model.layers.0.mlp.up_proj.weight", int(Q.Q8_K), (4, 256),
                      np.zeros((4, 292), np.uint8))
    with pytest.raises(UnsupportedError) as err:
        dequantize_rows(bad)
    msg = str(err.value)
    assert "\n" not in msg and "model.layers.0.mlp.up_proj.weight" in msg and "Q8_K" in msg
    with pytest.raises(UnsupportedError, match="Q8_K"):
        decode_int4(bad)


# ----------------------------------------------------------------------------- models


def use_path(monkeypatch, path: str) -> None:
    """"native": Q4_K / Q6_K on the K-quant kernel (the default where it builds);
    "packed": PyTorch's int4 / int8 kernels (no compiler, or widths not a multiple of 256)."""
    if path.startswith("native") and not quant_linear.kquant_available():
        pytest.skip("the K-quant kernel does not build here")
    if path == "packed":
        monkeypatch.setattr(quant_linear, "kquant_available", lambda: False)
    if path == "native-vector":
        monkeypatch.setattr(quant_linear, "kquant_records", lambda: False)


NATIVE = "KQuantRecordsMatrix" if quant_linear.kquant_records() else "KQuantMatrix"
# without the native kernels (the "packed" path) int8 rows take oneDNN where the CPU has VNNI
INT8 = "Int8Matrix" if int8_kernel() == "packed" else "OneDnnInt8Matrix"
INT8_TOLERANCE = 0.02 if int8_kernel() == "packed" else 0.05
PATHS = {"native": ([NATIVE, NATIVE], "Q4_K -> Q4_K kernel (as stored)",
                    "Q6_K -> Q6_K kernel (as stored)"),
         "native-vector": (["KQuantMatrix", "KQuantMatrix"], "Q4_K -> Q4_K kernel (as stored)",
                           "Q6_K -> Q6_K kernel (as stored)"),
         "packed": (["Int4Matrix", INT8], "Q4_K -> int4 (exact)",
                    "Q6_K -> int8 per row (requantised)")}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_q4_forward_matches_the_dequantised_model(family, path, monkeypatch):
    use_path(monkeypatch, path)
    config, state, blocks = gguf_model(family)
    ref = build_model(config, state, torch.float32)
    q = quantised(config, state, blocks)
    assert isinstance(q.lm_head, QuantLinear) and not isinstance(q.embed_tokens, QuantLinear)
    want_kinds, q4k, q6k = PATHS[path]
    assert q.quant_summary[q4k] > 0
    assert q.quant_summary[q6k] == 2
    kinds = [type(p).__name__ for p in q.layers[0].self_attn.qkv_proj.parts]
    assert kinds == want_kinds  # Q4_K q, k then Q6_K v
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(12)[None]
    want = ref(ids, pos, ref.new_cache(16)).logits
    got = q(ids, pos, q.new_cache(16)).logits
    # int8-requantised matrices differ by at most half a step per weight; the native
    # kernel's activations are int8 per 256 (half a step of the block's largest value);
    # on oneDNN (CPUs with VNNI/AMX) the int8 matrices round activations too, per row
    # (half a step of the row's largest value), which this tiny random model amplifies
    assert (got - want).abs().max() <= INT8_TOLERANCE * want.abs().max()
    # bf16 activations, scales and cache: the model users run
    qb = quantised(config, state, blocks, dtype=torch.bfloat16)
    assert qb.dtype == torch.bfloat16 and qb.new_cache(4).k.dtype == torch.bfloat16
    gotb = qb(ids, pos, qb.new_cache(16)).logits.float()
    assert (gotb - want).abs().max() <= (INT8_TOLERANCE + 0.04) * want.abs().max()


def test_q4_exact_types_alone_match_tightly(monkeypatch):
    """With only exactly-mapped types, the q4 model is the dequantised model (float32, on
    PyTorch's int4 kernel: the native kernel rounds activations, tested on its own)."""
    use_path(monkeypatch, "packed")
    hf = hf_model("llama", 0, **DIMS)
    config = ModelConfig.from_dict(hf.config.to_dict())
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    blocks = {}
    for i, (name, w) in enumerate(sorted(state.items())):
        if w.dim() == 2 and "embed" not in name:
            b = make_blocks(name, w, [Q.Q4_0, Q.Q4_1, Q.Q4_K][i % 3], seed=i)
            blocks[name], state[name] = b, deq(b)
    ref = build_model(config, state, torch.float32)
    q = quantised(config, state, blocks)
    assert set(q.quant_summary) <= {"Q4_0 -> int4 (exact)", "Q4_1 -> int4 (exact)",
                                    "Q4_K -> int4 (exact)"}
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(9)[None]
    want = ref(ids, pos, ref.new_cache(9)).logits
    got = q(ids, pos, q.new_cache(9)).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    # the dequantised view (exit heads read it) is the packed weights
    torch.testing.assert_close(q.lm_head.weight, state["lm_head.weight"], rtol=0, atol=1e-6)


def test_q8_without_blocks_quantises_the_models_own_weights():
    config, state, _ = gguf_model("qwen2")
    ref = build_model(config, state, torch.float32)
    q = quantize_model(build_model(config, state, torch.float32), "q8")
    assert q.quant_summary == {"float -> int8 per row": 2 * 4 + 1}
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    want = ref(ids, torch.arange(8)[None], ref.new_cache(8)).logits
    got = q(ids, torch.arange(8)[None], q.new_cache(8)).logits
    assert (got - want).abs().max() <= INT8_TOLERANCE * want.abs().max()
    with pytest.raises(DraftsmanError, match="q4"):
        quantize_model(build_model(config, state, torch.float32), "q4")


def test_wrong_shapes_and_missing_tensors_are_refused():
    config, state, blocks = gguf_model("llama")
    short = dict(blocks)
    del short["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(DraftsmanError, match="up_proj"):
        quantised(config, state, short)
    wrong = dict(blocks)
    name = "model.layers.0.mlp.up_proj.weight"
    wrong[name] = make_blocks(name, torch.randn(496, 256), Q.Q4_0)
    with pytest.raises(DraftsmanError, match="does not match"):
        quantised(config, state, wrong)


def test_parse_dtype_folds_int8_into_q8():
    assert parse_dtype("q4") == "q4" and parse_dtype("q8") == "q8" == parse_dtype("int8")
    assert parse_dtype("q4-draft") == "q4-draft"
    with pytest.raises(DraftsmanError, match="q4-draft or q8"):
        parse_dtype("q3")


# ----------------------------------------------------------------------------- exactness


@pytest.fixture(scope="module", params=list(PATHS))
def q4_models(request):
    with pytest.MonkeyPatch.context() as mp:
        use_path(mp, request.param)
        config, state, blocks = gguf_model("llama", seed=0, lm_scale=8.0)  # clear margins
        target = quantised(config, state, blocks)
        draft = quantised(config, state, blocks, kind="q8")  # close: the same blocks in int8
    return {"target": target, "draft": draft}


@pytest.mark.parametrize("drafter", ["ngram", "prompt-lookup", "draft"])
def test_speculative_on_q4_emits_its_own_autoregressive_tokens(q4_models, drafter):
    target = q4_models["target"]
    reference = Autoregressive(target)
    proposer = {"ngram": NGramProposer(), "prompt-lookup": PromptLookupProposer()}.get(
        drafter) or DraftModelProposer(q4_models["draft"])
    accepted = 0
    for gamma in (2, 5):
        spec = Speculative(target, proposer, make_policy(gamma, None))
        for prompt in prompts(3):
            want, _ = run(reference, prompt, max_new=24)
            got, steps = run(spec, prompt, max_new=24)
            assert got == want, (drafter, gamma)
            accepted += sum(s.accepted for s in steps)
    assert accepted > 0


@pytest.mark.parametrize("branches", [2, 3])
@pytest.mark.parametrize("drafter", ["ngram", "prompt-lookup"])
def test_tree_verification_on_q4_is_exact(q4_models, drafter, branches):
    target = q4_models["target"]
    reference = Autoregressive(target)
    proposer = {"ngram": NGramProposer(), "prompt-lookup": PromptLookupProposer()}[drafter]
    spec = TreeSpeculative(target, proposer, make_policy(3, None), BranchPlanner(branches))
    trees = 0
    for prompt in prompts(3):
        want, _ = run(reference, prompt, max_new=24)
        got, steps = run(spec, prompt, max_new=24)
        assert got == want
        trees += sum(s.extra.get("branches", 0) > 1 for s in steps)
    assert trees > 0


def test_parallel_prompt_on_q4_is_exact(q4_models):
    target = q4_models["target"]
    prompt = [5, 17, 3, 44, 12, 9, 60, 2]
    want, _ = run(Autoregressive(target), prompt, max_new=20)
    tokens = PromptTokens.from_vocabulary(target, 3, 1, seed=1)
    trees = make_trees("dynamic", PRIOR_ACCURACY, 3, 16).states
    got, steps = run(ParallelPrompt(TreeDecoder(target, tokens, trees)), prompt, max_new=20)
    assert got == want
    # plain decoding would pass too: some guesses kept (accept path) and some refused
    accepted = sum(s.accepted for s in steps)
    assert 0 < accepted < sum(s.drafted for s in steps)


# ----------------------------------------------------------------------------- GGUF files


def test_gguf_file_blocks_come_back_in_hf_row_order(tmp_path):
    """llama GGUFs store Q/K rows permuted for rotary pairs; the reader undoes it on raw rows."""
    import gguf

    w = torch.randn(64, 256) * 0.05
    b = make_blocks("q", w, Q.Q4_K, seed=9)
    n_head = 4
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_head_count(n_head)
    writer.add_head_count_kv(2)
    writer.add_tensor("blk.0.attn_q.weight", permute_rotary(b.rows, n_head),
                      raw_shape=(64, 144), raw_dtype=Q.Q4_K)
    writer.add_tensor("blk.0.ffn_up.weight", b.rows, raw_shape=(64, 144), raw_dtype=Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got = read_gguf_blocks(path)
    q = got["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (64, 256) and q.qtype == int(Q.Q4_K) and q.type_name == "Q4_K"
    assert np.array_equal(q.rows, b.rows)  # permutation undone
    assert np.array_equal(got["model.layers.0.mlp.up_proj.weight"].rows, b.rows)


def test_pipelined_on_q4_is_exact(q4_models):
    from draftsman.strategies.pipelined import Pipelined, PipelinedConfig, close_pools

    target = q4_models["target"]
    strat = Pipelined(target, PipelinedConfig(workers=1, timeout=60))
    accepted = drafted = 0
    try:
        for prompt in prompts(2):
            want, _ = run(Autoregressive(target), prompt, max_new=16)
            got, steps = run(strat, prompt, max_new=16)
            assert got == want
            accepted += sum(s.accepted for s in steps)
            drafted += sum(s.drafted for s in steps)
    finally:
        close_pools()
    # a sub-worker's pass was adopted (guessed token) and some tokens were missed
    assert 0 < accepted < drafted


@pytest.mark.parametrize("early_exit", [None, 1])
def test_big_little_with_zero_rollback_on_q4_is_the_large_model(q4_models, early_exit):
    """Every small token is checked by the q4 target in one batch and replaced by its own
    choice: the output is the q4 target's autoregressive output (the small model: the q8
    copy, or the target's first layer with an early exit)."""
    from draftsman.strategies.big_little import BigLittle, BigLittleConfig

    target = q4_models["target"]
    small = None if early_exit else q4_models["draft"]
    strat = BigLittle(target, small, BigLittleConfig(fallback=0.0, rollback=0.0, max_small=4),
                      early_exit=early_exit)
    for prompt in prompts(2):
        want, _ = run(Autoregressive(target), prompt, max_new=16)
        got, steps = run(strat, prompt, max_new=16)
        assert got == want
        assert sum(s.draft_forwards for s in steps) > 0  # the small model did run
