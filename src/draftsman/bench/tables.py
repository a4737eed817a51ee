"""Benchmark tables as data, rendered to Markdown and HTML.

A `Table` is built once and rendered by both `table_md` and `table_html`, so summary.md and
report.html always show the same numbers. Cells are already-formatted strings; `num`, `times`
and `pct` format a missing value as an em dash.
"""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


# ----------------------------------------------------------------------------- formatting

def num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


# ----------------------------------------------------------------------------- rendering

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_md(t: Table) -> str:
    lines = [f"### {t.title}", "", "| " + " | ".join(t.headers) + " |",
             "|" + "|".join("---" for _ in t.headers) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    if t.note:
        lines += ["", f"_{t.note}_"]
    return "\n".join(lines) + "\n"


def table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in t.rows)
    note = f"<p class='note'>{html.escape(t.note)}</p>" if t.note else ""
    return (f"<h2>{html.escape(t.title)}</h2><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{note}")


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}
.note{color:#555;font-size:12px;max-width:1000px}dt{font-weight:bold;float:left;width:12em}
dd{margin-left:13em}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"""
