"""Tables in the README and docs/ that are generated from committed results, never typed.

A table sits between two markers naming the results folder it comes from:

    <!-- results: bench-results/cpu-amx baseline=llama.cpp columns=method,tok/s,speedup -->
    ...generated lines...
    <!-- /results -->

Options (all optional, space separated KEY=VALUE without spaces in a value):
    table=speed|time|quality   which of the bench's tables (default speed); table=load:
                               a `draftsman loadtest` folder's table (other options unused)
    baseline=LABEL             what `speedup` divides by (default autoregressive)
    columns=a,b,c              keep these columns, in this order (names as in the table)
    labels=a|b|c               keep these rows (method labels, or the first word of a label
                               with spaces: `default`), in this order
    dataset=a|b                only rows of these datasets
`<!-- options: METHOD -->...<!-- /options -->` holds a method's typed options as the
registry declares them. Between the results markers go a line naming the machine, the
commit and the command that produced the folder (from its rows and run.json), then the
table, as `draftsman bench` computes it from the folder's results.jsonl today. `--check`
fails naming every table that differs from what its folder produces, or whose folder does
not exist; without it the files are rewritten in place.

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

from draftsman.bench.load import summary_table
from draftsman.bench.metrics import summarise
from draftsman.bench.report import quality_table, speed_table, time_table
from draftsman.bench.results import ResultsFile
from draftsman.bench.tables import Table, table_md

ROOT = Path(__file__).resolve().parents[3]
MARKER = re.compile(r"<!-- results: (?P<folder>\S+)(?P<opts>[^>]*?)-->\n(?P<body>.*?)"
                    r"<!-- /results -->", re.S)
OPTIONS_MARKER = re.compile(r"<!-- options: (?P<method>\S+) -->\n(?P<body>.*?)<!-- /options -->",
                            re.S)
TABLES = {"speed": speed_table, "time": time_table}


class DocsTableError(ValueError):
    """A marker names a folder or an option that does not exist."""


def parse_options(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split():
        key, eq, value = item.partition("=")
        if not eq or key not in ("table", "baseline", "columns", "labels", "dataset"):
            raise DocsTableError(f"unknown table option {item!r}")
        out[key] = value
    return out


def read_rows(folder: Path) -> list[dict[str, Any]]:
    rows = ResultsFile(folder).rows()
    if not rows:
        raise DocsTableError(f"{folder}: no rows in results.jsonl")
    return rows


def provenance(folder: Path, rows: list[dict[str, Any]]) -> str:
    """One line: the device, the commit(s) and the command that produced `folder`."""
    env = rows[0].get("env") or {}
    device = env.get("gpu") or " ".join(x for x in (env.get("cpu"), env.get("isa") and
                                                     f"({env['isa']})") if x)
    commits = sorted({short_commit(str((r.get("env") or {}).get("git_commit"))) for r in rows})
    if env.get("weights") == "random":
        device += ", weights: random"
    command = None
    run = folder / "run.json"
    if run.is_file():
        runs = json.loads(run.read_text())
        runs = runs if isinstance(runs, list) else [runs]
        command = next((r.get("command") for r in reversed(runs) if r.get("command")), None)
    said = f"_{device or 'machine not recorded'}; commit {', '.join(commits)}"
    return said + (f"; `{command}`_" if command else "_")


def short_commit(commit: str) -> str:
    """12 hex digits, keeping a '+dirty' mark: a table must say its run was not clean."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def select(table: Table, columns: list[str] | None, labels: list[str] | None) -> Table:
    rows = table.rows
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
    if options.get("table") == "load":  # a `draftsman loadtest` folder: rounds, not labels
        rounds = [json.loads(line) for line in
                  (folder / "results.jsonl").read_text().splitlines() if line.strip()]
        if not rounds:
            raise DocsTableError(f"{folder}: no rounds in results.jsonl")
        return provenance(folder, rounds) + "\n\n" + summary_table(rounds) + "\n"
    rows = read_rows(folder)
    if "dataset" in options:
        wanted = set(options["dataset"].split("|"))
        rows = [r for r in rows if r.get("dataset") in wanted]
    baseline = options.get("baseline", "autoregressive")
    if not any(r["label"] == baseline for r in rows):
        raise DocsTableError(f"{folder_name}: no rows labelled {baseline!r} to divide by")
    summaries = summarise(rows, baseline)
    kind = options.get("table", "speed")
    if kind == "quality":
        greedy = all((r.get("settings") or {}).get("temperature", 0) == 0 for r in rows)
        table = quality_table(summaries, greedy)
    elif kind in TABLES:
        table = TABLES[kind](summaries)
    else:
        raise DocsTableError(f"table={kind}: choose speed, time, quality or load")
    table = select(table, options.get("columns", "").split(",") if "columns" in options
                   else None, options["labels"].split("|") if "labels" in options else None)
    body = table_md(table).split("\n", 2)[2]  # without its "### title" line
    return provenance(folder, rows) + "\n\n" + body


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
