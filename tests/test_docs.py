"""The front door and the docs: a short README, every page in the site's navigation, links
that resolve, and every marked table equal to what its results folder produces today (with
a negative control: a changed number must fail, naming the table)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from draftsman.bench.docs_tables import (
    MARKER,
    DocsTableError,
    check,
    default_files,
    regenerate,
)

ROOT = Path(__file__).resolve().parent.parent


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first_screen = "\n".join(text.splitlines()[:80])
    for needle in ("make demo", "`speculative`", "llama.cpp's own plain loop"):
        assert needle in first_screen, needle
    assert "draftsman serve" in text


def test_every_marked_table_matches_its_folder() -> None:
    files = default_files(ROOT)
    assert sum(len(MARKER.findall(f.read_text())) for f in files) >= 5
    assert check(files, ROOT) == []


def test_a_changed_number_fails_naming_the_table(tmp_path: Path) -> None:
    folder = tmp_path / "bench-results" / "cpu-amx"
    shutil.copytree(ROOT / "bench-results" / "cpu-amx", folder)
    page = tmp_path / "page.md"
    marker = "<!-- results: bench-results/cpu-amx baseline=llama.cpp columns=method,tok/s -->"
    page.write_text(marker + "\nstale\n<!-- /results -->\n")
    fresh, changed = regenerate(page.read_text(), tmp_path)
    assert changed == ["bench-results/cpu-amx"]
    page.write_text(fresh)
    assert check([page], tmp_path) == []  # restored: passes
    rows = (folder / "results.jsonl").read_text().splitlines()
    row = json.loads(rows[0])
    row["seconds"] *= 1.5  # one contestant's time on one prompt
    (folder / "results.jsonl").write_text("\n".join([json.dumps(row), *rows[1:]]) + "\n")
    assert check([page], tmp_path) == [
        "page.md: the table from bench-results/cpu-amx differs from what the folder produces "
        "(run `make docs-tables`)"]
    shutil.rmtree(folder)
    assert check([page], tmp_path) == ["page.md: bench-results/cpu-amx: no such results folder"]


def test_bad_markers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DocsTableError, match="unknown table option"):
        regenerate("<!-- results: bench-results/cpu-amx colour=red -->\n<!-- /results -->",
                   ROOT)
    with pytest.raises(DocsTableError, match="no rows labelled nope"):
        regenerate("<!-- results: bench-results/cpu-amx labels=nope -->\n<!-- /results -->",
                   ROOT)


def test_every_page_is_in_the_site_and_links_resolve() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(f": {name}" in nav for name in pages), pages
    links = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in links.findall(path.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
