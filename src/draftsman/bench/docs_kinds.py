"""The docs tables that are not one of a bench run's own tables (see `docs_tables`).

- `sets_table`: a bench run per set: one line per contestant, one column for all prompts and
  one per set (as the per-set table names and orders them), each cell its speedup over the
  baseline on that set's prompts, or its tokens/s;
- `curves_table`: forward-cost profiles (`draftsman profile`, a run's verify_cost.json: JSON
  with `latency` = {rows: seconds}), one line per file, named by its path in the folder;
- `kernels_table`: `scripts/kernel_curves.py` rows (kernel, rows, ms, v), one line per kernel.

Curve cells read "ms (v)" with v(k) = time(k rows) / time(1 row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftsman.bench.metrics import Row, summarise
from draftsman.bench.set_report import set_groups
from draftsman.bench.tables import Table, num, times

SET_VALUES = {"speedup": lambda s: times(s.speedup),
              "tok/s": lambda s: num(s.tokens_per_second)}


class DocsTableError(ValueError):
    """A marker names a folder, a file or an option that does not exist."""


def sets_table(rows: list[Row], baseline: str, value: str = "speedup") -> Table:
    if value not in SET_VALUES:
        raise DocsTableError(f"value={value}: choose {' or '.join(SET_VALUES)}")
    cell = SET_VALUES[value]
    groups = set_groups(rows)
    per_set = [{s.label: s for s in summarise(g.rows, baseline)} for g in groups]
    lines = []
    for s in summarise(rows, baseline):
        lines.append([s.label, cell(s)] + [cell(p[s.label]) if s.label in p else "—"
                                           for p in per_set])
    return Table(f"Per set ({value})", ["method", "all", *(g.name for g in groups)], lines)


def _cell(ms: float, one: float | None) -> str:
    return f"{ms:.1f} ({ms / one:.2f})" if one else f"{ms:.1f}"


def _curve_table(title: str, first: str, curves: dict[str, dict[int, float]]) -> Table:
    lengths = sorted({k for curve in curves.values() for k in curve})
    lines = [[name, *(_cell(curve[k], curve.get(1)) if k in curve else "—" for k in lengths)]
             for name, curve in curves.items()]
    return Table(title, [first, *(f"k={k}" for k in lengths)], lines)


def curves_table(folder: Path, files: list[str]) -> Table:
    """ms per forward over k new rows, one line per profile file (its path, less .json)."""
    curves: dict[str, dict[int, float]] = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise DocsTableError(f"{folder.name}: no file {name}")
        latency: dict[str, Any] = json.loads(path.read_text()).get("latency") or {}
        if not latency:
            raise DocsTableError(f"{folder.name}/{name}: no latency curve")
        curves[name.removesuffix(".json")] = {int(k): 1000 * float(v)
                                              for k, v in latency.items()}
    return _curve_table("Forward cost", "profile", curves)


def kernels_table(rows: list[Row]) -> Table:
    """ms per sweep at k rows, one line per kernel in first-measured order."""
    curves: dict[str, dict[int, float]] = {}
    for r in rows:
        curves.setdefault(r["kernel"], {})[int(r["rows"])] = float(r["ms"])
    return _curve_table("Kernel curves", "kernel", curves)
