"""Build and load the C++ kernels of this folder as PyTorch operators (`torch.ops.draftsman`).

The kernels are compiled once per source, PyTorch version and instruction set into
`~/.cache/draftsman/kernels/` with the machine's C++ compiler (`make setup` does it ahead;
otherwise the first use does, in about 10 s). They run inside PyTorch's own thread pool
(`at::parallel_for`), so `torch.set_num_threads` governs them like any other operator.

Where no compiler is found or the build fails, `kquant_available()` is False with the reason
in `unavailable_reason()`, and callers fall back to PyTorch's packed kernels.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import torch

from draftsman.hardware import cpu_kind
from draftsman.store.home import draftsman_home

# one library: the K-quant matrix products (vector paths, AMX tiles) and the small ops around
# them in a decode step; HEADERS are part of the build's key
SOURCES = tuple(Path(__file__).with_name(name) for name in
                ("gguf_matmul.cpp", "gguf_matmul_records.cpp", "gguf_pack_records.cpp",
                 "gguf_convert.cpp", "decode_ops.cpp", "attention_ops.cpp",
                 "attention_amx.cpp", "attention_bf16.cpp", "decoder_layers.cpp",
                 "stream_probe.cpp", "dot_probe.cpp", "greedy_rows.cpp"))
HEADERS = tuple(Path(__file__).with_name(name) for name in
                ("kquant_blocks.h", "kquant_records.h", "amx_tiles.h", "kquant_records_parts.h",
                 "simd_math.h", "attention_amx.h", "attention_bf16.h", "bf16_key_pairs.h",
                 "q8_records.h", "byte_tiles.h", "check_message.h", "kquant_records_avx2.h",
                 "kquant_records_pairs.h", "env_switch.h", "greedy_lanes.h"))
_reason: list[str] = []


def simd_flags() -> list[str]:
    """Where the CPU has AVX2 (the kernels' fast path): tuned for this very CPU (10% faster
    than plain -mavx2 on an EPYC; the build is keyed by the CPU's flags). None elsewhere."""
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return ["-march=native", "-mavx2", "-mfma", "-mf16c"]
    return []


# AMD's family 26 (0x1A): Zen 5 cores, L1d 48 KiB
ZEN5_FAMILY = 26


def prefetch_flags() -> list[str]:
    """How the records kernels prefetch weights, declared per CPU kind from measurements
    (kquant_records_parts.h: RecordPrefetch, which gives the figures). Zen 5 and later AMD
    cores, where it was measured: non-temporal prefetches into L1, 4 records ahead. Every
    other CPU keeps prefetches into L2 8 records ahead, as tuned on an AMX Xeon; Zen 4's
    32 KiB L1d would hold the 4 records ahead beside a paired Q6_K block's unpacked weights
    only just."""
    vendor, family = cpu_kind()
    zen5_or_later = vendor == "AuthenticAMD" and family >= ZEN5_FAMILY
    return ["-DDRAFTSMAN_PREFETCH_NTA=1"] if zen5_or_later else []


def cpu_signature() -> str:
    """The CPU's model and feature flags: a -march=native build runs only where they match."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keep = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(keep)))


@cache
def build_key() -> str:
    """12 hex digits naming this build: sources, PyTorch version, instruction set and CPU.
    Forward-cost profiles record it, so a changed kernel is measured again."""
    key = hashlib.sha256(b"".join(src.read_bytes() for src in (*SOURCES, *HEADERS)))
    key.update(torch.__version__.encode())
    key.update(" ".join(simd_flags() + prefetch_flags()).encode())
    key.update(cpu_signature().encode())
    return key.hexdigest()[:12]


def library_path() -> Path:
    return draftsman_home() / "kernels" / f"gguf_matmul-{build_key()}.so"


def compile_command(out: Path) -> list[str]:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or c++) on PATH")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # -ffp-contract=off: the fused ops reproduce PyTorch's separate roundings (a * b + c * d
    # as two products and a sum), which contracting into an fma would change
    return [
        compiler, "-O3", "-std=c++20", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp",
        *simd_flags(), *prefetch_flags(),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        *(str(src) for src in SOURCES), "-o", str(out),
        *(f"-L{p}" for p in cpp_extension.library_paths()),
        "-lc10", "-ltorch_cpu", "-ltorch",
    ]


def build(verbose: bool = False) -> Path:
    """Compile the kernels unless this exact build exists; return the library's path."""
    out = library_path()
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = compile_command(tmp)
    if verbose:
        print(f"building {', '.join(s.name for s in SOURCES)} -> {out}", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"compiling the kernels failed: {last}")
    tmp.replace(out)  # atomic: a concurrent build never loads half a file
    return out


@cache
def _load() -> bool:
    try:
        torch.ops.load_library(str(build()))
    except (RuntimeError, OSError) as exc:
        _reason.append(str(exc).splitlines()[0])
        return False
    # shapes without running the kernel, for torch.compile's tracing
    torch.library.register_fake("draftsman::kquant_mm")(_kquant_mm_fake)
    torch.library.register_fake("draftsman::kquant_records_mm")(
        lambda x, packed, qtype, n, tile_rows: x.new_empty((x.shape[0], n)))
    torch.library.register_fake("draftsman::kquant_records_swiglu")(
        lambda x, packed, qtype, n, tile_rows: x.new_empty((x.shape[0], n // 2)))
    torch.library.register_fake("draftsman::rms_norm")(lambda x, weight, eps: x.new_empty(x.shape))
    torch.library.register_fake("draftsman::add_rms_norm")(
        lambda x, delta, weight, eps: (x.new_empty(x.shape), x.new_empty(x.shape)))
    torch.library.register_fake("draftsman::silu_mul")(
        lambda gu: gu.new_empty((gu.shape[0], gu.shape[1] // 2)))
    torch.library.register_fake("draftsman::short_attention")(_short_attention_fake)
    torch.library.register_fake("draftsman::rope_attention")(_rope_attention_fake)
    torch.library.register_fake("draftsman::decoder_layers")(
        lambda rows, *_: rows.new_empty(rows.shape))
    torch.library.register_fake("draftsman::greedy_rows")(
        lambda logits: logits.new_empty(logits.shape[:-1], dtype=torch.long))
    return True


def _kquant_mm_fake(x: torch.Tensor, w: torch.Tensor, qtype: int,
                    simd: int = 2) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


def _short_attention_fake(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    b, h, t, d = q.shape
    return q.new_empty((b, t, h * d))


def _rope_attention_fake(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                         bias: torch.Tensor | None, scale: float, n_heads: int,
                         n_kv: int) -> torch.Tensor:
    b, t, _ = qkv.shape
    return qkv.new_empty((b, t, n_heads * k_cache.shape[-1]))


def kquant_available() -> bool:
    """Whether torch.ops.draftsman.kquant_mm is loaded (building it on first call)."""
    if os.environ.get("DRAFTSMAN_NO_NATIVE"):
        if not _reason:
            _reason.append("DRAFTSMAN_NO_NATIVE is set")
        return False
    return _load()


def loaded() -> bool:
    """Whether this process has loaded the kernels already (never builds them): for callers
    that use an op where it is there and do without it otherwise."""
    return _load.cache_info().currsize > 0 and _load()


def greedy_rows_ready() -> bool:
    """Whether `draftsman::greedy_rows` is loaded in this process (never builds it) with its
    AVX-512 pass (`kernels.greedy.greedy_tokens` takes it then; elsewhere PyTorch's max(-1))."""
    return loaded() and _greedy_rows_vectors()


@cache
def _greedy_rows_vectors() -> bool:
    import ctypes

    return bool(ctypes.CDLL(str(library_path())).draftsman_greedy_rows_vectors())


def unavailable_reason() -> str:
    return _reason[0] if _reason else ""


def simd_built() -> bool:
    """Whether the loaded kernels use a SIMD path (False: the portable scalar one)."""
    return bool(simd_flags()) and kquant_available()


@cache
def kquant_records() -> bool:
    """Whether Q4_K and Q6_K matrices run repacked into records of 16 weight rows here
    (`draftsman::kquant_records_mm`): the build has AVX-512 VNNI (vpdpbusd, AMX tiles besides
    where `kquant_amx`) or AVX2 alone (vpmaddubsw, kernels/kquant_records_avx2.h); either way
    every activation row meets a record's columns in vector lanes.
    DRAFTSMAN_KQUANT_RECORDS=0 turns it off (to measure the per-row paths on the same CPU)."""
    if os.environ.get("DRAFTSMAN_KQUANT_RECORDS", "1") == "0" or not kquant_available():
        return False
    import ctypes

    return bool(ctypes.CDLL(str(library_path())).draftsman_kquant_records())


@cache
def records_isa() -> str:
    """The vectors K-quant records run on here: "avx512vnni" (vpdpbusd, 16 columns an
    instruction; AMX tiles besides where `kquant_amx`), "avx2" (vpmaddubsw, 8 columns), or
    "" where they do not run (`kquant_records` False)."""
    if not kquant_records():
        return ""
    import ctypes

    lib = ctypes.CDLL(str(library_path()))
    lib.draftsman_records_isa.restype = ctypes.c_char_p
    return lib.draftsman_records_isa().decode()


@cache
def records_swiglu() -> bool:
    """Whether a gate/up records matrix hands back silu(gate) * up in the same call
    (`draftsman::kquant_records_swiglu`): each unit of work is a gate group and its up group,
    and their sums go through silu_mul's own code, so the bits are silu_mul's on the plain
    product, without the product stored and read again. The AVX-512 VNNI records only.
    DRAFTSMAN_SWIGLU_EPILOGUE=0 turns it off (silu_mul after the product, on the same CPU)."""
    return records_isa() == "avx512vnni" and os.environ.get("DRAFTSMAN_SWIGLU_EPILOGUE", "1") != "0"


@cache
def records_greedy() -> bool:
    """Whether a records matrix hands back each row's greedy token of its product instead of
    the product (`draftsman::kquant_records_greedy`: each thread picks over its columns as
    it makes them, so a greedy verify's logits are never stored nor read again; the tokens
    greedy_rows would read). The AVX-512 VNNI records only. DRAFTSMAN_GREEDY_HEAD=0 turns it
    off (the product, then greedy_rows)."""
    return records_isa() == "avx512vnni" and os.environ.get("DRAFTSMAN_GREEDY_HEAD", "1") != "0"


@cache
def layers_in_one_call() -> bool:
    """Whether a fused CPU step runs its decoder layers in one call
    (`draftsman::decoder_layers`: the same ops in the same order, without a Python frame
    per op). DRAFTSMAN_LAYERS_CALL=0 keeps the loop in Python (the same bits)."""
    return kquant_available() and os.environ.get("DRAFTSMAN_LAYERS_CALL", "1") != "0"


@cache
def byte_records() -> bool:
    """Whether 8-bit matrices (Q8_0 blocks, int8 rows) run on records here: K-quant records
    on AVX-512 VNNI (the AVX2 records take Q4_K and Q6_K only). DRAFTSMAN_KQUANT_RECORDS=0
    turns them off with the rest."""
    if not kquant_records():
        return False
    import ctypes

    return bool(ctypes.CDLL(str(library_path())).draftsman_byte_records())


def records_slice_rows(blocks: int) -> int:
    """The most activation rows one slice of a many-row records product takes, for rows of
    `blocks` 256-wide blocks: the rows whose quantised blocks fit half a core's L2 (at least 64).
    A call of more than 128 rows and more rows than this runs in slices (kernels/
    gguf_matmul_records.cpp, kquant_records_into); each row's bits are the same."""
    import ctypes

    fn = ctypes.CDLL(str(library_path())).draftsman_records_slice_rows
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int64
    return int(fn(blocks))


@cache
def kquant_amx() -> bool:
    """Whether K-quant records take AMX-INT8 tiles from 16 rows here: the build has them (an AMX
    CPU) and Linux granted the tile state. DRAFTSMAN_KQUANT_AMX=0 turns the tiles off (the
    records' vector path, as on an AVX-512 VNNI CPU without AMX); DRAFTSMAN_KQUANT_RECORDS=0
    the records too."""
    if os.environ.get("DRAFTSMAN_KQUANT_AMX", "1") == "0" or not kquant_records():
        return False
    import ctypes

    return bool(ctypes.CDLL(str(library_path())).draftsman_kquant_amx())


@cache
def attention_amx() -> bool:
    """Whether short attention of bf16 rows (`draftsman::short_attention`, `rope_attention`)
    runs on AMX-BF16 tiles here: an AMX CPU whose Linux granted the tile state.
    DRAFTSMAN_ATTENTION_AMX=0 turns it off (the AVX-512 path on the same CPU)."""
    if not kquant_available():
        return False
    import ctypes

    return bool(ctypes.CDLL(str(library_path())).draftsman_attention_amx())


@cache
def attention_bf16_pairs() -> bool:
    """Whether short attention of bf16 rows scores them on AVX512-BF16 pairs (`vdpbf16ps`,
    kernels/attention_bf16.cpp) where no AMX tiles take the rows: a CPU with AVX512-BF16 (Zen 4
    and later EPYCs, Cooper Lake and later Xeons); the softmax and the weighted values stay
    fp32. DRAFTSMAN_ATTENTION_BF16=0 turns it off (fp32 scores on the same CPU)."""
    if not kquant_available() or attention_amx():
        return False
    import ctypes

    return bool(ctypes.CDLL(str(library_path())).draftsman_attention_bf16_pairs())


@cache
def kquant_isa() -> str:
    """The path the K-quant kernel takes on this CPU: "avx512vnni" (64 weights an
    instruction, 8 activation rows per unpacked block), "avx2" (32, 4 rows), "scalar", or
    "" where the kernels do not load."""
    if not kquant_available():
        return ""
    import ctypes

    lib = ctypes.CDLL(str(library_path()))
    lib.draftsman_kquant_isa.restype = ctypes.c_char_p
    return lib.draftsman_kquant_isa().decode()


if __name__ == "__main__":
    print(build(verbose=True))
