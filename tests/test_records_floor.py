"""The floor under a forward's records products (records_floor.py): the dot-product probe runs
every product it counts, the floor is the slower of stream and pipes per matrix, summed, and
it is given only where every quantised product runs on the records' AVX-512 VNNI vectors."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_pair

from draftsman import profiling, records_floor
from draftsman.kernels.block_types import I8_ROW, GGMLType
from draftsman.kernels.native import kquant_available, records_isa
from draftsman.models.quant_linear import QuantLinear, q8_records, quantize_model
from draftsman.records_floor import RecordsWork, floor_curve, forward_floor, records_work

needs_kernels = pytest.mark.skipif(not kquant_available(),
                                   reason="the native kernels do not load here")


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
def test_the_dot_probe_runs_every_product_it_counts(threads):
    """Each step adds 4 (bytes 1 x 1, four a lane) to all 16 lanes of 16 chains: the lanes'
    sum says every counted instruction ran (none folded or dropped by the compiler)."""
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        count, lanes = torch.ops.draftsman.dot_products(1000).tolist()
        if count:  # an AVX-512 VNNI build
            assert count == threads * 1000 * 16
            assert lanes == threads * 16 * 16 * 4 * 1000
            assert profiling.dot_rate(rounds=1000, repeats=1) > 0
        else:
            assert lanes == 0 and profiling.dot_rate(rounds=1000, repeats=1) is None
        with pytest.raises(RuntimeError, match="rounds must be >= 1"):
            torch.ops.draftsman.dot_products(0)
    finally:
        torch.set_num_threads(was)


@pytest.mark.skipif(records_isa() != "avx512vnni", reason="no AVX-512 VNNI records here")
def test_the_dot_probe_measures_where_the_records_run_on_avx512_vnni():
    assert torch.ops.draftsman.dot_products(10)[0] == torch.get_num_threads() * 10 * 16


def test_the_floor_is_each_matrix_at_its_slower_limit_summed():
    # 1 MB at 10 GB/s: 100 us; 100 Q4_K record-rows a row at 1 G pipe operations a second:
    # 8 us a row, so memory-bound to 12 rows, then the pipes
    q4 = RecordsWork(GGMLType.Q4_K, 1_000_000, 100.0)
    assert forward_floor([q4], 1, 10.0, 1e9) == pytest.approx(100e-6)
    assert forward_floor([q4], 12, 10.0, 1e9) == pytest.approx(100e-6)
    assert forward_floor([q4], 16, 10.0, 1e9) == pytest.approx(128e-6)
    # a second matrix adds its own limit (not the max of the sums): int8 rows, 66 operations
    i8 = RecordsWork(I8_ROW, 100_000, 1000.0)
    assert forward_floor([q4, i8], 1, 10.0, 1e9) == pytest.approx(100e-6 + 66e-6)
    assert forward_floor([q4, i8], 16, 10.0, 1e9) == pytest.approx(128e-6 + 16 * 66e-6)
    # every counted type costs at least its 64 vpdpbusd a record-row
    assert min(records_floor.PIPE_OPS.values()) >= 64


@pytest.mark.skipif(not q8_records() or records_isa() != "avx512vnni",
                    reason="8-bit matrices do not run on AVX-512 VNNI records here")
def test_a_q8_model_counts_every_records_product(monkeypatch):
    # the counting itself, on an AMX CPU too (whose tiles take the floor off: checked below)
    monkeypatch.setattr(records_floor, "kquant_amx", lambda: False)
    _, model = tiny_pair("qwen2")
    quantize_model(model, "q8")
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    work = records_work(model)
    assert work is not None and len(work) == sum(len(m.parts) for m in linears)
    assert {w.qtype for w in work} == {I8_ROW}
    assert sum(w.bytes for w in work) == sum(p.packed.numel() for m in linears for p in m.parts)
    assert sum(w.record_rows for w in work) == pytest.approx(
        sum(m.out_features / 16 * m.in_features / 256 for m in linears))
    curve = floor_curve(model, [1, 4, 16], 50.0, 1e10)
    assert curve[1] <= curve[4] <= curve[16] and curve[1] > 0
    # no floor where it would not be one
    with monkeypatch.context() as m:
        m.setattr(records_floor, "PIPE_OPS", {GGMLType.Q4_K: 80})  # a type it does not count
        assert records_work(model) is None
    with monkeypatch.context() as m:
        m.setattr(records_floor, "kquant_amx", lambda: True)  # tiles beat the vector pipes
        assert records_work(model) is None
    with monkeypatch.context() as m:
        m.setattr(records_floor, "records_isa", lambda: "avx2")
        assert records_work(model) is None
    with monkeypatch.context() as m:  # a part on another kernel
        m.setattr(QuantLinear, "record_parts", lambda self, dtype: None)
        assert records_work(model) is None
    assert floor_curve(model, [1], None, 1e10) is None
    assert floor_curve(model, [1], 50.0, None) is None


def test_no_floor_without_records_products():
    _, model = tiny_pair("llama")  # float weights: no QuantLinear at all
    assert records_work(model) is None
    assert floor_curve(model, [1, 2], 50.0, 1e10) is None
    assert floor_curve(object(), [1], 50.0, 1e10) is None  # not a torch model (llama.cpp)
