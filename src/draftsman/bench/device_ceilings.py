"""What a device can do at most, measured: copy bandwidth, matrix rate, and the floor they put
under one decode step.

A decode step of batch 1 must read every weight it multiplies and the whole KV cache once, so
    floor(token) = (weight bytes read per token + KV bytes at the context) / copy bandwidth,
with the bandwidth measured here (a device-to-device copy, bytes read plus bytes written), not
taken from a datasheet. The input embedding is a row lookup, not read whole, so it is left
out unless it is also the output head (tied).

    python -m draftsman.bench.device_ceilings --device cuda --out ceilings.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftsman.device import resolve_device


@dataclass(frozen=True)
class Ceilings:
    device: str  # "NVIDIA H200" or the CPU's model name
    copy_gbps: float  # device-to-device copy, (bytes read + bytes written) / s / 1e9
    bf16_tflops: float  # n x n x n bf16 matrix product, 2 n^3 / s / 1e12
    copy_bytes: int
    matmul_n: int


def _timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `fn()` after one warm-up, waiting for the device each time."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(device: torch.device, copy_bytes: int = 2 << 30, matmul_n: int = 8192,
            repeats: int = 10) -> Ceilings:
    buffers = [torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device)
               for _ in range(2)]
    copy_s = _timed(lambda: buffers[1].copy_(buffers[0]), device, repeats)
    buffers.clear()
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    mm_s = _timed(lambda: a @ b, device, repeats)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        from draftsman.hardware import cpu_model

        name = cpu_model()
    return Ceilings(name, 2 * copy_bytes / copy_s / 1e9, 2 * matmul_n ** 3 / mm_s / 1e12,
                    copy_bytes, matmul_n)


def safetensors_sizes(folder: str | Path) -> dict[str, int]:
    """Tensor name -> bytes, read from the headers of a folder's *.safetensors files."""
    sizes: dict[str, int] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, meta in header.items():
            if name != "__metadata__":
                start, end = meta["data_offsets"]
                sizes[name] = end - start
    return sizes


def bytes_per_token(folder: str | Path, context: int, kv_bytes: int = 2) -> int:
    """Bytes one batch-1 decode step must read at `context` cached tokens: every weight but a
    separate input embedding, plus keys and values of every layer (`kv_bytes` per value)."""
    sizes = safetensors_sizes(folder)
    config = json.loads((Path(folder) / "config.json").read_text())
    tied = config.get("tie_word_embeddings", False) or not any("lm_head" in n for n in sizes)
    weights = sum(b for n, b in sizes.items() if tied or "embed_tokens" not in n)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv = 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim
    return weights + kv * context * kv_bytes


def floor_seconds(folder: str | Path, context: int, copy_gbps: float) -> float:
    """The bandwidth floor of one decode step (see the module docstring)."""
    return bytes_per_token(folder, context) / (copy_gbps * 1e9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--copy-mib", type=int, default=2048, help="bytes copied per timing (MiB)")
    p.add_argument("--matmul-n", type=int, default=8192)
    p.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    ceilings = measure(resolve_device(args.device), args.copy_mib << 20, args.matmul_n)
    text = json.dumps(asdict(ceilings), indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text, file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
