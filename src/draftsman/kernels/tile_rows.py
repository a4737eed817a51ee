"""From how many activation rows the records kernel takes AMX tiles here: measured, not assumed.

On an AMX CPU a Q4_K, Q6_K, Q8_0 or int8-row product of few rows runs on `vpdpbusd` vectors and of
many rows on AMX-INT8 tiles; both add the same integers in int32, so the bits do not depend on
which ran and the choice is speed alone. Where the two cross differs between CPUs: tiles were
faster from 6 rows on one Xeon, from 16 on an Emerald Rapids core (bench-results/
host-amx-h200), from 8-12 on another Xeon (bench-results/profile-amx). So on first use, per
kernel build, CPU and thread count, one matrix of each kind is timed on both paths at the
row counts in ROWS, in turns, and the smallest count from which the tiles are never slower
is kept in `$DRAFTSMAN_HOME/kernels/tile-rows-<build>-t<threads>.json` (about 0.1 s a
kind, once). `DRAFTSMAN_KQUANT_TILE_ROWS=N` sets it by hand (no measurement).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from draftsman.errors import InvalidArgumentError
from draftsman.kernels.block_types import I8_ROW, GGMLType
from draftsman.kernels.native import build_key, kquant_amx
from draftsman.kernels.random_blocks import random_block_rows
from draftsman.store.home import draftsman_home

ENV = "DRAFTSMAN_KQUANT_TILE_ROWS"
TILED = (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, I8_ROW)
ROWS = (4, 6, 8, 10, 12, 14, 16)  # the tiles always take more than 16 rows
SHAPE = (8960, 1536)  # the 1.5B's ffn_down width and gate width: ~8-11 MiB, past L2
REPEATS = 9


@dataclass(frozen=True)
class Crossing:
    """Seconds per product on each path by row count, and the row count chosen from them."""

    qtype: int
    vectors: dict[int, float]
    tiles: dict[int, float]

    @property
    def tile_rows(self) -> int:
        """The smallest measured row count from which the tiles are no slower at every larger
        one; one past the largest (tiles only past a whole tile) where they never are."""
        chosen = max(ROWS) + 1
        for rows in sorted(self.vectors, reverse=True):
            if self.tiles[rows] > self.vectors[rows]:
                break
            chosen = rows
        return chosen


def measure(qtype: int, repeats: int = REPEATS, seed: int = 0) -> Crossing:
    """Times one SHAPE matrix of `qtype` on vectors and on tiles at every count in ROWS, the
    two paths alternating call by call so that a slow spell falls on both; keeps the fastest
    of `repeats` calls (the least disturbed)."""
    n, k = SHAPE
    rng = np.random.default_rng(seed)
    if qtype == I8_ROW:
        q = torch.from_numpy(rng.integers(-127, 128, (n, k), dtype=np.int8))
        packed = torch.ops.draftsman.int8_pack_records(q, torch.full((n,), 1e-3))
    else:
        rows = torch.from_numpy(random_block_rows(qtype, n, k, rng))
        packed = torch.ops.draftsman.kquant_pack_records(rows, qtype)
    x = torch.randn(max(ROWS), k, generator=torch.Generator().manual_seed(seed))
    op = torch.ops.draftsman.kquant_records_mm
    best: dict[str, dict[int, float]] = {"vectors": {}, "tiles": {}}
    for m in ROWS:
        xm = x[:m].contiguous()
        paths = {"vectors": 0, "tiles": 1}  # tile_rows 1: every row count on tiles
        for tile_rows in paths.values():
            op(xm, packed, qtype, n, tile_rows)  # warm: the matrix in cache, the tiles set
        for name, tile_rows in [*paths.items()] * repeats:
            start = time.perf_counter()
            op(xm, packed, qtype, n, tile_rows)
            took = time.perf_counter() - start
            best[name][m] = min(took, best[name].get(m, took))
    return Crossing(qtype, best["vectors"], best["tiles"])


def cache_path(threads: int) -> Path:
    return draftsman_home() / "kernels" / f"tile-rows-{build_key()}-t{threads}.json"


def _from_env() -> int | None:
    value = os.environ.get(ENV)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InvalidArgumentError(f"{ENV} must be a row count of 1 or more, not {value!r}")
    return int(value)


@cache
def _measured(threads: int) -> dict[int, int]:
    path = cache_path(threads)
    try:
        saved = json.loads(path.read_text())
        return {int(q): int(saved[str(q)]["tile_rows"]) for q in TILED}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet (or unreadable): measure
    crossings = [measure(q) for q in TILED]
    record = {str(c.qtype): {"tile_rows": c.tile_rows, "vectors_s": c.vectors,
                             "tiles_s": c.tiles} for c in crossings}
    record["measured"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)  # atomic: a concurrent process reads a whole file or none
    return {c.qtype: c.tile_rows for c in crossings}


def tile_rows(qtype: int) -> int:
    """`kquant_records_mm`'s tile_rows for a `qtype` matrix in this process: 0 where the
    tiles do not run (no AMX, DRAFTSMAN_KQUANT_AMX=0), else the row count from
    which they take over (the environment's, or this machine's measured crossing)."""
    if qtype not in TILED or not kquant_amx():
        return 0
    by_hand = _from_env()
    if by_hand is not None:
        return by_hand
    return _measured(torch.get_num_threads())[qtype]


def describe() -> str:
    """One line for `--verbose`: where the tiles start and who decided."""
    if not kquant_amx():
        return "no AMX tiles"
    by_hand = _from_env()
    if by_hand is not None:
        return f"AMX-INT8 tiles from {by_hand} rows ({ENV})"
    q4, q6, q8, i8 = (tile_rows(q) for q in TILED)
    return (f"AMX-INT8 tiles from {q4} rows (Q4_K), {q6} (Q6_K), {q8} (Q8_0) and {i8} "
            f"(int8 rows), measured on this machine ({cache_path(torch.get_num_threads()).name})")
