"""The front door and the docs: a short README, every page in the site's navigation, links
that resolve, and every marked table equal to what its results folder produces today (with
a negative control: a changed number must fail, naming the table)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from draftsman.bench.docs_kinds import curves_table
from draftsman.bench.docs_tables import (
    MARKER,
    DocsTableError,
    check,
    default_files,
    provenance,
    regenerate,
    render,
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


def _scale_row(name: str, key: str) -> Callable[[Path], None]:
    """Multiply one number of the first row of a results.jsonl by 1.5."""
    def change(folder: Path) -> None:
        lines = (folder / name).read_text().splitlines()
        row = json.loads(lines[0])
        row[key] *= 1.5
        (folder / name).write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    return change


def _scale_curve(folder: Path) -> None:
    path = folder / "profile-torch-q4.json"
    profile = json.loads(path.read_text())
    profile["latency"]["8"] *= 1.5  # one row count of one curve
    path.write_text(json.dumps(profile))


def _scale_json(name: str, *keys: str | int) -> Callable[[Path], None]:
    """Multiply one number of a JSON file (found by `keys`) by 1.5."""
    def change(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        inner = data
        for key in keys[:-1]:
            inner = inner[key]
        inner[keys[-1]] *= 1.5
        (folder / name).write_text(json.dumps(data))
    return change


MATCH_FILES = ("qwen2.5-coder-1.5b-instruct/match_rate.json|"
               "smollm2-135m-instruct/match_rate.json")

# each marker kind on a copy of a committed folder, and one number changed in that copy
KINDS = {
    "sets": ("cpu-amx-q8", "table=sets baseline=llama.cpp",
             _scale_row("results.jsonl", "seconds")),
    "sets tok/s": ("cpu-amx-q8", "table=sets value=tok/s columns=method,mt-bench_turn_2,code-edit",
                   _scale_row("results.jsonl", "new_tokens")),
    "prefill": ("cpu-llama-cpp-avx2", "table=prefill",
                _scale_row("results.jsonl", "ttft_seconds")),
    "kernels": ("kernels-avx2", "table=kernels", _scale_row("results.jsonl", "ms")),
    "curves": ("q4-avx2", "table=curves files=profile-torch-q4.json|profile-llama-cpp.json",
               _scale_curve),
    "prompt": ("parallel-prompt-default", "table=prompt",
               _scale_json("prompt_decoding.json", "timings", "mt-bench", "autoregressive", 0,
                           "seconds")),
    "match-rate": ("pipelined-default/match-rate", f"table=match-rate files={MATCH_FILES}",
                   _scale_json("smollm2-135m-instruct/match_rate.json", "summary", "greedy",
                               "translation", "15", "3", "Y", "rate")),
    "latency": ("pipelined-default/latency", "table=latency",
                _scale_json("latency.json", "qa", "pipelined k=1 (2 x 1 thread)", 1,
                            "overhead_s")),
    "gpu": ("gpu-h200", "table=gpu files=first-run|after-fixes",
            _scale_row("after-fixes/bench-random/results.jsonl", "seconds")),
}


def test_curves_give_the_memory_stream_where_a_profile_records_it(tmp_path: Path) -> None:
    for name, stream in (("a.json", [82.8, 71.0]), ("b.json", None)):
        data = {"latency": {"1": 0.01, "16": 0.02}, "command": "draftsman profile",
                "env": {"cpu": "cpu", "git_commit": "abc"}}
        (tmp_path / name).write_text(json.dumps({**data, "stream_gbs": stream}))
    table = curves_table(tmp_path, ["a.json", "b.json"])
    assert table.headers[-1] == "stream GB/s"
    assert [row[-1] for row in table.rows] == ["83 / 71", "—"]
    (tmp_path / "a.json").write_text(json.dumps({"latency": {"1": 0.01}}))
    assert "stream GB/s" not in curves_table(tmp_path, ["a.json"]).headers


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_fails_on_a_changed_number(tmp_path: Path, kind: str) -> None:
    name, options, change = KINDS[kind]
    folder = tmp_path / "bench-results" / name
    shutil.copytree(ROOT / "bench-results" / name, folder,
                    ignore=shutil.ignore_patterns("*.png", "*.html"))
    page = tmp_path / "page.md"
    page.write_text(f"<!-- results: bench-results/{name} {options} -->\nstale\n<!-- /results -->\n")
    fresh, changed = regenerate(page.read_text(), tmp_path)
    assert changed == [f"bench-results/{name}"]
    page.write_text(fresh)
    assert check([page], tmp_path) == []
    change(folder)
    assert check([page], tmp_path) == [
        f"page.md: the table from bench-results/{name} differs from what the folder produces "
        "(run `make docs-tables`)"]


def test_new_kinds_read_their_folders() -> None:
    sets = render("bench-results/cpu-amx-q8", {"table": "sets", "baseline": "llama.cpp"})
    assert "| method | all | code-edit | rag-qa |" in sets
    assert "| speculative:draft=prompt-lookup,gamma=auto | 2.18× | 4.03× | 2.33× |" in sets
    prefill = render("bench-results/cpu-llama-cpp-avx2", {"table": "prefill"})
    assert "| rag-qa | 438 | 23.7 | 69.5 | 0.80 | 1.07× | 1.01× | 1.17× | unreachable" in prefill
    kernels = render("bench-results/kernels-amx", {"table": "kernels"})
    assert "| onednn-int8 | 19.4 (1.00) |" in kernels
    assert "(amx_bf16 amx_int8 avx2" in kernels  # a list of flags reads as one line
    assert "`python scripts/kernel_curves.py" in kernels  # command.txt
    curves = render("bench-results/numerics-llama-cpp", {
        "table": "curves", "files": "fast/verify_cost.json|bitwise/verify_cost.json",
        "columns": "profile,k=1,k=16"})
    assert "| fast/verify_cost | 112.5 (1.00) | 705.0 (6.27) |" in curves
    assert curves.count("`draftsman bench") == 2  # both runs' commands
    prompt = render("bench-results/parallel-prompt-default", {"table": "prompt"})
    assert prompt.startswith("_machine not recorded; commit not recorded; `draftsman analyze")
    assert "| parallel-prompt:tree_size=2 | 3.62 | 1.03× | 1.28 | 4/4 | 3.72 | 0.81× | 1.15 " \
        "| 1/4 |" in prompt
    match = render("bench-results/pipelined-default/match-rate", {"table": "match-rate"})
    assert match.startswith("_AMD EPYC (avx2); commit not recorded; `draftsman analyze")
    assert "| qwen2.5-coder-1.5b-instruct (bf16) | 14 of 28 | QA | 1.0% | 16.7% | 4.2% | " \
        "26.0% | 21 | 35.4% |" in match
    assert "| smollm2-135m-instruct (fp32) | 15 of 30 | QA |" in match  # all folders, sorted
    latency = render("bench-results/pipelined-default/latency", {"table": "latency"})
    assert "| QA | pipelined k=1 (2 x 1 thread) | 18.3% | 37.84 | 0.97× | 3.4 ms |" in latency
    gpu = render("bench-results/gpu-h200", {
        "table": "gpu", "files": "first-run|after-fixes",
        "acceptance": "bench-results/speculative-bf16-avx512"})
    assert gpu.startswith("_NVIDIA H200, weights: random; commit eda8ddb04b42+dirty; `make")
    assert "| 4196 GB/s / 786 TFLOP/s | — |" in gpu  # the second run measured no ceilings
    assert "| 1.5B (weights: random): our AR's speed / transformers compiled | 0.78× | 1.23× |" \
        in gpu
    assert "| speculative:draft=prompt-lookup,gamma=7: 2.09× |" in gpu  # = first-run/summary.md


def test_a_load_table_keeps_the_servers_asked_for() -> None:
    table = render("bench-results/load-amx-aligned",
                   {"table": "load", "servers": "ours-batched+lookup|llama-server"})
    assert "| 4 | ours-batched+lookup | 35.7 | 1.55 / 4.44 | 106 / 243 | 67 | 0 |" in table
    assert "| 0.3/s | llama-server | 14.2 |" in table
    assert "plain" not in table.split("\n\n", 1)[1]  # the rows; the command names them all
    with pytest.raises(DocsTableError, match="no server nobody"):
        render("bench-results/load-amx-aligned", {"table": "load", "servers": "nobody"})


def test_provenance_says_what_the_folder_records(tmp_path: Path) -> None:
    rows = [{"env": {"cpu": "CPU X", "git_commit": f"{i}" * 40}} for i in range(5)]
    line = provenance(tmp_path, rows)
    assert line.startswith("_CPU X; 5 commits, 000000000000 first, 444444444444 last")
    assert provenance(tmp_path, []) == "_machine not recorded; commit not recorded_"
    (tmp_path / "summary.json").write_text(json.dumps({"context": {"command": "draftsman x"}}))
    assert provenance(tmp_path, rows[:1]).endswith("; commit 000000000000; `draftsman x`_")


def test_curves_from_profile_files_name_their_machine_and_commits(tmp_path: Path) -> None:
    folder = tmp_path / "bench-results" / "curves"
    folder.mkdir(parents=True)
    for name, commit in (("before", "a" * 40), ("after", "b" * 40 + "+dirty")):
        (folder / f"{name}.json").write_text(json.dumps({
            "latency": {"1": 0.02, "16": 0.04}, "command": "draftsman profile --dtype q4",
            "env": {"cpu": "Some CPU", "isa": "avx2 avx512f", "git_commit": commit}}))
    said = render("bench-results/curves", {"table": "curves", "files": "before.json|after.json"},
                  tmp_path)
    assert said.startswith("_Some CPU (avx2 avx512f); commit aaaaaaaaaaaa, bbbbbbbbbbbb+dirty; "
                           "`draftsman profile --dtype q4`_"), said
    assert "| after | 20.0 (1.00) | 40.0 (2.00) |" in said


def test_bad_markers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DocsTableError, match="unknown table option"):
        regenerate("<!-- results: bench-results/cpu-amx colour=red -->\n<!-- /results -->",
                   ROOT)
    with pytest.raises(DocsTableError, match="no rows labelled nope"):
        regenerate("<!-- results: bench-results/cpu-amx labels=nope -->\n<!-- /results -->",
                   ROOT)
    bad = {"table=curves": "needs files=", "table=curves files=nope.json": "no file nope.json",
           "table=sets value=ms": "value=ms: choose", "table=nope": "table=nope: choose",
           "table=prefill": "needs rows labelled llama.cpp, default",
           "table=gpu": "needs files=RUN", "table=gpu files=nope": "no run folder nope",
           "table=latency": "no file latency.json"}
    for options, message in bad.items():
        folder = {"table=curves": "q4-avx2", "table=gpu": "gpu-h200"}.get(
            options.split(" ")[0], "bf16-default-pair")
        with pytest.raises(DocsTableError, match=message):
            regenerate(f"<!-- results: bench-results/{folder} {options} -->\n<!-- /results -->",
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


def test_curves_give_a_recorded_floor_against_the_measured_one_row(tmp_path: Path) -> None:
    data = {"latency": {"1": 0.010, "16": 0.030}, "floor": {"1": 0.008, "16": 0.020},
            "stream_gbs": [80.0, 78.0]}
    (tmp_path / "q4.json").write_text(json.dumps(data))
    (tmp_path / "bf16.json").write_text(json.dumps({"latency": {"1": 0.02, "16": 0.03}}))
    table = curves_table(tmp_path, ["q4.json", "bf16.json"])
    assert [row[0] for row in table.rows] == ["q4", "q4 floor", "bf16"]
    assert table.rows[0][1:] == ["10.0 (1.00)", "30.0 (3.00)", "80 / 78"]
    # the floor's ratios are to the measured L(1), 10 ms, not to its own 8
    assert table.rows[1][1:] == ["8.0 (0.80)", "20.0 (2.00)", "—"]
    assert table.rows[2][1:] == ["20.0 (1.00)", "30.0 (1.50)", "—"]
