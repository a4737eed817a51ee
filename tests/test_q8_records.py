"""8-bit weights on the records kernel (kernels/q8_records.h): Q8_0 blocks (models/q8_blocks.py)
and int8 rows with one scale each (models/int8_linear.py).

Each is held to an independent float64 reference (the weights times activations quantised
per 256 as the kernel documents), every row to itself computed alone (batch and thread-count
invariance), and a corrupted weight must change the answer. The block conversions are held
to gguf's own dequantisation; models on these paths decode exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from test_int8_onednn import (
    assert_exact_methods_emit_its_own_tokens,
    assert_rows_match_one_token_steps,
)
from test_kquant_kernel import assert_batch_invariant, assert_swiglu_is_silu_mul_of_the_product
from test_quant import random_blocks

from draftsman.kernels.native import byte_records, kquant_amx, records_swiglu
from draftsman.models.int8_linear import TYPE_I8_ROW, Int8RecordsMatrix, int8_rows
from draftsman.models.q8_blocks import q8_0_from_blocks
from draftsman.models.quant_linear import dequantize_rows
from draftsman.store.gguf_blocks import BlockTensor

records = pytest.mark.skipif(not byte_records(),
                             reason="no AVX-512 VNNI on this CPU: no Q8_0 records")


def q8_mm(x: torch.Tensor, rows: np.ndarray, tile_rows: int = 0) -> torch.Tensor:
    """Q8_0 rows on the records, on vectors (tile_rows 0) or on AMX tiles from tile_rows."""
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(Q.Q8_0))
    return torch.ops.draftsman.kquant_records_mm(x, packed, int(Q.Q8_0), rows.shape[0],
                                                 tile_rows)


NO_AMX = pytest.mark.skipif(not kquant_amx(),
                            reason="no AMX-INT8 tiles on this CPU (or not granted)")
# 8-bit records by tile_rows: vectors (0), AMX tiles for every row count (1), tiles from 16
PATHS = [pytest.param(0, id="vectors"), pytest.param(1, id="all-tiles", marks=NO_AMX),
         pytest.param(16, id="tiles", marks=NO_AMX)]


def i8_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m = Int8RecordsMatrix(w)
    return m(x)


def reference(x: torch.Tensor, rows: np.ndarray | torch.Tensor) -> np.ndarray:
    """float64 weights (gguf's dequantised Q8_0 rows, or a float [N, K] tensor) times x
    quantised per 256 (zero-padded to whole blocks)."""
    k = x.shape[1]
    if isinstance(rows, torch.Tensor):
        w = rows.double().numpy()
    else:
        w = dequantize(rows, Q.Q8_0).astype(np.float64).reshape(rows.shape[0], k)
    pad = -k % 256
    xf = np.pad(x.float().numpy(), ((0, 0), (0, pad))).reshape(len(x), -1, 256)
    amax = np.abs(xf).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, 1e-30), 0).astype(np.float32)
    xq = np.rint(xf * inv) * (amax / np.float32(127)).astype(np.float32)
    return xq.reshape(len(x), -1)[:, :k].astype(np.float64) @ w.T


@records
@pytest.mark.parametrize("tile_rows", PATHS)
@pytest.mark.parametrize("k", [768, 896])
def test_q8_0_records_compute_the_ggufs_weights(k, tile_rows):
    """40 weight rows (a short last group), widths of whole records and of 3.5 (the 0.5B's
    896: the last record half zero blocks), 1..37 rows (one pass, passes, tiles), an outlier
    row."""
    rows = random_blocks(Q.Q8_0, 40, k, seed=5)
    x = torch.randn(37, k)
    x[3] *= 100
    want = reference(x, rows)
    for m in (1, 2, 5, 8, 9, 16, 17, 37):
        got = q8_mm(x[:m].contiguous(), rows, tile_rows).double().numpy()
        assert np.abs(got - want[:m]).max() <= 1e-5 * np.abs(want[:m]).max(), m
    # the activation rounding is what separates it from float activations
    exact = x.double().numpy() @ dequantize(rows, Q.Q8_0).astype(np.float64).reshape(40, k).T
    assert np.abs(q8_mm(x, rows).double().numpy() - exact).max() > 1e-4 * np.abs(exact).max()


@records
def test_8_bit_records_of_a_half_block_width_are_half_and_give_the_same_bits():
    """896 = 3.5 records: Q8_0 blocks and int8 rows pack a half last record (blocks 0-3 of
    the 8: 2304 of 4352 and 2112 of 4160 bytes) whose sums are those of the same weights
    padded to a whole record, bit for bit, for every row count."""
    rows = random_blocks(Q.Q8_0, 40, 1024, seed=13)
    half = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows[:, :28 * 34].copy()),
                                                   int(Q.Q8_0))
    whole = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(Q.Q8_0))
    assert half.shape[1] == 3 * 4352 + 2304 and whole.shape[1] == 4 * 4352
    w = torch.randn(40, 896)
    i8_half, i8_whole = (Int8RecordsMatrix(v).packed
                         for v in (w, torch.cat([w, w.new_zeros(40, 128)], dim=1)))
    assert i8_half.shape[1] == 3 * 4160 + 2112 and i8_whole.shape[1] == 4 * 4160
    x = torch.randn(37, 896)
    for m in (1, 2, 5, 8, 9, 16, 17, 37):
        xm = x[:m].contiguous()
        for a, b, qtype in ((half, whole, int(Q.Q8_0)), (i8_half, i8_whole, TYPE_I8_ROW)):
            assert torch.equal(torch.ops.draftsman.kquant_records_mm(xm, a, qtype, 40, 0),
                               torch.ops.draftsman.kquant_records_mm(xm, b, qtype, 40, 0))


@records
def test_8_bit_half_record_rows_are_the_same_alone_in_any_batch_and_thread_count():
    """Width 384 = 1.5 records (Q8_0 blocks and int8 rows): every row's bits its own."""
    q8_half = torch.ops.draftsman.kquant_pack_records(
        torch.from_numpy(random_blocks(Q.Q8_0, 48, 384, seed=15)), int(Q.Q8_0))
    i8_half = Int8RecordsMatrix(torch.randn(48, 384)).packed
    assert q8_half.shape[1] == 4352 + 2304 and i8_half.shape[1] == 4160 + 2112
    for packed, qtype in ((q8_half, int(Q.Q8_0)), (i8_half, TYPE_I8_ROW)):
        assert_batch_invariant(
            lambda x, rows, q, packed=packed, qtype=qtype: torch.ops.draftsman.kquant_records_mm(
                x[:, :384].contiguous(), packed, qtype, 48, 0),
            Q.Q8_0, (2, 3, 5, 8, 9, 16, 17, 21, 40), seed=15)


@records
@pytest.mark.parametrize("tile_rows", PATHS)
def test_q8_0_record_rows_are_the_same_alone_in_any_batch_and_thread_count(tile_rows):
    assert_batch_invariant(lambda x, rows, q: q8_mm(x, rows, tile_rows), Q.Q8_0,
                           (2, 3, 5, 8, 9, 16, 17, 21, 40), seed=6)


@records
def test_q8_0_corrupted_weights_change_the_answer_and_bf16_rounds_once():
    rows = random_blocks(Q.Q8_0, 16, 256, seed=8)
    bad = rows.copy()
    bad[:, 2 + 34 * 5] ^= 0x40  # one weight of one block of every row
    for m in (2, 8):
        x = torch.randn(m, 256)
        assert not torch.equal(q8_mm(x, rows), q8_mm(x, bad))
        xb = x.bfloat16()
        assert torch.equal(q8_mm(xb, rows), q8_mm(xb.float(), rows).bfloat16())


@records
@pytest.mark.parametrize("k", [768, 896])
def test_int8_records_compute_the_rows_weights(k):
    """The same int8 rows and scales as oneDNN's path (int8_rows), 40 of them, widths of whole
    records and of 3.5, 1..37 activation rows, an outlier row."""
    w = torch.randn(40, k) * torch.logspace(-2, 0, 40)[:, None]
    q, scale = int8_rows(w)
    weights = q.float() * scale[:, None]
    x = torch.randn(37, k)
    x[3] *= 100
    want = reference(x, weights)
    m = Int8RecordsMatrix(w)
    for rows in (1, 2, 5, 8, 9, 16, 17, 37):
        got = m(x[:rows].contiguous()).double().numpy()
        assert np.abs(got - want[:rows]).max() <= 1e-5 * np.abs(want[:rows]).max(), rows


@records
@pytest.mark.parametrize("tile_rows", PATHS)
def test_int8_record_rows_are_the_same_alone_in_any_batch_and_thread_count(tile_rows):
    w = torch.randn(48, 512)
    packed = Int8RecordsMatrix(w).packed
    assert_batch_invariant(
        lambda x, rows, q: torch.ops.draftsman.kquant_records_mm(x, packed, TYPE_I8_ROW, 48,
                                                                 tile_rows),
        Q.Q8_0, (2, 3, 5, 8, 9, 16, 17, 21, 40), seed=6)


@NO_AMX
@records
@pytest.mark.parametrize("qtype", [pytest.param(TYPE_I8_ROW, id="int8-rows"),
                                   pytest.param(int(Q.Q8_0), id="q8_0")])
@pytest.mark.parametrize("k", [384, 512, 896])
def test_8_bit_records_on_tiles_give_the_vectors_bits(k, qtype):
    """The tiles sum the same integer per record and row (int8 rows: per record; Q8_0: per
    block of 32) as the vectors, whole and half records, and the rows take the vectors' float
    steps in their order: an AMX CPU computes what a VNNI CPU does, bit for bit, wherever the
    tiles start and whether the tiles stream the record's lines or flip them (several tiles of
    rows); an outlier row and 40 columns (a short last group) included."""
    if qtype == TYPE_I8_ROW:
        packed = Int8RecordsMatrix(torch.randn(40, k) * torch.logspace(-2, 0, 40)[:, None]).packed
    else:
        packed = torch.ops.draftsman.kquant_pack_records(
            torch.from_numpy(random_blocks(Q.Q8_0, 40, k, seed=k)), qtype)
    x = torch.randn(70, k)
    x[3] *= 100
    for m in (1, 2, 5, 9, 16, 17, 21, 37, 49, 70):
        xm = x[:m].contiguous()
        want = torch.ops.draftsman.kquant_records_mm(xm, packed, qtype, 40, 0)
        for tile_rows in (1, 8, 16, 17):
            got = torch.ops.draftsman.kquant_records_mm(xm, packed, qtype, 40, tile_rows)
            assert torch.equal(got, want), (m, tile_rows)
        xb = xm.bfloat16()
        assert torch.equal(torch.ops.draftsman.kquant_records_mm(xb, packed, qtype, 40, 1),
                           torch.ops.draftsman.kquant_records_mm(xb, packed, qtype, 40, 0))


@records
def test_int8_records_corrupted_weights_change_the_answer_and_bf16_rounds_once():
    w = torch.randn(16, 256)
    m = Int8RecordsMatrix(w)
    bad = Int8RecordsMatrix(w)
    bad.packed[0, 64 + 5] ^= 0x40  # one weight of one row
    for rows in (2, 8):
        x = torch.randn(rows, 256)
        assert not torch.equal(m(x), bad(x))
        xb = x.bfloat16()
        assert torch.equal(m(xb), m(xb.float()).bfloat16())
    with pytest.raises(RuntimeError, match="int8_pack_records: q must be"):
        torch.ops.draftsman.int8_pack_records(torch.zeros(4, 32), torch.ones(4))


def test_q5_0_blocks_become_q8_0_blocks_of_the_same_weights():
    w = np.random.default_rng(1).standard_normal((24, 896)).astype(np.float32)
    t = BlockTensor("w", int(Q.Q5_0), (24, 896), quantize(w, Q.Q5_0))
    q8 = q8_0_from_blocks(t)
    assert q8.qtype == Q.Q8_0 and q8.rows.shape == (24, 896 // 32 * 34)
    want = dequantize(t.rows, Q.Q5_0).reshape(24, 896)
    assert np.array_equal(dequantize(q8.rows, Q.Q8_0).reshape(24, 896), want)
    assert torch.equal(dequantize_rows(q8), torch.from_numpy(want))


@pytest.fixture(scope="module")
def q8_on_records():
    from test_quant import gguf_model, quantised

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTSMAN_INT8_KERNEL", "records")
        config, state, blocks = gguf_model("llama", seed=0, lm_scale=8.0)
        return quantised(config, state, blocks, kind="q8")


@records
def test_q8_model_runs_every_matrix_as_int8_records(q8_on_records):
    parts = [p for m in q8_on_records.modules() if hasattr(m, "parts") for p in m.parts]
    assert parts and all(isinstance(p, Int8RecordsMatrix) for p in parts)
    assert all(how.endswith("int8 per row (requantised)")
               for how in q8_on_records.quant_summary)
    assert_rows_match_one_token_steps(q8_on_records)


@records
@pytest.mark.parametrize("tree", [False, True])
def test_exact_methods_on_q8_records_emit_its_own_tokens(q8_on_records, tree):
    assert_exact_methods_emit_its_own_tokens(q8_on_records, tree)


@records
def test_q4_runs_q5_0_and_q8_0_matrices_as_stored_on_records(monkeypatch):
    """The 0.5B's GGUF keeps most matrices in Q5_0 and some in Q8_0: under q4 they take the
    records exactly (the dequantised GGUF's weights), beside Q4_K on its own records."""
    from test_quant import DIMS, build_model, deq, quantised
    from tiny import hf_model

    from draftsman.models.config import ModelConfig

    monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", "records")
    hf = hf_model("llama", 0, **DIMS)
    config = ModelConfig.from_dict(hf.config.to_dict())
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    blocks = {}
    kinds = [Q.Q5_0, Q.Q8_0]
    for i, (name, w) in enumerate(sorted(state.items())):
        if w.dim() == 2 and "embed" not in name:
            qtype = kinds[i % 2]
            b = BlockTensor(name, int(qtype), tuple(w.shape), quantize(w.float().numpy(), qtype))
            blocks[name], state[name] = b, deq(b)
    q = quantised(config, state, blocks)
    assert set(q.quant_summary) == {"Q5_0 -> Q8_0 records (exact)",
                                    "Q8_0 -> Q8_0 records (as stored)"}
    ref = build_model(config, state, torch.float32)
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(9)[None]
    want = ref(ids, pos, ref.new_cache(9)).logits
    got = q(ids, pos, q.new_cache(9)).logits
    # the weights are the GGUF's; only the activations' int8 rounding separates them
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.skipif(not records_swiglu(), reason="no AVX-512 VNNI records here")
@pytest.mark.parametrize("tile_rows", PATHS)
def test_int8_rows_give_silu_mul_of_the_product_in_one_call_bit_for_bit(tile_rows):
    """--dtype q8's gate/up projection (int8 rows, a half record at width 896: the 0.5B's)."""
    matrix = Int8RecordsMatrix(torch.randn(96, 896) * 0.05)
    assert_swiglu_is_silu_mul_of_the_product(matrix.packed, TYPE_I8_ROW, 96, 896, tile_rows)


@pytest.mark.skipif(not records_swiglu(), reason="no AVX-512 VNNI records here")
@pytest.mark.parametrize("tile_rows", PATHS)
def test_q8_0_blocks_give_silu_mul_of_the_product_in_one_call_bit_for_bit(tile_rows):
    """--dtype q4's gate/up projection of the 0.5B (Q5_0 as Q8_0 blocks, half a record at
    width 896)."""
    packed = torch.ops.draftsman.kquant_pack_records(
        torch.from_numpy(random_blocks(Q.Q8_0, 96, 896, seed=21)), int(Q.Q8_0))
    assert_swiglu_is_silu_mul_of_the_product(packed, int(Q.Q8_0), 96, 896, tile_rows)
