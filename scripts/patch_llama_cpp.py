#!/usr/bin/env python3
"""Mend the vendored llama.cpp source before scripts/build_llama_cpp.sh builds it.

ggml's AMX matmul (ggml-cpu/amx/mmq.cpp, `ggml_tile_config_init`) fills a tile-configuration
record on the stack and hands its address to `_tile_loadconfig`. GCC 12 does not count that
intrinsic as reading the record, so it drops the stores of the rows and bytes per row: the
`ldtilecfg` then loads a record of zeros and stack garbage, which the CPU refuses with a
general-protection fault, a SIGSEGV in `ggml_backend_amx_mul_mat` on the first multi-row
matmul (a prompt, a verify). That is ggml-org/llama.cpp#20824 on our Xeon
(bench-results/llama-cpp-amx-kernels: the disassembly, and the fault's record). An empty asm
statement that takes the record's address and clobbers memory makes the stores happen first.

    scripts/patch_llama_cpp.py SRC     # SRC: the llama.cpp source tree; idempotent
"""

from __future__ import annotations

import sys
from pathlib import Path

MMQ = Path("ggml/src/ggml-cpu/amx/mmq.cpp")
LOAD = "    _tile_loadconfig(&tc);\n"
BARRIER = '    __asm__ __volatile__("" : : "r"(&tc) : "memory");  // draftsman: stores first\n'


def mend(src: Path) -> bool:
    """Puts the barrier before the load once; True where the file changed. SystemExit where
    the source is not the one this mend was written for."""
    path = src / MMQ
    text = path.read_text()
    if BARRIER + LOAD in text:
        return False
    if text.count(LOAD) != 1:
        raise SystemExit(f"patch_llama_cpp: {path} does not hold one `_tile_loadconfig(&tc);`: "
                         "a llama.cpp this mend was not written for")
    path.write_text(text.replace(LOAD, BARRIER + LOAD))
    return True


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: patch_llama_cpp.py SRC (the llama.cpp source tree)")
    changed = mend(Path(sys.argv[1]))
    print(f"patch_llama_cpp: AMX tile configuration {'mended' if changed else 'already mended'}")


if __name__ == "__main__":
    main()
