"""The docs tables that are not one of a bench run's own tables (see `docs_tables`).

- `sets_table`: a bench run per set: one line per contestant, one column for all prompts and
  one per set (as the per-set table names and orders them), each cell its speedup over the
  baseline on that set's prompts, or its tokens/s;
- `curves_table`: forward-cost profiles (`draftsman profile`, a run's verify_cost.json: JSON
  with `latency` = {rows: seconds}), one line per file, named by its path in the folder;
- `kernels_table`: `scripts/kernel_curves.py` rows (kernel, rows, ms, v), one line per kernel;
- `prompt_table`, `match_rate_table`, `latency_table`: the JSON a `draftsman analyze` run
  writes (parallel-prompt, match-rate, pipelined-latency), as the docs show it;
- `gpu_table`: `scripts/gpu_check.py` work folders, one column per run.

Curve cells read "ms (v)" with v(k) = time(k rows) / time(1 row).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from draftsman.bench.metrics import Row, summarise
from draftsman.bench.results import ResultsFile
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


def _curve_table(title: str, first: str, curves: dict[str, dict[int, float]],
                 bases: dict[str, float] | None = None) -> Table:
    """A line a curve, each cell "ms (ratio)" against its curve's k=1, or its entry in `bases`."""
    lengths = sorted({k for curve in curves.values() for k in curve})
    lines = []
    for name, curve in curves.items():
        one = (bases or {}).get(name, curve.get(1))
        lines.append([name, *(_cell(curve[k], one) if k in curve else "—" for k in lengths)])
    return Table(title, [first, *(f"k={k}" for k in lengths)], lines)


def curves_table(folder: Path, files: list[str]) -> Table:
    """ms per forward over k new rows, one line per profile file (its path, less .json); where
    a file records the host's memory stream (`stream_gbs`, before / after the curve), a last
    column gives it, since L(1) and so every ratio moves with it. Where it records a floor
    (records_floor.py), a line "NAME floor" follows, its ratios against the measured L(1):
    the least v(k) those kernels could reach on that host then."""
    curves: dict[str, dict[int, float]] = {}
    bases: dict[str, float] = {}
    streams: list[list[float] | None] = []
    for name in files:
        path = folder / name
        if not path.is_file():
            raise DocsTableError(f"{folder.name}: no file {name}")
        data: dict[str, Any] = json.loads(path.read_text())
        latency: dict[str, Any] = data.get("latency") or {}
        if not latency:
            raise DocsTableError(f"{folder.name}/{name}: no latency curve")
        label = name.removesuffix(".json")
        curves[label] = {int(k): 1000 * float(v) for k, v in latency.items()}
        streams.append(data.get("stream_gbs"))
        if data.get("floor"):
            curves[f"{label} floor"] = {int(k): 1000 * float(v) for k, v in data["floor"].items()}
            if 1 in curves[label]:  # its ratios against the measured L(1)
                bases[f"{label} floor"] = curves[label][1]
            streams.append(None)
    table = _curve_table("Forward cost", "profile", curves, bases)
    if any(streams):
        table.headers.append("stream GB/s")
        for row, stream in zip(table.rows, streams, strict=True):
            row.append(" / ".join(f"{g:.0f}" for g in stream) if stream else "—")
    return table


def kernels_table(rows: list[Row]) -> Table:
    """ms per sweep at k rows, one line per kernel in first-measured order."""
    curves: dict[str, dict[int, float]] = {}
    for r in rows:
        curves.setdefault(r["kernel"], {})[int(r["rows"])] = float(r["ms"])
    return _curve_table("Kernel curves", "kernel", curves)


# ----------------------------------------------------------------------------- analysis folders
# Each reads one `draftsman analyze` (or GPU check) folder and returns the table, the folders
# whose run.json names the machine and command, and the rows whose `env` does (if any).

Kind = tuple[Table, list[Path], list[Row]]


def _json(path: Path) -> Any:
    if not path.is_file():
        raise DocsTableError(f"{path.parent.name}: no file {path.name}")
    return json.loads(path.read_text())


def prompt_table(folder: Path, options: dict[str, str], root: Path) -> Kind:
    """`draftsman analyze parallel-prompt` (prompt_decoding.json): per method and dataset,
    tokens/s, speed over autoregressive, mean τ and outputs identical to autoregressive."""
    from draftsman.analysis.prompt_decoding_run import _speedups

    result = _json(folder / "prompt_decoding.json")
    sets = [d for d in result["settings"]["datasets"] if d in result["timings"]]
    per_set = {d: _speedups(result, d) for d in sets}
    labels = list(dict.fromkeys(label for d in sets for label in per_set[d]))
    rows = []
    for label in labels:
        cells = [label]
        for d in sets:
            tps, speedup, tau, same = per_set[d].get(label, (None, None, None, "—"))
            cells += [num(tps), times(speedup), num(tau), same]
        rows.append(cells)
    headers = ["method"] + [f"{d} {h}" for d in sets
                            for h in ("tok/s", "vs autoregressive", "τ", "identical")]
    return Table("Parallel prompt decoding", headers, rows), [folder], []


def match_rate_table(folder: Path, options: dict[str, str], root: Path) -> Kind:
    """`draftsman analyze match-rate` (files=MODEL/match_rate.json|...): greedy p̂ at d̄ = d/2
    for k = 1 and 3 with the shared head (N) and a trained exit head (Y), and k = 1 N at the
    measured layer nearest 3/4 of the depth, one line per task."""
    from draftsman.analysis.match_rate import TASK_LABELS

    files = options.get("files", "").split("|") if options.get("files") else \
        sorted(str(p.relative_to(folder)) for p in folder.glob("*/match_rate.json"))
    if not files:
        raise DocsTableError(f"{folder.name}: no */match_rate.json")
    rows = []
    for name in files:
        result = _json(folder / name)
        depth, greedy = int(result["depth"]), result["summary"]["greedy"]
        mid = depth // 2
        deep = min(result["layers"], key=lambda n: abs(n - 0.75 * depth))
        model = f"{result['model']} ({result['meta'].get('dtype', '?')})"
        for i, (task, by_layer) in enumerate(greedy.items()):
            def rate(layer: int, k: int, head: str, by_layer: dict = by_layer) -> str:
                cell = by_layer.get(str(layer), {}).get(str(k), {}).get(head)
                return "—" if cell is None else f"{100 * cell['rate']:.1f}%"
            first = i == 0
            rows.append([model if first else "", f"{mid} of {depth}" if first else "",
                         TASK_LABELS.get(task, task), rate(mid, 1, "N"), rate(mid, 1, "Y"),
                         rate(mid, 3, "N"), rate(mid, 3, "Y"), str(deep) if first else "",
                         rate(deep, 1, "N")])
    headers = ["model", "d̄ (of d)", "task", "k=1 N", "k=1 Y", "k=3 N", "k=3 Y", "d̄ ≈ 3d/4",
               "k=1 N there"]
    return Table("Match rates", headers, rows), [folder], []


def latency_table(folder: Path, options: dict[str, str], root: Path) -> Kind:
    """`draftsman analyze pipelined-latency` (latency.json): per task and configuration the
    mean p̂, latency, speed over the first configuration and messaging overhead per token."""
    from draftsman.analysis.match_rate import TASK_LABELS

    result = _json(folder / "latency.json")
    rows = []
    first = next(iter(next(iter(result.values()), {})), "the first")
    for task, configs in result.items():
        ref = None
        for label, runs in configs.items():
            seconds = sum(r["seconds"] for r in runs) / len(runs)
            ref = ref or seconds
            p = [r["p_hat"] for r in runs if r.get("p_hat") is not None]
            over = [r["overhead_s"] for r in runs if r.get("overhead_s") is not None]
            rows.append([TASK_LABELS.get(task, task), label,
                         f"{100 * sum(p) / len(p):.1f}%" if p else "—", num(seconds),
                         times(ref / seconds),
                         f"{1e3 * sum(over) / len(over):.1f} ms" if over else "—"])
    headers = ["task", "method", "p̂", "latency (s)", f"vs {first}", "overhead / token"]
    return Table("Pipelined latency", headers, rows), [folder], []


def gpu_table(folder: Path, options: dict[str, str], root: Path) -> Kind:
    """`scripts/gpu_check.py` work folders (files=RUN|RUN, one column each): ceilings, the
    1.5B forward curve, decoding against transformers, SmolLM2's best exact method and, with
    acceptance=CPU_FOLDER, the default pair's speedup predicted from that folder's steps."""
    from draftsman.bench import gpu_report as gr

    runs = options["files"].split("|") if options.get("files") else []
    if not runs:
        raise DocsTableError("table=gpu needs files=RUN|RUN (work folders under the folder)")
    accepted: list[Row] = []
    if options.get("acceptance"):
        accepted = ResultsFile(root / options["acceptance"]).rows()
        if not accepted:
            raise DocsTableError(f"{options['acceptance']}: no rows in results.jsonl")
    columns, env_rows = [], []
    for name in runs:
        work = folder / name
        if not work.is_dir():
            raise DocsTableError(f"{folder.name}: no run folder {name}")
        cells, rows = _gpu_run(gr, work, accepted)
        columns.append(cells)
        env_rows += rows
    figures = list(dict.fromkeys(f for cells in columns for f in cells))
    lines = [[f, *(cells.get(f, "—") for cells in columns)] for f in figures]
    return Table("GPU check", ["figure", *runs], lines), [folder / n for n in runs], env_rows


def _gpu_run(gr: Any, work: Path, accepted: list[Row]) -> tuple[dict[str, str], list[Row]]:
    cells: dict[str, str] = {}
    log = work / "test-gpu.log"
    if log.is_file():
        tail = [x for x in log.read_text().splitlines() if re.search(r"\d+ (passed|failed)", x)]
        cells["`make test-gpu`"] = tail[-1].strip("= ") if tail else "—"
    ceilings = gr.read_json(work / "ceilings.json") or {}
    if ceilings:
        cells["device copy / bf16 matrix product"] = (f"{ceilings['copy_gbps']:.0f} GB/s / "
                                                      f"{ceilings['bf16_tflops']:.0f} TFLOP/s")
    report = work / "report.log"
    floors = re.findall(r"Bandwidth floor ([\d.]+) ms/token: AR is ([\d.]+)×",
                        report.read_text()) if report.is_file() else []
    if floors:  # the report's own line (the floor needs the model folder, not committed)
        cells[f"1.5B bandwidth floor ({gr.CONTEXT} cached tokens); our AR / floor"] = (
            f"{floors[-1][0]} ms; {floors[-1][1]}×")
    for mode in ("static", "eager"):
        lat = gr.latency(work, "1.5b", mode)
        if lat:
            cells[f"1.5B forward (weights: random), {mode}, 1 / 16 / 64 rows"] = (
                " / ".join(num(lat[k] * 1e3) if k in lat else "—" for k in (1, 16, 64))
                + (f" ms, v(16) = {lat[16] / lat[1]:.2f}" if 1 in lat and 16 in lat else " ms"))
    rows: list[Row] = []
    for bench, model in (("bench-random", "1.5B (weights: random)"),
                         ("bench-smollm2", "SmolLM2-135M (weights: real)")):
        mine = ResultsFile(work / bench).rows()
        by = {s.label: s for s in summarise(mine)}
        ar = by.get(gr.AR)
        if not mine or ar is None or not ar.ms_per_token:
            continue
        rows += mine
        ms = {label: num(s.ms_per_token) for label, s in by.items() if s.ms_per_token}
        cells[f"{model}: our AR (static) vs transformers compiled / eager, ms/token"] = (
            f"{ms[gr.AR]} vs {ms.get(gr.HF_COMPILED, '—')} / {ms.get(gr.HF, '—')}")
        compiled = by.get(gr.HF_COMPILED)
        if compiled and compiled.ms_per_token:
            cells[f"{model}: our AR's speed / transformers compiled"] = times(
                compiled.ms_per_token / ar.ms_per_token)
        exact = [s for s in by.values() if s.kind == "draftsman" and s.exactness == "exact"
                 and s.speedup]
        if exact and "real" in model:
            best = max(exact, key=lambda s: s.speedup)
            cells[f"{model}: best exact method, × our AR"] = f"{best.label}: {times(best.speedup)}"
    target, draft = gr.latency(work, "1.5b", "static"), gr.latency(work, "0.5b", "static")
    predicted: dict[str, list[float]] = {}
    drafted: set[str] = set()
    for row in accepted:
        value = gr.predicted_speedup(row, target, draft)
        if value is not None:
            predicted.setdefault(row["label"], []).append(value)
            if row.get("draft_forwards"):
                drafted.add(row["label"])
    means = {label: sum(v) / len(v) for label, v in predicted.items()}
    for what, labels in (("best", list(means)), ("best with a model draft", sorted(drafted))):
        if labels:
            best_label = max(labels, key=lambda label: means[label])
            cells[f"default pair, predicted from CPU steps: {what}"] = (
                f"{best_label}: {times(means[best_label])}")
    return cells, rows
