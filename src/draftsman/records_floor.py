"""The least time a forward's records products can take on this host now, and so the least
verify cost v(n) = L(n) / L(1) its kernels could reach: the prediction beside a measured curve.

A product of n activation rows on the records' AVX-512 VNNI vectors can run no faster than
its weights stream from memory, nor faster than its instructions issue on the two pipes that
`vpdpbusd` (and the float multiply-adds of its folds) run on:

    floor_i(n) = max(bytes_i / stream, n * record_rows_i * PIPE_OPS[type_i] / dot_rate)
    floor(n)   = sum_i floor_i(n)        (the kernel's calls run one after another)

with record_rows_i = (out / 16) * (in / 256), a record-row being 16 columns x 256 k x one
row: 64 `vpdpbusd` plus its share of the folds. The stream and the dot rate are measured on
this host now (profiling.memory_stream_gbs and profiling.dot_rate): a shared host moves both. The
floor leaves out the step's other work (norms, attention, the calls' forks), so every
measured L(n) lies above it, and a measured v(n) can fall below floor(n) / L(1) only where
L(1) does.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from draftsman.kernels.block_types import I8_ROW, GGMLType
from draftsman.kernels.native import kquant_amx, records_isa
from draftsman.models.quant_linear import QuantLinear

# Operations on vpdpbusd's two pipes per record-row on the AVX-512 VNNI records
# (bench-results/profile-zen5-swiglu-epilogue: FMA, multiplies and vpdpwssd share those pipes;
# conversions, masks, shifts and adds run beside them):
#   Q4_K: 64 vpdpbusd, 8 sub-block folds, 4 vpdpwssd (the mins), 2 multiplies, 2 FMAs;
#   Q6_K: 64, 16 folds, 2 (kquant_records.h);
#   Q8_0: 64, 8 block folds, 1 FMA (q8_records.h, byte_block_vectors);
#   int8 rows: 64, 1 multiply, 1 FMA (q8_records.h, i8_many_rows).
PIPE_OPS = {GGMLType.Q4_K: 80, GGMLType.Q6_K: 82, GGMLType.Q8_0: 73, I8_ROW: 66}


@dataclass(frozen=True)
class RecordsWork:
    """One records matrix of a forward: its block type, bytes and record-rows per row."""

    qtype: int
    bytes: int
    record_rows: float


def records_work(model: nn.Module) -> list[RecordsWork] | None:
    """Every quantised product of `model` as records work, or None where one of them does not
    run on the records' AVX-512 VNNI vectors (another kernel, AMX tiles, an AVX2 build, a
    block type the floor does not count): its floor would not be one."""
    if records_isa() != "avx512vnni" or kquant_amx():
        return None
    work: list[RecordsWork] = []
    for module in model.modules():
        if not isinstance(module, QuantLinear):
            continue
        parts = module.record_parts(module.dtype)
        if parts is None:
            return None
        for packed, qtype, n, _ in parts:
            if qtype not in PIPE_OPS:
                return None
            work.append(RecordsWork(int(qtype), packed.numel() * packed.element_size(),
                                    n / 16 * module.in_features / 256))
    return work or None


def forward_floor(work: list[RecordsWork], rows: int, stream_gbs: float, dots: float) -> float:
    """Seconds the records products of one forward over `rows` rows need at least, each at
    the slower of its weight stream and its pipe operations (module docstring)."""
    return sum(max(w.bytes / (stream_gbs * 1e9), rows * w.record_rows * PIPE_OPS[w.qtype] / dots)
               for w in work)


def floor_curve(model: nn.Module, lengths: list[int], stream_gbs: float | None,
                dots: float | None) -> dict[int, float] | None:
    """{n: floor seconds} for each length, or None where there is no floor to give (no
    readings, a model that is not torch's, products off the records' vectors)."""
    if not stream_gbs or not dots or not isinstance(model, nn.Module):
        return None
    work = records_work(model)
    if work is None:
        return None
    return {n: forward_floor(work, n, stream_gbs, dots) for n in lengths}
