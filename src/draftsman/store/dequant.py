"""One GGUF tensor -> its bytes in the output safetensors file.

Each job reads its tensor straight from the GGUF file (memory-mapped), dequantises it with
`gguf.quants.dequantize`, undoes llama's rotary row permutation when asked, casts to the
output dtype and writes the bytes at the job's offset. Jobs touch disjoint byte ranges and
carry plain data only, so they could run in any order or in other processes (measured on
this 2-core machine: a process pool was not faster, the work is memory-bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OUTPUT_DTYPES = ("bfloat16", "float16", "float32")
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class TensorJob:
    """Where one tensor comes from and where its converted bytes go.

    `shape` is in PyTorch order (slowest dimension first). `unpermute_heads` > 0 asks to undo
    llama.cpp's Q/K permutation with that many heads; 0 leaves rows as stored.
    """

    gguf_path: str
    data_offset: int
    n_bytes: int
    qtype: int
    shape: tuple[int, ...]
    unpermute_heads: int
    out_path: str
    out_offset: int
    out_dtype: str

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (HF rotate-half layout -> interleaved pairs).

    Within each head, rows [first half | second half] become pairs (h0, s0, h1, s1, ...).
    The converter never calls it: tests use it to check `unpermute_rotary` inverts it.
    """
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `permute_rotary`: interleaved pairs back to HF's rotate-half row layout."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def float32_to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 values, rounding to nearest even.

    Bit-identical to `torch.Tensor.to(torch.bfloat16)` for every non-NaN value (NaN stays
    NaN, as the canonical 0x7FC0), so a folder converted here matches what transformers
    produces from the same GGUF.
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (u >> 16) & 1  # ties go to the even neighbour
    rounded = u + lsb
    rounded += 0x7FFF
    rounded >>= 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan.reshape(out.shape)] = 0x7FC0
    return out


def dequantize_job(job: TensorJob) -> np.ndarray:
    """The tensor of `job` as float32 in PyTorch layout, rotary permutation undone."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize, quant_shape_to_byte_shape

    qtype = GGMLQuantizationType(job.qtype)
    raw = np.memmap(job.gguf_path, dtype=np.uint8, mode="r", offset=job.data_offset,
                    shape=(job.n_bytes,))
    if qtype == GGMLQuantizationType.F32:
        data = raw.view(np.float32).reshape(job.shape)
    elif qtype == GGMLQuantizationType.F16:
        data = raw.view(np.float16).reshape(job.shape)
    else:
        data = raw.reshape(quant_shape_to_byte_shape(job.shape, qtype))
    w = np.asarray(dequantize(data, qtype), dtype=np.float32).reshape(job.shape)
    if job.unpermute_heads:
        w = unpermute_rotary(w, job.unpermute_heads)
    return w


def run_job(job: TensorJob) -> int:
    """Convert one tensor and write it in place; returns its element count (for progress)."""
    w = dequantize_job(job)
    if job.out_dtype == "bfloat16":
        out = float32_to_bfloat16_bits(w)
    elif job.out_dtype == "float16":
        out = w.astype(np.float16)
    else:
        out = np.ascontiguousarray(w, dtype=np.float32)
    payload = memoryview(np.ascontiguousarray(out)).cast("B")
    if len(payload) != job.n_elements * ITEMSIZE[job.out_dtype]:
        raise RuntimeError(f"tensor at GGUF offset {job.data_offset}: wrong converted size")
    with open(job.out_path, "r+b") as handle:
        handle.seek(job.out_offset)
        handle.write(payload)
    return job.n_elements
