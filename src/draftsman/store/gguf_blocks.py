"""A GGUF's weight matrices as they are stored: quantised blocks, one row of bytes per output row.

The quantised torch path (models/quant_linear.py) packs these blocks for PyTorch's CPU kernels
instead of reading the dequantised bf16 copy. Rows come in Hugging Face order: llama's Q/K
rotary row permutation is undone on the raw rows (each output row's blocks are contiguous
and independent, so reordering rows of bytes reorders rows of weights exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftsman.errors import DraftsmanError, UnsupportedError
from draftsman.store.convert import ARCHITECTURES, GGUFMetadata, hf_tensor_name
from draftsman.store.dequant import unpermute_rotary


@dataclass(frozen=True)
class BlockTensor:
    """One 2-D GGUF tensor: `rows` [out_features, bytes per row] (uint8) in HF row order.

    `qtype` is the GGML type number; `shape` is (out_features, in_features).
    """

    name: str
    qtype: int
    shape: tuple[int, int]
    rows: np.ndarray

    @property
    def type_name(self) -> str:
        from gguf.constants import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type {self.qtype}"


def read_gguf_blocks(path: Path | str) -> dict[str, BlockTensor]:
    """Every 2-D tensor of the GGUF at `path`, keyed by its Hugging Face name (memory-mapped)."""
    from gguf import GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise DraftsmanError(f"{path}: not a readable GGUF file ({exc})") from None
    meta = GGUFMetadata(reader)
    arch = ARCHITECTURES.get(meta.architecture)
    if arch is None:
        raise UnsupportedError(
            f"{path.name}: GGUF architecture {meta.architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})")
    n_heads = int(meta.arch("attention.head_count"))
    heads = {".attn_q.": n_heads,
             ".attn_k.": int(meta.arch("attention.head_count_kv", n_heads))}
    out: dict[str, BlockTensor] = {}
    for t in reader.tensors:
        if len(t.shape) != 2:
            continue
        shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists the row length first
        rows = np.asarray(t.data).view(np.uint8).reshape(shape[0], -1)
        if arch.rotary_permuted:
            for key, n in heads.items():
                if key in t.name:
                    rows = unpermute_rotary(rows, n)
        name = hf_tensor_name(t.name)
        out[name] = BlockTensor(name, int(t.tensor_type), shape, rows)
    return out
