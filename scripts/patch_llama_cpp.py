#!/usr/bin/env python3
"""Mend the vendored llama.cpp source before scripts/build_llama_cpp.sh builds it: ggml's AMX
matmul (ggml-cpu/amx/mmq.cpp, `ggml_tile_config_init`), two mends.

- **Stores first.** It fills a tile-configuration record on the stack and hands its address to
  `_tile_loadconfig`. GCC 12 does not count that intrinsic as reading the record, so it drops
  the stores of the rows and bytes per row: `ldtilecfg` then loads zeros and stack garbage,
  which the CPU refuses with a general-protection fault, a SIGSEGV in
  `ggml_backend_amx_mul_mat` on the first multi-row matmul (a prompt, a verify). That is
  ggml-org/llama.cpp#20824 on our Xeon. An empty asm statement that takes the record's
  address and clobbers memory makes the stores happen first.
- **Configured on every call.** It loaded the configuration once per thread and trusted it
  ever after. Our own AMX kernels run in the same OpenMP threads, configure the tiles their
  way and release them, so ggml's next tile instruction met unconfigured tiles: SIGILL
  (a bench with the llama.cpp backend and torch contestants in one process). Loading the
  64-byte record costs nothing beside a matmul.

(bench-results/llama-cpp-amx-kernels: the disassembly, and the fault's record.)

    scripts/patch_llama_cpp.py SRC     # SRC: the llama.cpp source tree; idempotent
"""

from __future__ import annotations

import sys
from pathlib import Path

MMQ = Path("ggml/src/ggml-cpu/amx/mmq.cpp")
LAST_STORE = "    tc.rows[7] = 16;  tc.colsb[7] = 64;\n\n"
LOAD = "    _tile_loadconfig(&tc);\n"
BARRIER = '    __asm__ __volatile__("" : : "r"(&tc) : "memory");  // draftsman: stores first\n'
ONCE = ("    static thread_local bool done = false;\n\n"
        "    if (done) {\n        return;\n    }\n\n")
EVERY_CALL = ("    // draftsman: configured on every call: other kernels in these\n"
              "    // threads configure and release the tiles between ggml's calls\n")
# (what, the text as vendored, the text mended): once mended, the vendored text is gone
MENDS = (
    ("stores first", LAST_STORE + LOAD, LAST_STORE + BARRIER + LOAD),
    ("configured on every call", ONCE, EVERY_CALL),
    ("configured on every call", LOAD + "    done = true;\n}\n", LOAD + "}\n"),
)


def mend(src: Path) -> bool:
    """Applies each mend not yet applied; True where the file changed. SystemExit where the
    source is not the one these mends were written for."""
    path = src / MMQ
    text = original = path.read_text()
    for what, vendored, mended in MENDS:
        if text.count(vendored) == 1:
            text = text.replace(vendored, mended)
        elif vendored in text or mended not in text:
            raise SystemExit(f"patch_llama_cpp: {path} does not hold {what!r}'s text once: "
                             "a llama.cpp these mends were not written for")
    if text != original:
        path.write_text(text)
    return text != original


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: patch_llama_cpp.py SRC (the llama.cpp source tree)")
    changed = mend(Path(sys.argv[1]))
    print(f"patch_llama_cpp: AMX tile configuration {'mended' if changed else 'already mended'}")


if __name__ == "__main__":
    main()
