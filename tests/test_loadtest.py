"""`draftsman loadtest` against our own server with a tiny model: every reply timed and
counted, the rounds interleaved, the results written; bad contestants are one clear line."""

from __future__ import annotations

import json

import pytest
from test_server import engine, model_dirs, serving  # noqa: F401

from draftsman.bench.load import percentile, run_arrivals, run_round
from draftsman.cli.loadtest_cmd import parse_server
from draftsman.cli.main import main
from draftsman.errors import InvalidArgumentError
from draftsman.testing.tiny_models import tiny_dataset

MESSAGES = [[{"role": "user", "content": t}] for t in
            ("the quick brown fox", "def add(a, b):", "one two three", "hello world")]


def test_a_round_times_every_reply(engine):  # noqa: F811
    with serving(engine, parallel=2) as live:
        result = run_round("ours", live.url, MESSAGES, 2, 12)
    assert len(result.replies) == 4 and all(r.error is None for r in result.replies)
    summary = result.summary()
    assert summary["tokens"] == sum(r.tokens for r in result.replies) > 0
    assert all(r.ttft is not None and r.ttft > 0 for r in result.replies)
    assert summary["tokens_per_second"] == pytest.approx(summary["tokens"] / result.seconds)
    # usage counts tokens; a speculative chunk may carry several
    assert all(len(r.chunks) <= r.tokens for r in result.replies)


def test_the_command_writes_rows_for_every_server_and_level(engine, tmp_path):  # noqa: F811
    dataset = tiny_dataset(tmp_path / "tiny.jsonl")
    off = json.dumps({"draftsman": {"method": "autoregressive"}})
    with serving(engine, parallel=2) as live:
        code = main(["loadtest", "--server", f"a={live.url}", "--server",
                     f"b={live.url}#{off}", "--concurrency", "1,2", "--dataset",
                     str(dataset), "--limit", "2", "--max-tokens", "8", "--out",
                     str(tmp_path / "out")])
    assert code == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().split("\n")
            if x]
    assert [(r["concurrency"], r["server"]) for r in rows] == [
        (1, "a"), (1, "b"), (2, "a"), (2, "b")]
    assert all(r["errors"] == 0 and r["tokens"] > 0 and r["env"]["cpu"]
               for r in rows)
    assert "| 2 | b |" in (tmp_path / "out" / "summary.md").read_text()
    assert (tmp_path / "out" / "load.png").stat().st_size > 1000


def test_bad_contestants_and_percentiles():
    with pytest.raises(InvalidArgumentError, match="NAME=URL"):
        parse_server("http://127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        parse_server("a=http://x#{bad")
    assert parse_server('a=http://x:1#{"k": 1}') == ("a", "http://x:1", {"k": 1})
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)


def test_poisson_arrivals_are_seeded_and_open_loop(engine):  # noqa: F811
    with serving(engine, parallel=2) as live:
        result = run_arrivals("ours", live.url, MESSAGES, 50.0, 6, seed=3)
    assert result.concurrency == "50/s" and len(result.replies) == 4
    sent = [r.sent - result.replies[0].sent for r in result.replies]
    assert sent == sorted(sent) and sent[-1] < 2.0  # they did not wait for each other
    assert all(r.error is None and r.tokens > 0 for r in result.replies)
