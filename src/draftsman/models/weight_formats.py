"""The one place that knows the weight formats: their names, where their weights come from,
which kernel each GGUF block type takes, and how activations meet integer weights.

A dtype name is either a float dtype (bf16, fp32, fp16: dense weights, PyTorch's kernels) or
a quantised format:
- `q4`: a GGUF's own 4-bit blocks, K-quants on our kernel (kernels/gguf_matmul.cpp), the rest
  exactly on PyTorch's int4 kernel or requantised to int8 per output row; needs a GGUF.
- `q4-draft`: `q4` for drafts: Q4_K matrices as stored and every other one requantised to
  Q4_K at load, so a draft whose GGUF keeps wider blocks (the 0.5B's 896-wide Q5_0) reads
  about half the bytes. Lossy beyond the GGUF, which costs a draft some acceptance but never
  exactness (the target checks every guess); a q4 engine loads its drafts this way
  (`companion_dtype`).
- `q8`: every matrix in 8 bits, from a GGUF's blocks or the folder's weights, on the kernel
  `int8_kernel()` picks for the CPU:
  - "records" (AVX-512 VNNI, with or without AMX): int8 per output row in records of 16
    rows on draftsman's kernel (models/int8_linear.py), activations in int8 per 256. 24
    distinct 8960 x 1536 matrices, 2 threads, an Emerald Rapids core: 1 / 8 / 16 rows
    14.5 / 17.3 / 23.5 ms against oneDNN's 22.1 / 28.2 / 34.3 (bench-results/kernels-avx512);
    the same core with AMX, where oneDNN runs tiles: 16.7 / 20.9 / 27.9 against 51.1 / 53.3
    / 54.6, the whole 1.5B q8 84.6 / 109.1 / 146.3 ms against 209 / 224 / 242
    (bench-results/host-amx-h200; oneDNN overtakes the records past about 32 rows);
  - "onednn" (AVX-VNNI without AVX-512): int8 per output row on oneDNN's int8 GEMM,
    activations in int8 per row;
  - "packed" (no int8 dot product): int8 per output row on PyTorch's weight-only int8 kernel
    with float activations, which measured 2x faster than oneDNN's int8 path on an AVX2
    EPYC (56 vs 114 ms for 24 8960x1536 matrices).
  Under `q4`, the GGUF's matrices that are neither Q4_K/Q6_K nor 4-bit take the same kernel
  (on records, Q8_0 and Q5_0 blocks as the GGUF stores their weights: models/q8_blocks.py).

The loader, the engine and the CLI ask this module; adding a format touches it and the
matrix classes in quant_linear.py only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsman.errors import DraftsmanError
from draftsman.hardware import cpu_flags


@dataclass(frozen=True)
class WeightFormat:
    """A quantised weight format: what it is called, what it needs, what it runs on."""

    name: str
    needs_gguf: bool  # its weights exist only as a GGUF's blocks
    summary: str
    keeps_4bit: bool = False  # 4-bit blocks run as stored (K-quant kernel, exact int4)
    requantises_to_q4k: bool = False  # every other matrix becomes Q4_K blocks at load


FORMATS = {
    "q4": WeightFormat("q4", True, "a GGUF's own 4-bit blocks (K-quants on draftsman's kernel)",
                       keeps_4bit=True),
    "q4-draft": WeightFormat("q4-draft", True, "q4 with every matrix on Q4_K blocks (the "
                                                "wider ones requantised; for drafts)",
                             keeps_4bit=True, requantises_to_q4k=True),
    "q8": WeightFormat("q8", False, "int8 per output row (oneDNN int8 GEMM where the CPU has "
                                    "VNNI/AMX, else PyTorch's weight-only int8)"),
}
QUANT_KINDS = tuple(FORMATS)
# "int8" is the older name of q8, kept so recorded commands still run
QUANT_ALIASES = {"q4": "q4", "q4-draft": "q4-draft", "q8": "q8", "int8": "q8"}
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
          "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
DTYPE_CHOICES = ["bf16", "fp32", "q4", "q4-draft", "q8", "int8"]


def parse_dtype(name: str | torch.dtype) -> torch.dtype | str:
    """A torch dtype, or the name of a quantised format ("q4", "q4-draft", "q8")."""
    if isinstance(name, torch.dtype):
        return name
    if name in QUANT_ALIASES:
        return QUANT_ALIASES[name]
    try:
        return DTYPES[name]
    except KeyError:
        raise DraftsmanError(f"unknown dtype {name!r}; choose bf16, fp32, q4, q4-draft or q8"
                             ) from None


def companion_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    """The format an engine loads its drafts in: q4-draft under q4 (measured on an AMX Xeon,
    the 0.5B draft's one-row forward 40 -> 26 ms beside the 1.5B's 68), else the engine's."""
    return "q4-draft" if dtype == "q4" else dtype


def is_quantised(dtype: str | torch.dtype) -> bool:
    return str(dtype) in QUANT_ALIASES


def gguf_source(spec: str, dtype: str | torch.dtype) -> Path | None:
    """The GGUF whose blocks a quantised load packs: a catalogue model's or the .gguf
    given; None for float dtypes and for folders (q8 then quantises the folder's weights)."""
    from draftsman.store.catalogue import CATALOGUE
    from draftsman.store.resolve import resolve_gguf

    if not is_quantised(dtype):
        return None
    if spec.strip() in CATALOGUE or spec.strip().lower().endswith(".gguf"):
        return resolve_gguf(spec)
    return None


# ---- int8 x int8 on the CPU ----

INT8_KERNELS = ("records", "onednn", "packed")
INT8_KERNEL_NAMES = {"records": "draftsman's records of 16 rows (AVX-512 VNNI)",
                     "onednn": "oneDNN's int8 GEMM", "packed": "PyTorch's weight-only int8"}
_NO_SATURATION = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def has_int8_dot() -> bool:
    """Whether the CPU has an int8 dot product that accumulates u8 x s8 straight into int32
    (VNNI `vpdpbusd`, AMX `tdpbusd`). Without one, int8 GEMMs pair products in int16
    (`vpmaddubsw`), which saturates for 8-bit activations against 8-bit weights."""
    return bool(cpu_flags() & _NO_SATURATION)


def int8_kernel() -> str:
    """Which kernel 8-bit matrices run on (see the module docstring): "records" where
    draftsman's records kernel runs (AVX-512 VNNI, AMX or not), "onednn" where the CPU has
    another int8 dot product, "packed" elsewhere. DRAFTSMAN_INT8_KERNEL=records|onednn|packed
    overrides it (tests, profiles); "records" where it cannot run is refused in one line."""
    from draftsman.kernels.native import byte_records

    forced = os.environ.get("DRAFTSMAN_INT8_KERNEL", "").strip()
    if forced:
        if forced not in INT8_KERNELS:
            raise DraftsmanError(f"DRAFTSMAN_INT8_KERNEL={forced!r}; choose records, onednn "
                                 "or packed")
        if forced == "records" and not byte_records():
            raise DraftsmanError("DRAFTSMAN_INT8_KERNEL=records: this CPU or build has no "
                                 "AVX-512 VNNI records kernel")
        return forced
    if byte_records():
        return "records"
    return "onednn" if has_int8_dot() else "packed"


def activation_bits() -> int:
    """Bits of the per-row activation quantisation on oneDNN's int8 path: 8 with an int8
    dot product; 7 without, so that 2 x 127 x 127 fits the int16 pair sums (with 8 bits,
    2 x 255 x 127 does not, and oneDNN's AVX2 path silently saturates)."""
    return 8 if has_int8_dot() else 7
