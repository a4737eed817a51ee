"""Weight-only 4- to 8-bit Linears fed a GGUF's own blocks.

Decoding reads every weight once per forward, so fewer bytes per weight lower the floor on
latency. Three kernels, each bit-identical per row whatever the number of rows in the batch:
- K-quant, `draftsman::kquant_mm` (kernels/gguf_matmul.cpp, ours): Q4_K and Q6_K blocks
  read as the GGUF stores them, against activations quantised to int8 per 256 (as llama.cpp
  does), so the two backends compute on the same weights the same way. Taken under `q4` for
  every Q4_K / Q6_K matrix whose input width is a multiple of 256, where the kernels build;
  on AVX2 it is 1.3-1.5x faster than the int4 kernel below at 1-16 rows.
- int4, `aten._weight_int4pack_mm_for_cpu`, groups of 32 along the input: it computes
  w = (q - 8) * scale + zero with q in 0..15 and (scale, zero) in the activation dtype.
- int8, `aten._weight_int8pack_mm`: w = q * scale, one scale per output row.

Which GGUF block types map how, under `q4`:
- as they are (exact): Q4_K and Q6_K on the K-quant kernel;
- otherwise (no compiler, input width not a multiple of 256, or a Q4_0 / Q4_1 matrix)
  exactly onto int4 groups of 32 (up to rounding scale and zero to the activation dtype,
  2^-8 relative in bf16; tests/test_quant.py measures it):
    Q4_0  w = d (q - 8)         -> scale d,      zero 0
    Q4_1  w = d q + m           -> scale d,      zero 8 d + m
    Q4_K  w = d sc q - dmin m   -> scale d sc,   zero 8 d sc - dmin m  (each 32-wide
          sub-block of a 256-wide super-block, 6-bit sc and m)
- where 8-bit matrices run on records (weight_formats.int8_kernel, AVX-512 VNNI): Q8_0 as
  stored and Q5_0 exactly, as Q8_0 records (models/q8_blocks.py);
- converted onto int8 per output row (models/int8_linear.py): every other type gguf can
  dequantise (Q5_*, Q6_K, Q8_0, F16, ...), requantised symmetrically from its dequantised
  weights. int8 has more levels than these blocks, so a row loses at most half a step of
  max|row| / 127 (per-row instead of per-block scales), never bits the GGUF stored; the
  tests measure it.
- anything else: UnsupportedError naming the tensor and its type.
Under `q4-draft` (a draft's format: its guesses are checked, so it may lose precision the
GGUF kept) Q4_K matrices run as stored and every other one is requantised to Q4_K at load
(`draftsman::quantize_q4k`, kernels/gguf_convert.cpp), its width padded with zero weights
to a multiple of 256 (the 0.5B's 896-wide Q5_0 matrices: 0.56 bytes a weight instead of
int8's 1); the kernel reads the narrower activations as if zero-padded.
Under `q8` every matrix is int8 per output row. Embeddings, norms, biases and the KV cache
stay in the activation dtype; the LM head (tied to the embeddings or not) is quantised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn

from draftsman.errors import IntegrityError, InvalidArgumentError, UnsupportedError
from draftsman.kernels.block_types import GGMLType
from draftsman.kernels.native import (
    byte_records,
    kquant_amx,
    kquant_available,
    kquant_records,
    records_greedy,
    records_swiglu,
    unavailable_reason,
)
from draftsman.kernels.tile_rows import tile_rows
from draftsman.models.base import DecoderLM
from draftsman.models.block_decode import GROUP, Int4Rows, block_rows, decode_int4, dequantize_rows
from draftsman.models.draft_vocab import VocabSubsetHead
from draftsman.models.int8_linear import Int8Matrix, Int8RecordsMatrix, OneDnnInt8Matrix
from draftsman.models.llama import FUSED_LINEARS
from draftsman.models.q8_blocks import EXACT as Q8_EXACT
from draftsman.models.q8_blocks import Q8_0, q8_0_from_blocks
from draftsman.models.q8_blocks import fits as q8_fits
from draftsman.models.weight_formats import FORMATS, QUANT_KINDS, int8_kernel
from draftsman.store.gguf_blocks import BlockTensor

_ROW_MULTIPLE = 16  # the int4 packer wants a multiple of 16 output rows
_Q4_0, _Q4_1, _Q4_K, _Q6_K = GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q6_K
INT4_EXACT = {_Q4_0: "Q4_0", _Q4_1: "Q4_1", _Q4_K: "Q4_K"}
KQUANT_NATIVE = {_Q4_K: "Q4_K", _Q6_K: "Q6_K"}
KQUANT_WIDTH = 256  # weights per K-quant super-block: the input width must be a multiple


class KQuantMatrix(nn.Module):
    """Rows of Q4_K or Q6_K blocks as the GGUF stores them, for `draftsman::kquant_mm`."""

    def __init__(self, blocks: list[BlockTensor]) -> None:
        super().__init__()
        self.qtype = blocks[0].qtype
        self.register_buffer("blocks", block_rows(blocks))
        self.out_features = self.blocks.shape[0]

    def __setstate__(self, state: dict) -> None:
        # unpickled in another process (the pipelined workers): load the operator there too
        super().__setstate__(state)
        if not kquant_available():
            raise UnsupportedError(f"the K-quant kernel does not load here: "
                                   f"{unavailable_reason()}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.bfloat16):
            return self(x.float()).to(x.dtype)
        return torch.ops.draftsman.kquant_mm(x, self.blocks, self.qtype)  # in x's dtype


class KQuantRecordsMatrix(nn.Module):
    """Q4_K, Q6_K or Q8_0 rows repacked once into records of 16
    (`draftsman::kquant_records_mm`, kernels/gguf_matmul_records.cpp): K-quants with the
    same integer sums as KQuantMatrix, each record read once for every activation row, 16
    columns a vpdpbusd (AVX-512 VNNI; 8 a vpmaddubsw on AVX2 alone, Q4_K and Q6_K only) and,
    where `tiles` (AMX), 16 rows x 16 columns x 64 k (Q8_0: 32, a block) a tile multiply, so
    verifying many rows costs little more than one.
    Batch invariant like every kernel here. `width`: the matrix's own K where its blocks are
    zero-padded past it (a width ending within 128 of a block's start packs a half last
    record, kernels/kquant_records.h; None: the blocks' width)."""

    def __init__(self, blocks: list[BlockTensor], width: int | None = None) -> None:
        super().__init__()
        rows = block_rows(blocks)
        self.qtype = blocks[0].qtype
        self.register_buffer("packed", torch.ops.draftsman.kquant_pack_records(
            rows, self.qtype, -1 if width is None else width))
        self.out_features = rows.shape[0]
        self.tiles = kquant_amx()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        runs = byte_records() if self.qtype == Q8_0 else kquant_records()
        if not runs or (self.tiles and not kquant_amx()):
            raise UnsupportedError("this process cannot run the K-quant records "
                                   f"({'AMX tiles' if self.tiles else 'their vector path'} off)")

    def record_operands(self) -> tuple[torch.Tensor, int, int, int]:
        """(packed, qtype, n, tile_rows): `kquant_records_mm`'s operands after x; tile_rows
        the row count from which AMX tiles take over here (kernels/tile_rows.py), 0 none."""
        tiles_from = tile_rows(self.qtype) if self.tiles else 0
        return self.packed, self.qtype, self.out_features, tiles_from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.bfloat16):
            return self(x.float()).to(x.dtype)
        return torch.ops.draftsman.kquant_records_mm(x, *self.record_operands())

    def forward_into(self, x: torch.Tensor, out: torch.Tensor, col: int) -> None:
        """out[:, col:col + out_features] = forward(x) in place (x [M, K], out in its dtype)."""
        torch.ops.draftsman.kquant_records_mm_out(x, *self.record_operands(), out, col)


def requantized_q4k(w: torch.Tensor) -> nn.Module:
    """[N, K] float weights as Q4_K blocks on the K-quant kernel, K padded with zero weights
    to a multiple of 256 (kernels/gguf_convert.cpp). The kernel takes the K-wide activations
    as they are and quantises them as if zero-padded (no pad op per call)."""
    rows = torch.ops.draftsman.quantize_q4k(w.float().contiguous())
    width = -(-w.shape[1] // KQUANT_WIDTH) * KQUANT_WIDTH
    return kquant_matrix([BlockTensor("requantised", _Q4_K, (w.shape[0], width), rows.numpy())],
                         width=w.shape[1])


def kquant_matrix(blocks: list[BlockTensor], width: int | None = None) -> nn.Module:
    """K-quant blocks repacked into records where this CPU has AVX-512 VNNI or AVX2
    (native.kquant_records; AMX tiles too where native.kquant_amx), else as the GGUF stores
    them on the per-row path (scalar, or DRAFTSMAN_KQUANT_RECORDS=0). `width`: as
    KQuantRecordsMatrix's."""
    if kquant_records():
        return KQuantRecordsMatrix(blocks, width)
    return KQuantMatrix(blocks)


class Int4Matrix(nn.Module):
    """Rows of int4 groups of 32, packed for `_weight_int4pack_mm_for_cpu`."""

    def __init__(self, rows: Int4Rows, dtype: torch.dtype) -> None:
        super().__init__()
        n = rows.q.shape[0]
        pad = -n % _ROW_MULTIPLE  # padded rows: q = 8, scale = zero = 0, sliced off
        q = torch.cat([rows.q, rows.q.new_full((pad, rows.q.shape[1]), 8)])
        sz = torch.stack([rows.scale, rows.zero], dim=-1)
        sz = torch.cat([sz, sz.new_zeros(pad, *sz.shape[1:])])
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
        self.register_buffer("scale_zeros", sz.transpose(0, 1).contiguous().to(dtype))
        self.out_features = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scale_zeros)
        return y if y.shape[-1] == self.out_features else y[:, : self.out_features]


def q8_records() -> bool:
    """Whether 8-bit matrices run on records here (weight_formats.int8_kernel)."""
    return int8_kernel() == "records" and kquant_available() and byte_records()


def int8_matrix(w: torch.Tensor, dtype: torch.dtype) -> nn.Module:
    """The int8-per-row matrix for this CPU (weight_formats.int8_kernel)."""
    if q8_records():
        return Int8RecordsMatrix(w)
    return Int8Matrix(w, dtype) if int8_kernel() == "packed" else OneDnnInt8Matrix(w, dtype)


class QuantLinear(nn.Module):
    """A Linear whose output rows are one or more packed matrices, computed in `dtype`.

    A fused projection whose parts came in different GGUF types (Q4_K q/k, Q6_K v) holds
    one matrix per run of same-kind parts; outputs are concatenated in row order.
    """

    def __init__(self, parts: list[nn.Module], in_features: int, bias: torch.Tensor | None,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = in_features
        self.out_features = sum(p.out_features for p in parts)
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        self.dtype = dtype
        self._into = dtype in (torch.float32, torch.bfloat16) and all(
            isinstance(p, KQuantRecordsMatrix) for p in parts)

    @property
    def weight(self) -> torch.Tensor:
        """Dequantised [out, in] weights as the kernels compute them (one batch of
        in_features rows through the kernels: slow, for code that inspects weights)."""
        eye = torch.eye(self.in_features, dtype=self.dtype)
        return torch.cat([p(eye) for p in self.parts], dim=-1).T.contiguous()

    def rows_product(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """x [M, K] contiguous in `dtype` -> forward(x) as one direct kernel call (and the
        bias), the same bits without forward's shape and dtype handling; None where the parts
        are not one records matrix (K-quant or int8) in `dtype` (fused_cpu_step calls forward
        then)."""
        operands = self._record_operands(dtype)
        if operands is None:
            return None
        bias, op = self.bias, torch.ops.draftsman.kquant_records_mm
        packed, qtype, n, tiles_from = operands
        if bias is None:
            return lambda x: op(x, packed, qtype, n, tiles_from)
        return lambda x: op(x, packed, qtype, n, tiles_from).add_(bias)

    def swiglu_product(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Gate rows then up rows: x [M, K] in `dtype` -> silu_mul(forward(x)) in one kernel
        call, the same bits (`kquant_records_swiglu`); None without a direct call, with a
        bias, halves not of whole groups of 16, or no epilogue here (records_swiglu)."""
        operands = self._record_operands(dtype)
        if (operands is None or self.bias is not None or self.out_features % 32
                or not records_swiglu()):
            return None
        op = torch.ops.draftsman.kquant_records_swiglu
        packed, qtype, n, tiles_from = operands
        return lambda x: op(x, packed, qtype, n, tiles_from)

    def greedy_product(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """x [M, K] contiguous in `dtype` -> greedy_tokens(forward(x)) [M] in one kernel call
        that never stores the product (`kquant_records_greedy`; an LM head's greedy verify);
        None without a direct call, with a bias, or where the op does not run
        (records_greedy)."""
        operands = self._record_operands(dtype)
        if operands is None or self.bias is not None or not records_greedy():
            return None
        op = torch.ops.draftsman.kquant_records_greedy
        packed, qtype, n, tiles_from = operands
        return lambda x: op(x, packed, qtype, n, tiles_from)

    def record_parts(self, dtype: torch.dtype) -> list[tuple[torch.Tensor, int, int, int]] | None:
        """Each part's (packed, qtype, n, tile_rows) where forward(x) for x [M, K] in `dtype`
        is those records calls writing their columns in turn (or rows_product's one call),
        then the bias added in place; None where it is anything else."""
        one = self._record_operands(dtype)
        if one is not None:
            return [one]
        if dtype != self.dtype or not self._into:
            return None
        return [p.record_operands() for p in self.parts]

    def _record_operands(self, dtype: torch.dtype) -> tuple[torch.Tensor, int, int, int] | None:
        """The one records part's operands where x in `dtype` (the model's) goes straight in."""
        operands = getattr(self.parts[0], "record_operands", None)
        if (dtype != self.dtype or dtype not in (torch.float32, torch.bfloat16)
                or len(self.parts) != 1 or operands is None):
            return None
        return operands()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.dtype != self.dtype or not x2.is_contiguous():
            x2 = x2.to(self.dtype, memory_format=torch.contiguous_format)
        # `forward` itself, not the module call: no hooks are ever set on these parts, and a
        # draft's decode step makes ~100 such calls (the call's bookkeeping was ~4% of it)
        if len(self.parts) > 1 and self._into:  # each part writes its columns: no cat
            y, col = x2.new_empty(x2.shape[0], self.out_features), 0
            for p in self.parts:
                p.forward_into(x2, y, col)
                col += p.out_features
        else:
            ys = [p.forward(x2) for p in self.parts]
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if self.bias is not None:
            y = y.add_(self.bias)  # y is the kernels' fresh output
        return y.reshape(*shape[:-1], self.out_features)


def hf_weight_names(module_name: str, tied: bool) -> list[str]:
    """Hugging Face names of the matrices stacked in our Linear `module_name`, in row order."""
    if module_name == "lm_head":
        return ["model.embed_tokens.weight" if tied else "lm_head.weight"]
    layer, _, rest = module_name.partition(".")
    index, _, rest = rest.partition(".")
    if layer != "layers" or not index.isdigit():
        raise UnsupportedError(f"no GGUF tensor for module {module_name!r}")
    return [f"model.layers.{index}.{p}.weight" for p in FUSED_LINEARS.get(rest, (rest,))]


def selected_rows(t: BlockTensor, rows: torch.Tensor) -> BlockTensor:
    """The output rows `rows` of a GGUF matrix, blocks as stored (each row's blocks are
    its own)."""
    picked = np.ascontiguousarray(t.rows[rows.numpy()])
    return BlockTensor(t.name, t.qtype, (len(picked), t.shape[1]), picked)


def takes_native(t: BlockTensor) -> bool:
    """Whether `t` runs on the K-quant kernel as stored (see the module docstring)."""
    return (t.qtype in KQUANT_NATIVE and t.shape[1] % KQUANT_WIDTH == 0
            and kquant_available())


def _runs(sources: list[tuple[str, BlockTensor | torch.Tensor]], kind: str, dtype: torch.dtype,
          summary: Counter) -> list[nn.Module]:
    """Pack consecutive parts that take the same kernel into one matrix."""
    parts: list[nn.Module] = []
    native: list[BlockTensor] = []
    int4: list[Int4Rows] = []
    int8: list[torch.Tensor] = []
    requant: list[torch.Tensor] = []
    q8: list[BlockTensor] = []

    def flush() -> None:
        if q8:
            parts.append(KQuantRecordsMatrix(q8[:]))
            q8.clear()
        if native:
            parts.append(kquant_matrix(native[:]))
            native.clear()
        if requant:
            parts.append(requantized_q4k(torch.cat(requant)))
            requant.clear()
        if int4:
            parts.append(Int4Matrix(Int4Rows(*(torch.cat(xs) for xs in zip(
                *((r.q, r.scale, r.zero) for r in int4), strict=True))), dtype))
            int4.clear()
        if int8:
            parts.append(int8_matrix(torch.cat(int8), dtype))
            int8.clear()

    fmt = FORMATS[kind]
    requantise = fmt.requantises_to_q4k and kquant_available()
    records = q8_records()
    for _, src in sources:
        if requantise and not (isinstance(src, BlockTensor) and src.qtype == _Q4_K
                          and takes_native(src)):
            name = src.type_name if isinstance(src, BlockTensor) else "float"
            summary[f"{name} -> Q4_K kernel (requantised)"] += 1
            if native or int4 or int8 or q8:
                flush()
            requant.append(src.float() if isinstance(src, torch.Tensor) else dequantize_rows(src))
        elif (records and fmt.keeps_4bit and isinstance(src, BlockTensor)
              and src.qtype in Q8_EXACT and q8_fits(src.shape[1])):
            how = "as stored" if src.qtype == Q8_0 else "exact"
            summary[f"{src.type_name} -> Q8_0 records ({how})"] += 1
            if native or int4 or int8 or requant:
                flush()
            q8.append(q8_0_from_blocks(src))
        elif isinstance(src, torch.Tensor):
            summary["float -> int8 per row"] += 1
            if native or int4 or requant or q8:
                flush()
            int8.append(src.float())
        elif fmt.keeps_4bit and takes_native(src):
            summary[f"{src.type_name} -> {src.type_name} kernel (as stored)"] += 1
            if int4 or int8 or requant or q8 or (native and native[0].qtype != src.qtype):
                flush()
            native.append(src)
        elif fmt.keeps_4bit and src.qtype in INT4_EXACT:
            summary[f"{src.type_name} -> int4 (exact)"] += 1
            if int8 or native or requant or q8:
                flush()
            int4.append(decode_int4(src))
        else:
            summary[f"{src.type_name} -> int8 per row (requantised)"] += 1
            if int4 or native or requant or q8:
                flush()
            int8.append(dequantize_rows(src))
    flush()
    return parts


def quantize_model(model: DecoderLM, kind: str,
                   blocks: Mapping[str, BlockTensor] | None = None,
                   head_rows: torch.Tensor | None = None) -> DecoderLM:
    """Replace every Linear (LM head included) by a QuantLinear, in place.

    With `blocks` (a GGUF's matrices by Hugging Face name) the weights come from them;
    without, `q8` quantises the model's own weights and `q4` is refused (it exists to run
    a GGUF's own 4-bit blocks). The activation dtype stays the model's. Sets
    `model.quant_summary`: how many matrices took which path. On the CPU, where the
    kernels build, the small ops between the matrices take them too (`use_fused_cpu_ops`).
    `head_rows`: the LM head keeps only these vocabulary rows (models/draft_vocab.py).
    """
    if kind not in QUANT_KINDS:
        raise InvalidArgumentError(f"unknown quantisation {kind!r}; choose "
                                   + ", ".join(QUANT_KINDS))
    if FORMATS[kind].needs_gguf and blocks is None:
        raise InvalidArgumentError(
            f"--dtype {kind} runs a GGUF's own blocks: pass a catalogue name or a .gguf file")
    dtype, tied = model.dtype, model.config.tie_word_embeddings
    summary: Counter = Counter()
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, linear in linears:
        narrow = head_rows is not None and name == "lm_head"
        if blocks is None:
            sources: list[tuple[str, BlockTensor | torch.Tensor]] = [
                (name, linear.weight[head_rows] if narrow else linear.weight)]
        else:
            sources = []
            for hf in hf_weight_names(name, tied):
                if hf not in blocks:
                    raise IntegrityError(f"the GGUF has no tensor {hf} (for {name})")
                sources.append((hf, selected_rows(blocks[hf], head_rows) if narrow else blocks[hf]))
            rows = sum(b.shape[0] for _, b in sources)
            want = len(head_rows) if narrow else linear.out_features
            if (rows, linear.in_features) != (want, sources[0][1].shape[1]):
                raise IntegrityError(
                    f"{name}: GGUF shape ({rows}, {sources[0][1].shape[1]}) does not match "
                    f"the model's ({want}, {linear.in_features})")
        bias = linear.bias if not narrow or linear.bias is None else linear.bias[head_rows]
        quant: nn.Module = QuantLinear(_runs(sources, kind, dtype, summary), linear.in_features,
                                       bias, dtype)
        if narrow:
            quant = VocabSubsetHead(quant, head_rows, linear.out_features)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, quant)
    if kquant_available() and model.device.type == "cpu":
        model.use_fused_cpu_ops()
    model.quant_summary = dict(summary)
    return model
