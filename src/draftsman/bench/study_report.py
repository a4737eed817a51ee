"""report.html for the analysis commands: their Markdown rendered as one offline page.

The analyses write Markdown (headings, paragraphs, pipe tables, `code`, image links to PNGs
in the same folder); this turns exactly that subset into HTML with the images embedded, so
the page and the .md always show the same numbers.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from draftsman.bench.tables import CSS

_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")


def _inline(text: str) -> str:
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_to_html(text: str, folder: Path) -> str:
    """The Markdown subset above -> HTML body; images are read from `folder` and embedded."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line:
            i += 1
            continue
        heading = re.match(r"^(#{1,4}) (.*)$", line)
        image = _IMAGE.match(line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
        elif image:
            path = folder / image.group(2)
            if path.is_file():
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                out.append(f"<figure><a href='{html.escape(image.group(2))}'><img alt="
                           f"'{html.escape(image.group(1))}' src='data:image/png;base64,"
                           f"{data}'></a><figcaption>{html.escape(image.group(2))}"
                           "</figcaption></figure>")
            else:
                out.append(f"<p>(missing plot {html.escape(image.group(2))})</p>")
            i += 1
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            head, body = _cells(block[0]), [_cells(r) for r in block[2:]]
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in head)
                       + "</tr></thead><tbody>" + "".join(
                           "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>"
                           for r in body) + "</tbody></table>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(
                    r"^(#|\||- |!\[)", lines[i]):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


def write_html(path: Path, markdown: str, folder: Path, title: str | None = None) -> Path:
    first = next((ln[2:] for ln in markdown.splitlines() if ln.startswith("# ")), "draftsman")
    body = markdown_to_html(markdown, folder)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title or first)}</title><style>{CSS}</style></head><body>{body}"
            "</body></html>\n")
    path.write_text(page)
    return path
