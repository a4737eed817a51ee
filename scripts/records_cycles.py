#!/usr/bin/env python3
"""Cycles a record and a record-row of the K-quant records kernel's vector paths, called
directly (scripts/records_cycles.cpp): the kernel's own cost per 256 k x 16 weight rows x
activation row, from L2 and from memory, without PyTorch's dispatch around it.

A record-row is 64 `vpdpbusd` (16 columns x 256 k, 4 k an instruction) plus the row's share
of the unpacking, the sub-block scales and the block's finish. With the instruction's
throughput (two a cycle on the AVX-512 ports of an Emerald Rapids core) that puts a floor
under a verify forward which the weights' bytes do not: this script measures how near the
kernel runs to it. Counts are reference cycles (the TSC, printed in GHz), the best of
`--repeats` sweeps: noise on a shared machine only adds cycles.

    scripts/records_cycles.py                               # Q4_K and Q6_K, L2 and memory
    scripts/records_cycles.py --qtypes q4_k --rows 8,16 --threads 1
    scripts/records_cycles.py --k 8960 --rows 12,16          # a down projection's width
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from draftsman.kernels import native

QTYPES = {"q4_k": 12, "q6_k": 14, "i8_row": 1000}  # i8_row: --dtype q8's int8 rows
# A group's records: K / 256 (K = 1536 by default, the 1.5B's hidden size). From L2: groups
# of ~0.9 MB of Q4_K in all (64 at K = 1536) shared out over the threads, passed 64 times a
# sweep; from memory: ~470 MB of groups (past the last-level caches seen here, 260 MB at
# most) passed once. Groups ending a pair's run matter to the prefetch (a long K has few).
L2_RECORDS, MEMORY_RECORDS = 64 * 6, 33_000 * 6


def places(blocks: int) -> dict[str, tuple[int, int]]:
    """"L2" / "memory" -> (groups, passes) for groups of `blocks` records."""
    return {"L2": (max(2, L2_RECORDS // blocks), 64), "memory": (MEMORY_RECORDS // blocks, 1)}


def build(out: Path) -> None:
    """The harness, compiled as the kernels are (native.compile_command's flags)."""
    here = Path(__file__).resolve().parent
    cmd = [arg for arg in native.compile_command(out) if arg not in ("-shared", "-fPIC")]
    sources = {str(src) for src in native.SOURCES}
    cmd = [arg for arg in cmd if arg not in sources]
    lib_dirs = [arg[2:] for arg in cmd if arg.startswith("-L")]
    at = cmd.index("-o")  # the harness before the libraries it links against
    cmd[at:at] = [f"-I{native.SOURCES[0].parent}", str(here / "records_cycles.cpp")]
    cmd += [f"-Wl,-rpath,{d}" for d in lib_dirs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"building the harness failed: {done.stderr.strip()[-2000:]}")


def run(exe: Path, qtype: int, blocks: int, place: str, threads: int, repeats: int, unit: int,
        rows: list[int]) -> tuple[dict[int, tuple[float, float]], float]:
    """rows -> (cycles a record, cycles a record-row), and the TSC's GHz."""
    groups, passes = places(blocks)[place]
    out = subprocess.run([str(exe), str(qtype), str(blocks), str(groups), str(passes),
                          str(threads), str(repeats), str(unit), *map(str, rows)],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    cycles = {int(r): (float(rec), float(row))
              for r, rec, row in (line.split() for line in out if line and line[0].isdigit())}
    ghz = next(float(line.split()[1]) for line in out if line.startswith("tsc_ghz"))
    return cycles, ghz


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--qtypes", default="q4_k,q6_k", help="comma separated: q4_k, q6_k, i8_row")
    p.add_argument("--rows", default="1,4,8,16", help="activation rows, 1..16, comma separated")
    p.add_argument("--k", type=int, default=1536,
                   help="the weights' width, a multiple of 256 (default 1536; 8960: a down "
                        "projection's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20, help="sweeps a row count (best kept)")
    p.add_argument("--single", action="store_true",
                   help="groups one at a time (the one-group paths) instead of as the kernel "
                        "hands them out (two at a time where it pairs them)")
    a = p.parse_args()
    if native.records_isa() != "avx512vnni":
        print("this CPU or build has no AVX-512 VNNI: no K-quant records", file=sys.stderr)
        return 2
    qtypes = [q.strip() for q in a.qtypes.split(",")]
    if unknown := [q for q in qtypes if q not in QTYPES]:
        print(f"unknown --qtypes {', '.join(unknown)}: choose from {', '.join(QTYPES)}",
              file=sys.stderr)
        return 2
    rows = [int(r) for r in a.rows.split(",")]
    if any(not 1 <= r <= 16 for r in rows):
        print("--rows must be 1..16", file=sys.stderr)
        return 2
    if a.k < 256 or a.k % 256:
        print("--k must be a positive multiple of 256", file=sys.stderr)
        return 2
    blocks = a.k // 256
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "records_cycles"
        build(exe)
        how = "one group at a time" if a.single else "groups as the kernel hands them out"
        print(f"{a.threads} threads, K = {a.k}, {how}; reference cycles (best of "
              f"{a.repeats}) a record / a record-row")
        print("| block type | weights from | " + " | ".join(f"{r} rows" for r in rows) + " |")
        print("|---|---|" + "---|" * len(rows))
        for q in qtypes:
            for where in places(blocks):
                repeats = a.repeats if where == "L2" else max(3, a.repeats // 4)
                cycles, ghz = run(exe, QTYPES[q], blocks, where, a.threads, repeats,
                                  1 if a.single else 2, rows)
                cells = " | ".join(f"{cycles[r][0]:.0f} / {cycles[r][1]:.1f}" for r in rows)
                print(f"| {q.upper()} | {where} | {cells} |")
        peak = subprocess.run([str(exe), "peak"], capture_output=True, text=True,
                              check=True).stdout.split()[1]
        print(f"TSC {ghz:.2f} GHz; vpdpbusd (zmm) a reference cycle, independent: {peak} "
              f"(64 a record-row: {64 / float(peak):.1f} cycles at the least)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
