"""The K-quant kernel (kernels/gguf_matmul.cpp): Q4_K / Q6_K blocks as stored, x in int8.

Held to an independent reference: gguf's own dequantisation of the blocks times activations
quantised per 256 the way the kernel documents (d = max|x| / 127, round half to even). The
SIMD path is held to the kernel's scalar path, every row to itself computed alone (batch
invariance, thread-count invariance), and a corrupted block must change the answer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import random_blocks

from draftsman.hardware import cpu_flags, cpu_kind
from draftsman.kernels import native
from draftsman.kernels.native import (
    kquant_amx,
    kquant_available,
    kquant_isa,
    kquant_records,
    records_swiglu,
    simd_flags,
)

pytestmark = pytest.mark.skipif(not kquant_available(), reason="no C++ compiler here")

TYPES = [Q.Q4_K, Q.Q6_K]


def mm(x: torch.Tensor, rows: np.ndarray, qtype: Q, simd: int = 2) -> torch.Tensor:
    return torch.ops.draftsman.kquant_mm(x, torch.from_numpy(rows), int(qtype), simd)


def reference(x: torch.Tensor, rows: np.ndarray, qtype: Q) -> np.ndarray:
    """float64 sum of gguf's dequantised weights times x quantised per 256-wide block."""
    n = rows.shape[0]
    w = dequantize(rows, qtype).astype(np.float64).reshape(n, -1)
    xf = x.float().numpy()
    blocks = xf.reshape(xf.shape[0], -1, 256)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, 1e-30), 0).astype(np.float32)
    q = np.rint(blocks * inv)  # half to even, as nearbyint in the default rounding mode
    xq = (q * (amax / np.float32(127)).astype(np.float32)).reshape(xf.shape)
    return xq.astype(np.float64) @ w.T


@pytest.mark.parametrize("qtype", TYPES)
def test_kernel_computes_the_ggufs_weights_on_int8_activations(qtype):
    rows = random_blocks(qtype, 40, 768, seed=7)
    x = torch.randn(6, 768)
    got = mm(x, rows, qtype).double().numpy()
    want = reference(x, rows, qtype)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # and the activation rounding is what separates it from float activations
    exact = x.double().numpy() @ dequantize(rows, qtype).astype(np.float64).reshape(40, -1).T
    assert np.abs(got - exact).max() > 1e-4 * np.abs(exact).max()


@pytest.mark.parametrize("qtype", TYPES)
def test_a_corrupted_block_changes_the_answer(qtype):
    rows = random_blocks(qtype, 16, 256, seed=1)
    x = torch.randn(1, 256)
    bad = rows.copy()
    data = slice(16, 144) if qtype == Q.Q4_K else slice(0, 128)
    bad[:, data] = (bad[:, data] >> 4) | (bad[:, data] << 4)  # swap nibbles
    assert not torch.allclose(mm(x, rows, qtype), mm(x, bad, qtype), rtol=1e-3)


@pytest.mark.skipif(not simd_flags(), reason="no AVX2 on this CPU")
@pytest.mark.parametrize("simd", [1, 2], ids=["avx2", "widest"])
@pytest.mark.parametrize("qtype", TYPES)
def test_simd_paths_equal_the_scalar_path(qtype, simd):
    """AVX2 and the widest path built (AVX-512 VNNI where the CPU has it: `kquant_isa`)
    against the scalar one, over 1..19 rows so every group size and remainder runs."""
    rows = random_blocks(qtype, 33, 1024, seed=2)
    x = torch.randn(19, 1024)
    x[5] *= 100  # an outlier row: its scale must not leak into its neighbours
    slow = mm(x, rows, qtype, simd=0)
    for m in (1, 3, 7, 8, 9, 16, 19):
        fast = mm(x[:m].contiguous(), rows, qtype, simd=simd)
        torch.testing.assert_close(fast, slow[:m], rtol=1e-5,
                                   atol=1e-5 * float(slow[:m].abs().max()))


def test_the_widest_path_is_the_one_the_cpu_allows():
    flags = cpu_flags()
    want = ("avx512vnni" if {"avx512bw", "avx512_vnni"} <= flags else
            "avx2" if simd_flags() else "scalar")
    assert kquant_isa() == want


def test_the_records_prefetch_is_declared_per_cpu_kind(monkeypatch, tmp_path):
    """Zen 5 and later AMD cores build the non-temporal weight prefetch; Zen 4, Intel and
    unknown CPUs the L2 one: the build flag comes from the CPU kind, not the instruction set."""
    nta = ["-DDRAFTSMAN_PREFETCH_NTA=1"]
    declared = {("AuthenticAMD", 26): nta, ("AuthenticAMD", 27): nta, ("AuthenticAMD", 25): [],
                ("GenuineIntel", 6): [], ("", 0): []}
    for kind, want in declared.items():
        monkeypatch.setattr(native, "cpu_kind", lambda kind=kind: kind)
        assert native.prefetch_flags() == want
        command = native.compile_command(tmp_path / "k.so")
        assert [arg for arg in command if "PREFETCH" in arg] == want


def test_the_cpu_kind_is_read_from_cpuinfo():
    vendor, family = cpu_kind()
    assert (vendor == "") == (family == 0)
    if vendor:
        assert vendor in Path("/proc/cpuinfo").read_text() and family > 0


def assert_batch_invariant(kernel, qtype: Q, sizes: tuple[int, ...], seed: int) -> None:
    """Every row of `kernel(x, rows, qtype)` is bit-identical computed alone, in a batch of
    each size, on 1 or 2 threads."""
    rows = random_blocks(qtype, 48, 512, seed=seed)
    x = torch.randn(max(sizes), 512)
    alone = torch.cat([kernel(x[i:i + 1].contiguous(), rows, qtype) for i in range(len(x))])
    threads = torch.get_num_threads()
    try:
        for m in sizes:
            torch.set_num_threads(1 + m % 2)
            assert torch.equal(kernel(x[:m].contiguous(), rows, qtype), alone[:m]), m
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", TYPES)
def test_every_row_is_the_same_alone_in_any_batch_and_thread_count(qtype):
    assert_batch_invariant(mm, qtype, (2, 3, 4, 5, 8, 9, 11), seed=3)


def test_bf16_in_bf16_out_is_the_float_result_rounded_once():
    rows = random_blocks(Q.Q4_K, 24, 512, seed=4)
    xb = torch.randn(3, 512).bfloat16()
    got = mm(xb, rows, Q.Q4_K)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, mm(xb.float(), rows, Q.Q4_K).bfloat16())


def test_bad_shapes_are_one_line_errors():
    rows = random_blocks(Q.Q4_K, 4, 256)
    with pytest.raises(RuntimeError, match="whole blocks"):  # half a block of weights
        mm(torch.randn(1, 128), np.ascontiguousarray(rows[:, :72]), Q.Q4_K)
    with pytest.raises(RuntimeError, match="whole blocks"):  # x wider than the weights
        mm(torch.randn(1, 512), rows, Q.Q4_K)
    with pytest.raises(RuntimeError, match="bytes"):
        mm(torch.randn(1, 256), rows, Q.Q6_K)
    with pytest.raises(RuntimeError, match="Q4_K or Q6_K"):
        mm(torch.randn(1, 256), rows, Q.Q8_0)


def test_fake_kernel_gives_the_real_shape_and_dtype():
    """torch.compile traces the operator through its registered fake: shapes, no work."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rows = torch.from_numpy(random_blocks(Q.Q4_K, 24, 512, seed=4))
    xb = torch.randn(3, 512).bfloat16()
    real = torch.ops.draftsman.kquant_mm(xb, rows, int(Q.Q4_K))
    with FakeTensorMode() as mode:
        fake = torch.ops.draftsman.kquant_mm(mode.from_tensor(xb), mode.from_tensor(rows),
                                             int(Q.Q4_K))
    assert fake.shape == real.shape and fake.dtype == real.dtype


records = pytest.mark.skipif(not kquant_records(),
                             reason="neither AVX-512 VNNI nor AVX2 on this CPU: no K-quant records")
# the records' paths by tile_rows: vectors (0: VNNI or AVX2, every CPU with records), AMX
# tiles from 16 rows (int32 vectors below), tiles for every row count (1)
NO_AMX = pytest.mark.skipif(not kquant_amx(),
                            reason="no AMX-INT8 tiles on this CPU (or not granted)")
PATHS = [pytest.param(0, id="vectors"), pytest.param(16, id="tiles", marks=NO_AMX),
         pytest.param(1, id="all-tiles", marks=NO_AMX)]


def records_mm(x: torch.Tensor, rows: np.ndarray, qtype: Q, tiles: int) -> torch.Tensor:
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(qtype))
    return torch.ops.draftsman.kquant_records_mm(x, packed, int(qtype), rows.shape[0], tiles)


@records
@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_records_compute_the_scalar_paths_sums(qtype, tiles):
    """40 weight rows (two groups of 16 and a padded one), 1..37 activation rows (one vector
    pass of up to 8 rows for Q4_K and 5 for Q6_K, several passes, the first two groups paired
    from 6 rows and the third alone, partial and several tiles of 16), an outlier row,
    against the scalar path and the reference."""
    rows = random_blocks(qtype, 40, 768, seed=5)
    x = torch.randn(37, 768)
    x[3] *= 100
    slow = mm(x, rows, qtype, simd=0)
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 37):  # one pass, then passes or tiles
        got = records_mm(x[:m].contiguous(), rows, qtype, tiles)
        torch.testing.assert_close(got, slow[:m], rtol=1e-5,
                                   atol=1e-5 * float(slow[:m].abs().max()))
    want = reference(x, rows, qtype)
    got = records_mm(x, rows, qtype, tiles).double().numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@records
@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_record_rows_are_the_same_alone_in_any_batch_and_thread_count(qtype, tiles):
    """Up to 8 (Q4_K) or 5 (Q6_K) rows take one vpdpbusd pass, more several passes, from 6
    rows two groups at once (kquant_records_pairs.h; of 3 groups, 2 paired and 1 alone) or
    the tiles (17+: blocks laid out block-major): each row's own arithmetic, so the same bits
    whichever path a row count takes. On 2 threads 17 and 21 rows (34+ blocks) are quantised
    inside the product's parallel region, half the rows by each thread: the same blocks."""
    assert_batch_invariant(lambda x, rows, q: records_mm(x, rows, q, tiles), qtype,
                           (2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 21, 40), seed=6)


@records
@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_two_threads_quantise_every_block_of_a_fresh_batch(qtype, tiles):
    """On 2 threads a call of 8 or 16 rows, 5 blocks each, has each thread quantise a share of
    every row's blocks inside the product's region: after a call on other activations (whose
    blocks the reused buffer still holds), every row is what it is alone."""
    rows = random_blocks(qtype, 128, 1280, seed=16)
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(qtype))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for m in (8, 16):
            first, x = torch.randn(m, 1280), torch.randn(m, 1280)
            torch.ops.draftsman.kquant_records_mm(first, packed, int(qtype), 128, tiles)
            got = torch.ops.draftsman.kquant_records_mm(x, packed, int(qtype), 128, tiles)
            for i in range(m):
                alone = torch.ops.draftsman.kquant_records_mm(x[i:i + 1].contiguous(), packed,
                                                              int(qtype), 128, tiles)
                assert torch.equal(got[i], alone[0]), (m, i)
    finally:
        torch.set_num_threads(threads)


@records
@pytest.mark.parametrize("qtype", TYPES)
def test_records_of_a_large_matrix_sit_on_huge_page_boundaries_and_compute_the_same(qtype):
    """Records of 2 MiB and more are allocated 2 MiB aligned (Linux may back them with huge
    pages): the same sums as the scalar path, the padded columns of the last group zero."""
    rows = random_blocks(qtype, 1000, 4096, seed=11)  # 63 groups, the last 8 columns short
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(qtype))
    assert packed.numel() >= 2 << 20 and packed.data_ptr() % (2 << 20) == 0
    x = torch.randn(9, 4096)
    got = torch.ops.draftsman.kquant_records_mm(x, packed, int(qtype), 1000, 0)
    slow = mm(x, rows, qtype, simd=0)
    torch.testing.assert_close(got, slow, rtol=1e-5, atol=1e-5 * float(slow.abs().max()))
    assert not packed[-1, 16:32].any()  # the f16 d of the 8 missing columns, first record


@records
@pytest.mark.parametrize("tiles", PATHS)
def test_a_width_ending_in_a_half_block_packs_a_half_record_of_the_same_bits(tiles):
    """896 = 3.5 blocks (the 0.5B's width, Q4_K zero-padded by the requantiser): the last
    record keeps its first two pairs of sub-blocks (1344 of 2368 bytes), and its sums are
    those of the whole record bit for bit, whatever lies past the width (it meets zero
    activations), for every row count, on vectors and tiles; a width past the half is whole."""
    rows = torch.from_numpy(random_blocks(Q.Q4_K, 40, 1024, seed=12))
    whole = torch.ops.draftsman.kquant_pack_records(rows, int(Q.Q4_K))
    half = torch.ops.draftsman.kquant_pack_records(rows, int(Q.Q4_K), 896)
    assert whole.shape[1] == 4 * 2368 and half.shape[1] == 3 * 2368 + 1344
    assert torch.equal(half[:, :3 * 2368 + 1344], whole[:, :3 * 2368 + 1344])
    x = torch.randn(37, 896)
    for m in (1, 3, 5, 8, 9, 16, 17, 37):
        xm = x[:m].contiguous()
        got = torch.ops.draftsman.kquant_records_mm(xm, half, int(Q.Q4_K), 40, tiles)
        assert torch.equal(got, torch.ops.draftsman.kquant_records_mm(xm, whole, int(Q.Q4_K), 40,
                                                                       tiles)), m
    assert torch.ops.draftsman.kquant_pack_records(rows, int(Q.Q4_K), 897).shape == whole.shape
    with pytest.raises(RuntimeError, match="rows of width 900"):
        torch.ops.draftsman.kquant_records_mm(torch.randn(2, 900), half, int(Q.Q4_K), 40, tiles)
    with pytest.raises(RuntimeError, match="width 700 does not end in the last of 4 blocks"):
        torch.ops.draftsman.kquant_pack_records(rows, int(Q.Q4_K), 700)


@records
@pytest.mark.parametrize("tiles", PATHS)
def test_half_record_rows_are_the_same_alone_in_any_batch_and_thread_count(tiles):
    """Width 384 = 1.5 records: a whole record and a half one per group, every row's bits
    its own on 1 or 2 threads."""
    half = torch.ops.draftsman.kquant_pack_records(
        torch.from_numpy(random_blocks(Q.Q4_K, 48, 512, seed=14)), int(Q.Q4_K), 384)
    assert half.shape[1] == 2368 + 1344
    assert_batch_invariant(
        lambda x, rows, q: torch.ops.draftsman.kquant_records_mm(x[:, :384].contiguous(), half,
                                                                 int(q), 48, tiles),
        Q.Q4_K, (2, 3, 5, 8, 9, 16, 17, 21, 40), seed=14)


@records
@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_a_prompts_many_rows_run_in_slices_with_each_rows_own_bits(qtype, tiles):
    """A prefill's rows whose quantised blocks outgrow half a core's L2 run in slices of
    whole tiles (`records_slice_rows`): each row is what it is alone, through the plain
    product and into a projection's columns in place, and a slice boundary falls inside."""
    rows = random_blocks(qtype, 32, 8192, seed=17)  # 32 blocks a row
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(qtype))
    m = 2 * native.records_slice_rows(32) + 37
    assert m > 128 and native.records_slice_rows(32) % 16 == 0
    x = torch.randn(m, 8192)
    alone = torch.cat([torch.ops.draftsman.kquant_records_mm(x[i:i + 1].contiguous(), packed,
                                                             int(qtype), 32, tiles)
                       for i in range(m)])
    assert torch.equal(torch.ops.draftsman.kquant_records_mm(x, packed, int(qtype), 32, tiles),
                       alone)
    out = torch.full((m, 48), 7.0)
    torch.ops.draftsman.kquant_records_mm_out(x, packed, int(qtype), 32, tiles, out, 16)
    assert torch.equal(out[:, 16:], alone) and bool((out[:, :16] == 7.0).all())


@NO_AMX
@pytest.mark.parametrize("qtype", TYPES)
def test_vector_passes_and_tiles_give_the_same_bits(qtype):
    """A CPU without AMX computes what an AMX CPU computes, bit for bit, wherever the tiles
    start (kernels/tile_rows.py chooses that per machine)."""
    rows = random_blocks(qtype, 40, 768, seed=10)
    x = torch.randn(21, 768)
    for m in (1, 3, 6, 9, 16, 21):
        xm = x[:m].contiguous()
        want = records_mm(xm, rows, qtype, 0)
        for tile_rows in (1, 4, 8, 16, 17):
            assert torch.equal(records_mm(xm, rows, qtype, tile_rows), want), (m, tile_rows)


@records
def test_a_negative_tile_row_count_is_a_one_line_error():
    rows = torch.from_numpy(random_blocks(Q.Q4_K, 16, 256, seed=1))
    packed = torch.ops.draftsman.kquant_pack_records(rows, int(Q.Q4_K))
    with pytest.raises(RuntimeError, match="tile_rows must be 0"):
        torch.ops.draftsman.kquant_records_mm(torch.randn(2, 256), packed, int(Q.Q4_K), 16, -1)


@records
@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_records_corrupted_weights_change_the_answer_and_bf16_rounds_once(qtype, tiles):
    rows = random_blocks(qtype, 16, 256, seed=8)
    bad = rows.copy()
    data = slice(16, 144) if qtype == Q.Q4_K else slice(128, 192)  # Q6_K: the high 2 bits
    bad[:, data] = (bad[:, data] >> 4) | (bad[:, data] << 4)  # swap nibbles
    for m in (2, 8):
        x = torch.randn(m, 256)
        assert not torch.allclose(records_mm(x, rows, qtype, tiles),
                                  records_mm(x, bad, qtype, tiles), rtol=1e-3)
        xb = x.bfloat16()
        assert torch.equal(records_mm(xb, rows, qtype, tiles),
                           records_mm(xb.float(), rows, qtype, tiles).bfloat16())


@records
@pytest.mark.parametrize("tiles", PATHS)
def test_records_of_no_rows_are_an_empty_product(tiles):
    """A forward of no new tokens (as a script timing a step after an empty context runs):
    an empty [0, n] result, as the per-row path gives, not a read of five rows of nothing."""
    rows = random_blocks(Q.Q4_K, 16, 256, seed=1)
    x = torch.randn(0, 256)
    assert records_mm(x, rows, Q.Q4_K, tiles).shape == mm(x, rows, Q.Q4_K).shape == (0, 16)


@records
def test_q4_models_take_the_records_where_the_cpu_has_vnni():
    from draftsman.models.quant_linear import KQuantRecordsMatrix, kquant_matrix
    from draftsman.store.gguf_blocks import BlockTensor

    for qtype in TYPES:
        rows = random_blocks(qtype, 32, 256, seed=9)
        matrix = kquant_matrix([BlockTensor("w", int(qtype), (32, 256), rows)])
        assert isinstance(matrix, KQuantRecordsMatrix) and matrix.tiles == kquant_amx()


@records
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_projection_of_q4k_and_q6k_parts_writes_each_part_in_place(dtype):
    """A fused projection whose parts are records of two block types (Q4_K q/k, Q6_K v)
    writes each part's columns into one output: the concatenation of the parts' own
    products, the bias added once; a bad output slice is refused in one line."""
    from draftsman.models.quant_linear import KQuantRecordsMatrix, QuantLinear
    from draftsman.store.gguf_blocks import BlockTensor

    a, b = random_blocks(Q.Q4_K, 40, 512, seed=12), random_blocks(Q.Q6_K, 24, 512, seed=13)
    parts = [KQuantRecordsMatrix([BlockTensor("w", int(q), (r.shape[0], 512), r)])
             for q, r in ((Q.Q4_K, a), (Q.Q6_K, b))]
    bias = torch.randn(64)
    linear = QuantLinear(parts, 512, bias, dtype)
    x = torch.randn(2, 9, 512).to(dtype)
    want = torch.cat([p(x.reshape(9 * 2, 512)) for p in parts], dim=-1).add_(bias.to(dtype))
    assert torch.equal(linear(x), want.reshape(2, 9, 64))
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        parts[1].forward_into(x.reshape(18, 512), torch.empty(18, 30, dtype=dtype), 10)


SWIGLU = pytest.mark.skipif(not records_swiglu(),
                            reason="no AVX-512 VNNI records here: silu * up runs after the product")


def assert_swiglu_is_silu_mul_of_the_product(packed: torch.Tensor, qtype: int, n: int, k: int,
                                             tiles: int) -> None:
    """kquant_records_swiglu == silu_mul(kquant_records_mm) bit for bit, float32 and bf16, for
    row counts that take single groups (runs of them), pairs, several passes and tiles (by
    block past 16), on 1 or 2 threads; and every row the same alone as in the batch."""
    ops = torch.ops.draftsman
    threads = torch.get_num_threads()
    try:
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(40, k) * 3).to(dtype)
            alone = torch.cat([ops.kquant_records_swiglu(x[i:i + 1], packed, qtype, n, tiles)
                               for i in range(len(x))])
            for m in (1, 2, 5, 6, 7, 8, 9, 16, 17, 40):
                torch.set_num_threads(1 + m % 2)
                got = ops.kquant_records_swiglu(x[:m], packed, qtype, n, tiles)
                want = ops.silu_mul(ops.kquant_records_mm(x[:m], packed, qtype, n, tiles))
                assert got.shape == (m, n // 2) and got.dtype == dtype
                assert torch.equal(got, want), (dtype, m)
                assert torch.equal(got, alone[:m]), (dtype, m)
    finally:
        torch.set_num_threads(threads)


@SWIGLU
@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_the_swiglu_epilogue_is_silu_mul_of_the_product_bit_for_bit(qtype, tiles):
    """Gate rows, then up rows: 5 groups of 16 each (runs that do not split evenly over the
    threads), each gate group paired with its own up group from 6 rows."""
    rows = random_blocks(qtype, 160, 512, seed=21)
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(qtype))
    assert_swiglu_is_silu_mul_of_the_product(packed, int(qtype), 160, 512, tiles)


@SWIGLU
def test_the_swiglu_epilogue_refuses_halves_of_part_groups_in_one_line():
    rows = random_blocks(Q.Q4_K, 48, 256, seed=22)  # halves of 24 rows: a group and a half
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(Q.Q4_K))
    with pytest.raises(RuntimeError, match="whole groups of 16 rows"):
        torch.ops.draftsman.kquant_records_swiglu(torch.randn(2, 256), packed, int(Q.Q4_K), 48, 0)


@SWIGLU
def test_a_gate_up_projection_hands_back_silu_times_up_in_one_call(monkeypatch):
    """QuantLinear.swiglu_product: one records matrix of gate then up rows, no bias, halves of
    whole groups; DRAFTSMAN_SWIGLU_EPILOGUE=0 (native.records_swiglu) turns it off."""
    from draftsman.models.quant_linear import KQuantRecordsMatrix, QuantLinear
    from draftsman.store.gguf_blocks import BlockTensor

    def linear(n: int, bias: torch.Tensor | None = None) -> QuantLinear:
        rows = random_blocks(Q.Q4_K, n, 512, seed=n)
        return QuantLinear([KQuantRecordsMatrix([BlockTensor("w", int(Q.Q4_K), (n, 512), rows)])],
                           512, bias, torch.float32)

    gate_up = linear(64)
    x = torch.randn(7, 512)
    fused = gate_up.swiglu_product(torch.float32)
    assert torch.equal(fused(x), torch.ops.draftsman.silu_mul(gate_up(x)))
    assert linear(48).swiglu_product(torch.float32) is None  # halves of 24 rows
    assert linear(64, torch.zeros(64)).swiglu_product(torch.float32) is None
    assert gate_up.swiglu_product(torch.bfloat16) is None  # not the model's dtype
    native.records_swiglu.cache_clear()
    monkeypatch.setenv("DRAFTSMAN_SWIGLU_EPILOGUE", "0")
    try:
        assert gate_up.swiglu_product(torch.float32) is None
    finally:
        monkeypatch.delenv("DRAFTSMAN_SWIGLU_EPILOGUE")
        native.records_swiglu.cache_clear()


@SWIGLU
def test_a_prompts_mlp_takes_the_swiglu_epilogue_with_the_same_bits(monkeypatch):
    """llama.SwiGLU with the fused CPU ops (a prompt's forward; steps build their own ops):
    silu(gate) * up from the gate/up projection's one call, the bits of silu_mul on its
    product, which a projection without the epilogue still takes."""
    from types import SimpleNamespace

    from draftsman.models.llama import SwiGLU
    from draftsman.models.quant_linear import KQuantRecordsMatrix, QuantLinear
    from draftsman.store.gguf_blocks import BlockTensor

    mlp = SwiGLU(SimpleNamespace(hidden_size=512, intermediate_size=32))
    rows = random_blocks(Q.Q4_K, 64, 512, seed=23)
    mlp.gate_up_proj = QuantLinear(
        [KQuantRecordsMatrix([BlockTensor("w", int(Q.Q4_K), (64, 512), rows)])], 512, None,
        torch.float32)
    mlp.fused_cpu_ops = True
    x = torch.randn(1, 9, 512)
    calls = []
    epilogue = QuantLinear.swiglu_product
    monkeypatch.setattr(QuantLinear, "swiglu_product",
                        lambda self, dtype: calls.append(dtype) or epilogue(self, dtype))
    got = mlp(x)
    assert calls == [torch.float32]
    monkeypatch.setattr(QuantLinear, "swiglu_product", lambda self, dtype: None)
    assert torch.equal(got, mlp(x))
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    torch.testing.assert_close(got, mlp.down_proj(torch.nn.functional.silu(gate) * up))
