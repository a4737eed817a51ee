"""A GGUF's weight matrices as they are stored: quantised blocks, one row of bytes per output row.

The quantised torch path (models/quant_linear.py) packs these blocks for PyTorch's CPU kernels
instead of reading the dequantised bf16 copy. Rows come in Hugging Face order: llama's Q/K
rotary row permutation is undone on the raw rows (each output row's blocks are contiguous
and independent, so reordering rows of bytes reorders rows of weights exactly).

Loading reads the header with a small scanner of our own rather than `gguf.GGUFReader`, which
parses every vocabulary string into numpy views (~9 s for a 150k-token vocabulary), and reads
each matrix's bytes when it is asked for, with one `read` into a fresh array: nothing is
memory-mapped, so the bytes are held once (by the packed Linear) and never twice (mapped file
pages count towards the process's resident memory as well).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftsman.errors import DraftsmanError, UnsupportedError
from draftsman.store.convert import ARCHITECTURES, hf_tensor_name
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


# GGUF value types (gguf.GGUFValueType): fixed-size scalars by struct format; 8 string, 9 array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes lie in the file; `dims` as GGUF lists them (row length first)."""

    name: str
    qtype: int
    dims: tuple[int, ...]
    offset: int  # from the start of the file
    n_bytes: int


class _Scanner:
    """Little-endian reads from a buffer; arrays are skipped, never materialised."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item])
            else:  # strings (the vocabulary, merges) or nested arrays: walk past each
                for _ in range(count):
                    self.value(item)
            return None
        raise ValueError(f"unknown GGUF value type {vtype}")


def scan_gguf(path: Path) -> tuple[dict[str, Any], list[TensorEntry]]:
    """(scalar metadata by key, tensors in file order) of the GGUF at `path`; arrays are
    left out of the metadata. ValueError / OSError on a file that is not a GGUF."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        s = _Scanner(buf)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("bad magic")
        s.pos = 4
        version = s.unpack("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = s.unpack("<Q"), s.unpack("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = s.string()
            meta[key] = s.value(s.unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = s.string()
            dims = tuple(s.unpack("<Q") for _ in range(s.unpack("<I")))
            infos.append((name, s.unpack("<I"), dims, s.unpack("<Q")))
        align = int(meta.get("general.alignment") or _DEFAULT_ALIGNMENT)
        start = s.pos + (-s.pos % align)
        size = len(buf)
    entries = []
    for name, qtype, dims, offset in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name} has unknown GGML type {qtype}") from None
        n_bytes = int(np.prod(dims, dtype=np.int64)) // block * type_size
        if start + offset + n_bytes > size:
            raise ValueError(f"tensor {name} runs past the end of the file (truncated?)")
        entries.append(TensorEntry(name, qtype, dims, start + offset, n_bytes))
    return meta, entries


class GGUFBlocks(Mapping[str, BlockTensor]):
    """A GGUF's 2-D tensors by Hugging Face name; each access reads that tensor's bytes from
    the file into a new array (ask once per tensor: nothing is cached)."""

    def __init__(self, path: Path, entries: dict[str, TensorEntry],
                 rotary_heads: dict[str, int]) -> None:
        self.path, self._entries, self._rotary_heads = path, entries, rotary_heads

    def __getitem__(self, name: str) -> BlockTensor:
        e = self._entries[name]
        shape = (int(e.dims[1]), int(e.dims[0]))  # GGUF lists the row length first
        try:
            rows = np.fromfile(self.path, dtype=np.uint8, count=e.n_bytes, offset=e.offset)
        except OSError as exc:
            raise DraftsmanError(f"{self.path}: cannot read tensor {e.name} ({exc})") from None
        rows = rows.reshape(shape[0], -1)
        for key, n in self._rotary_heads.items():
            if key in e.name:
                rows = np.ascontiguousarray(unpermute_rotary(rows, n))
        return BlockTensor(name, e.qtype, shape, rows)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def qtypes(self) -> dict[str, int]:
        """Each tensor's GGML type by Hugging Face name (no tensor data read)."""
        return {name: e.qtype for name, e in self._entries.items()}


def read_gguf_blocks(path: Path | str) -> GGUFBlocks:
    """Every 2-D tensor of the GGUF at `path`, keyed by its Hugging Face name (read lazily)."""
    path = Path(path)
    try:
        meta, tensors = scan_gguf(path)
    except (ValueError, OSError, struct.error) as exc:
        raise DraftsmanError(f"{path}: not a readable GGUF file ({exc})") from None
    architecture = meta.get("general.architecture")
    arch = ARCHITECTURES.get(architecture)
    if arch is None:
        raise UnsupportedError(
            f"{path.name}: GGUF architecture {architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})")
    n_heads = int(meta[f"{architecture}.attention.head_count"])
    heads = {".attn_q.": n_heads,
             ".attn_k.": int(meta.get(f"{architecture}.attention.head_count_kv", n_heads))}
    entries = {hf_tensor_name(t.name): t for t in tensors if len(t.dims) == 2}
    return GGUFBlocks(path, entries, heads if arch.rotary_permuted else {})
