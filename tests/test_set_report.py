"""The per-set (and per-turn) speed table of the benchmark report, on hand-made rows."""

from __future__ import annotations

import pytest

from draftsman.bench.datasets import workload
from draftsman.bench.report import tables
from draftsman.bench.set_report import set_groups, set_summaries, set_table


def _row(label: str, dataset: str, prompt: int, turn: int, seconds: float) -> dict:
    return {"label": label, "method": label, "kind": "peer", "dataset": dataset,
            "prompt_id": f"{dataset}/{prompt}", "turn": turn,
            "prompt_key": f"{dataset}:{dataset}/{prompt}#{turn}", "repeat": 0,
            "new_tokens": 100, "seconds": seconds, "finish": "length"}


def _rows() -> list[dict]:
    # seconds per 100 tokens: autoregressive 10, llama.cpp 8, ours 4 on copy-heavy turns, 9
    # on free ones
    out = []
    for dataset, turns in (("humaneval", (1,)), ("mt-bench", (1, 2)), ("grammar", (1,))):
        for p in range(2):
            for t in turns:
                copy = dataset == "grammar" or t == 2
                out += [_row("autoregressive", dataset, p, t, 10.0),
                        _row("llama.cpp", dataset, p, t, 8.0),
                        _row("ours", dataset, p, t, 4.0 if copy else 9.0)]
    return out


def test_workload_classes() -> None:
    assert workload("code-edit") == workload("rag-qa") == "copy-heavy"
    assert workload("news_summarization") == "copy-heavy"
    assert workload("humaneval") == workload("mt-bench", 1) == "free generation"
    assert workload("mt-bench", 2) == "copy-heavy"
    assert workload("news-translation") == "other"


def test_sets_split_turns_and_put_copy_heavy_first() -> None:
    groups = set_groups(_rows())
    assert [(g.name, g.workload) for g in groups] == [
        ("mt-bench turn 2", "copy-heavy"), ("grammar", "copy-heavy"),
        ("humaneval", "free generation"), ("mt-bench turn 1", "free generation")]
    assert all(len(g.rows) == 6 for g in groups)


def test_speedups_per_set_against_both_baselines() -> None:
    records = {(r["set"], r["label"]): r for r in set_summaries(_rows())}
    ours = records[("mt-bench turn 2", "ours")]
    assert ours["tokens_per_second"] == pytest.approx(25.0)
    assert ours["speedup"] == pytest.approx(2.5)
    assert ours["speedup_vs_llama_cpp"] == pytest.approx(2.0)
    free = records[("mt-bench turn 1", "ours")]
    assert free["speedup_vs_llama_cpp"] == pytest.approx(8 / 9)
    assert records[("grammar", "llama.cpp")]["speedup_vs_llama_cpp"] == pytest.approx(1.0)


def test_table_in_the_report_and_absent_for_one_set() -> None:
    _, tbls = tables(_rows())
    table = next(t for t in tbls if t.title == "Per set and turn")
    assert "vs llama.cpp" in table.headers
    assert table.rows[2][:3] == ["mt-bench turn 2", "copy-heavy", "ours"]
    one = [r for r in _rows() if r["dataset"] == "grammar"]
    assert set_table(one) is None
    no_peer = [r for r in _rows() if r["label"] != "llama.cpp"]
    assert "vs llama.cpp" not in set_table(no_peer).headers


def test_cpu_preset_times_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    from draftsman.bench.datasets import load_dataset
    from draftsman.bench.peers import parse_peers
    from draftsman.bench.spec import parse_methods
    from draftsman.cli.bench_cmd import config_from_args
    from draftsman.cli.main import build_parser

    parse = build_parser().parse_args
    cfg = config_from_args(parse(["bench", "--preset", "cpu"]))
    assert (cfg.backend, cfg.numerics, cfg.turns, cfg.temperature) == ("llama.cpp", "fast",
                                                                       "all", 0.0)
    assert cfg.max_new_tokens == 128
    assert {"code-edit", "rag-qa", "grammar", "news-summarization", "humaneval",
            "mt-bench"} == set(cfg.datasets)
    assert parse_peers(cfg.peers) == [("llama.cpp", "plain"), ("llama.cpp", "lookup"),
                                      ("llama.cpp", "lookup=10"), ("llama.cpp", "speculative")]
    methods = parse_methods(cfg.methods)
    assert len(methods) == 12  # autoregressive + three on llama.cpp + eight on torch q4 / q8
    # issue 30's torch q4 contestants: plain, suffix, the 0.5B draft, staged and a tree
    q4 = {m.method for m in methods if m.engine == "torch-q4"}
    assert {"autoregressive", "speculative", "staged"} <= q4
    assert any(m.engine == "torch-q4" and m.get("branches") == "auto" for m in methods)
    assert {m.engine for m in methods} == {"", "torch-q4", "torch-q8"}
    units = sum(max(len(p.turns), 1) for d in cfg.datasets
                for p in load_dataset(d, limit=cfg.limit))
    contestants = len(methods) + 3
    # ~12 s a generation on a 2-core CPU (9 s measured on an AMX Xeon, bench-results/cpu-amx):
    # a committed run stays under 45 minutes
    assert units * contestants * 12 <= 45 * 60
    assert config_from_args(parse(["bench", "--preset", "cpu", "--turns", "first"])).turns \
        == "first"
    args = parse(["bench", "--list-datasets"])
    assert args.func(args) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("code-edit", "rag-qa", "grammar", "humaneval"))
