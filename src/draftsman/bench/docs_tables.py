"""Tables in the README and docs/ that are generated from committed results, never typed.

A table sits between two markers naming the results folder it comes from:

    <!-- results: bench-results/cpu-amx baseline=llama.cpp columns=method,tok/s,speedup -->
    ...generated lines...
    <!-- /results -->

Options (all optional, space separated KEY=VALUE without spaces in a value):
    table=speed|time|quality   which of the bench's tables (default speed); table=sets: one
                               line per contestant, a column for all prompts and one per set
                               (`value=speedup` over the baseline, the default, or
                               `value=tok/s`); table=prefill: per set, the prefill share and
                               the decode speedup of the `default` contestant
                               (`prefill_share`); table=kernels: a `scripts/kernel_curves.py`
                               folder; table=curves files=a.json|b.json: forward-cost
                               profiles (JSON files under the folder); table=load: a
                               `draftsman loadtest` folder's table (`servers=a|b`: only
                               these servers' rows; other options unused);
                               table=prompt: `analyze parallel-prompt`'s speed per set;
                               table=match-rate [files=M/match_rate.json|...]: `analyze
                               match-rate`'s p̂ at d/2 and 3d/4; table=latency: `analyze
                               pipelined-latency`; table=gpu files=RUN|RUN
                               [acceptance=CPU_FOLDER]: GPU-check work folders, a column each
    baseline=LABEL             what `speedup` divides by (default autoregressive)
    columns=a,b,c              keep these columns, in this order (names as in the table; `_`
                               stands for a space: `predicted_(this_CPU)`, `mt-bench_turn_2`)
    labels=a|b|c               keep these rows (method labels, or the first word of a label
                               with spaces: `default`), in this order
    dataset=a|b                only rows of these datasets
`<!-- options: METHOD -->...<!-- /options -->` holds a method's typed options as the
registry declares them. Between the results markers go a line naming the machine, the
commit(s) and the command that produced the folder (from its rows, else run.json's `env`;
the command from run.json, summary.json or command.txt; for table=curves, the folders the
files sit in, else the files' own `env` and `command`, which `draftsman profile --json`
records), then the table, as `draftsman bench` computes it from the folder's files
today. `--check` fails naming every table that differs from what its folder produces, or
whose folder does not exist; without it the files are rewritten in place.

    python -m draftsman.bench.docs_tables [--check] [FILE ...]   (default: README.md docs/*.md)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from draftsman.bench.docs_kinds import (
    DocsTableError,
    curves_table,
    gpu_table,
    kernels_table,
    latency_table,
    match_rate_table,
    prompt_table,
    sets_table,
)
from draftsman.bench.load import summary_table
from draftsman.bench.metrics import summarise
from draftsman.bench.prefill_share import prefill_table
from draftsman.bench.report import quality_table, speed_table, time_table
from draftsman.bench.results import ResultsFile
from draftsman.bench.tables import Table, table_md

ROOT = Path(__file__).resolve().parents[3]
MARKER = re.compile(r"<!-- results: (?P<folder>\S+)(?P<opts>[^>]*?)-->\n(?P<body>.*?)"
                    r"<!-- /results -->", re.S)
OPTIONS_MARKER = re.compile(r"<!-- options: (?P<method>\S+) -->\n(?P<body>.*?)<!-- /options -->",
                            re.S)
TABLES = {"speed": speed_table, "time": time_table}
FOLDER_KINDS = {"prompt": prompt_table, "match-rate": match_rate_table,
                "latency": latency_table, "gpu": gpu_table}
KINDS = "speed, time, quality, sets, prefill, kernels, curves, load, " + ", ".join(FOLDER_KINDS)
OPTIONS = ("table", "baseline", "columns", "labels", "dataset", "value", "files", "acceptance",
           "servers")
MAX_COMMITS = 3  # more are summarised as the first and the last measured
__all__ = ["DocsTableError", "check", "regenerate", "render"]


def parse_options(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split():
        key, eq, value = item.partition("=")
        if not eq or key not in OPTIONS:
            raise DocsTableError(f"unknown table option {item!r}")
        out[key] = value
    return out


def read_rows(folder: Path) -> list[dict[str, Any]]:
    rows = ResultsFile(folder).rows()
    if not rows:
        raise DocsTableError(f"{folder}: no rows in results.jsonl")
    return rows


def provenance(folder: Path | list[Path], rows: list[dict[str, Any]]) -> str:
    """One line: the device, the commit(s) and the command(s) that produced `folder` (or the
    folders a table's files come from)."""
    folders = folder if isinstance(folder, list) else [folder]
    runs = [_run_log(f) for f in folders]
    env = (rows[0].get("env") if rows else next((r["env"] for r in runs if r.get("env")),
                                                None)) or {}
    isa = " ".join(env["isa"]) if isinstance(env.get("isa"), list) else env.get("isa")
    device = env.get("gpu") or " ".join(x for x in (env.get("cpu"), isa and f"({isa})") if x)
    if env.get("weights") == "random":
        device += ", weights: random"
    envs = [r.get("env") or {} for r in rows] or [env]
    commits = list(dict.fromkeys(short_commit(str(e.get("git_commit") or e.get("commit")))
                                 for e in envs if e.get("git_commit") or e.get("commit")))
    if len(commits) > MAX_COMMITS:
        said_commits = f"{len(commits)} commits, {commits[0]} first, {commits[-1]} last"
    else:
        said_commits = "commit " + (", ".join(commits) or "not recorded")
    said = f"_{device or 'machine not recorded'}; {said_commits}"
    commands = [c for c in dict.fromkeys(run.get("command") or _summary_command(f)
                                         for f, run in zip(folders, runs, strict=True)) if c]
    commands = commands or [c for c in dict.fromkeys(r.get("command") for r in rows) if c]
    return said + "".join(f"; `{c}`" for c in commands) + "_"


def _run_log(folder: Path) -> dict[str, Any]:
    """The last run.json entry with a command (or the last entry), else command.txt's first
    line as the command."""
    run = folder / "run.json"
    if run.is_file():
        runs = json.loads(run.read_text())
        runs = runs if isinstance(runs, list) else [runs]
        return next((r for r in reversed(runs) if r.get("command")), runs[-1] if runs else {})
    text = folder / "command.txt"
    if text.is_file():
        return {"command": text.read_text().strip().splitlines()[0]}
    return {}


def _summary_command(folder: Path) -> str | None:
    summary = folder / "summary.json"
    if not summary.is_file():
        return None
    return (json.loads(summary.read_text()).get("context") or {}).get("command")


def short_commit(commit: str) -> str:
    """12 hex digits, keeping a '+dirty' mark: a table must say its run was not clean."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def select(table: Table, columns: list[str] | None, labels: list[str] | None) -> Table:
    rows = table.rows
    columns = [c.replace("_", " ") for c in columns] if columns else None
    if labels:
        by_label = {row[0]: row for row in rows}
        by_label.update({row[0].split(" ")[0]: row for row in rows if " " in row[0]})
        missing = [label for label in labels if label not in by_label]
        if missing:
            raise DocsTableError(f"no rows labelled {', '.join(missing)}")
        rows = [by_label[label] for label in labels]
    headers = table.headers
    if columns:
        unknown = [c for c in columns if c not in headers]
        if unknown:
            raise DocsTableError(f"no columns {', '.join(unknown)} (have {', '.join(headers)})")
        index = [headers.index(c) for c in columns]
        headers, rows = columns, [[row[i] for i in index] for row in rows]
    return Table(table.title, headers, rows, None)


def render(folder_name: str, options: dict[str, str], root: Path = ROOT) -> str:
    """The lines between the markers for `folder_name` with `options`."""
    folder = root / folder_name
    if not folder.is_dir():
        raise DocsTableError(f"{folder_name}: no such results folder")
    kind = options.get("table", "speed")
    if kind == "load":  # a `draftsman loadtest` folder: rounds, not labels
        rounds = [json.loads(line) for line in
                  (folder / "results.jsonl").read_text().splitlines() if line.strip()]
        if not rounds:
            raise DocsTableError(f"{folder}: no rounds in results.jsonl")
        shown = rounds
        if "servers" in options:
            wanted, present = options["servers"].split("|"), {r["server"] for r in rounds}
            missing = [w for w in wanted if w not in present]
            if missing:
                raise DocsTableError(f"{folder_name}: no server {', '.join(missing)}")
            shown = [r for r in rounds if r["server"] in wanted]
        return provenance(folder, rounds) + "\n\n" + summary_table(shown) + "\n"
    sources = [folder]
    if kind in FOLDER_KINDS:  # an analysis or GPU-check folder: its own files, not rows
        table, sources, rows = FOLDER_KINDS[kind](folder, options, root)
    elif kind == "kernels":
        rows = _json_rows(folder)
        if not rows:
            raise DocsTableError(f"{folder_name}: no kernel rows in results.jsonl")
        table = kernels_table(rows)
    elif kind == "curves":
        if "files" not in options:
            raise DocsTableError("table=curves needs files=a.json|b.json")
        files = options["files"].split("|")
        table = curves_table(folder, files)
        # the machine and command: the folders the files sit in (a run's verify_cost.json),
        # else the files themselves (`draftsman profile --json` records its env and command)
        sources = list(dict.fromkeys((folder / name).parent for name in files))
        rows = [row for source in sources for row in _json_rows(source)] or [
            curve for curve in (json.loads((folder / name).read_text()) for name in files)
            if curve.get("env")]
    else:
        rows = read_rows(folder)
        table = bench_table(folder_name, rows, options)
    table = select(table, options["columns"].split(",") if "columns" in options else None,
                   options["labels"].split("|") if "labels" in options else None)
    body = table_md(table).split("\n", 2)[2]  # without its "### title" line
    return provenance(sources, rows) + "\n\n" + body


def _json_rows(folder: Path) -> list[dict[str, Any]]:
    path = folder / "results.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench_table(folder_name: str, rows: list[dict[str, Any]], options: dict[str, str]) -> Table:
    """One of the tables of a `draftsman bench` folder's rows."""
    if "dataset" in options:
        wanted = set(options["dataset"].split("|"))
        rows = [r for r in rows if r.get("dataset") in wanted]
    kind = options.get("table", "speed")
    if kind == "prefill":
        try:
            return prefill_table(rows)
        except ValueError as exc:
            raise DocsTableError(f"{folder_name}: {exc}") from exc
    baseline = options.get("baseline", "autoregressive")
    if not any(r["label"] == baseline for r in rows):
        raise DocsTableError(f"{folder_name}: no rows labelled {baseline!r} to divide by")
    if kind == "sets":
        return sets_table(rows, baseline, options.get("value", "speedup"))
    summaries = summarise(rows, baseline)
    if kind == "quality":
        greedy = all((r.get("settings") or {}).get("temperature", 0) == 0 for r in rows)
        return quality_table(summaries, greedy)
    if kind in TABLES:
        return TABLES[kind](summaries)
    raise DocsTableError(f"table={kind}: choose {KINDS}")


def options_table(method: str) -> str:
    """A method's typed options as the registry declares them (what --help-options says)."""
    from draftsman.strategies import registry
    from draftsman.strategies.options import specs

    if method not in registry.METHODS:
        raise DocsTableError(f"options: no method {method!r}")
    lines = ["| option | type | default | what |", "|---|---|---|---|"]
    for name, (spec, default) in specs(registry.method(method).options).items():
        what = spec.help + (f" (choices: {', '.join(spec.choices)})" if spec.choices else "")
        kind = spec.type_name().replace(" | ", " or ")
        lines.append(f"| `{name}` | {kind} | `{default!r}` | "
                     f"{what.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def regenerate(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """`text` with every marked table regenerated, and the folders (or `options: METHOD`)
    whose table changed."""
    changed: list[str] = []

    def options(match: re.Match) -> str:
        method = match.group("method")
        body = options_table(method)
        if body != match.group("body"):
            changed.append(f"options: {method}")
        return f"<!-- options: {method} -->\n{body}<!-- /options -->"

    text = OPTIONS_MARKER.sub(options, text)

    def one(match: re.Match) -> str:
        name = match.group("folder")
        body = render(name, parse_options(match.group("opts")), root)
        if body != match.group("body"):
            changed.append(name)
        return f"<!-- results: {name}{match.group('opts')}-->\n{body}<!-- /results -->"

    return MARKER.sub(one, text), changed


def default_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def check(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """Problems, one line each: a table that differs from its folder, or a bad marker."""
    problems = []
    for path in files:
        try:
            _, changed = regenerate(path.read_text(), root)
        except DocsTableError as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        problems += [f"{path.name}: the table from {name} differs from what the folder "
                     "produces (run `make docs-tables`)" for name in changed]
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--check", action="store_true", help="fail if a table is out of date")
    args = p.parse_args(argv)
    files = args.files or default_files()
    if args.check:
        problems = check(files)
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    for path in files:
        text, changed = regenerate(path.read_text())
        if changed:
            path.write_text(text)
            print(f"{path}: {len(changed)} table(s) regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
