"""The benchmark harness: method specs, metrics on hand-built Steps, quality and pass@1,
end-to-end runs on tiny random models (report, slowed method, interrupt + resume, compare)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import transformers

from draftsman.bench import metrics, quality
from draftsman.bench.report import compare, write_report
from draftsman.bench.results import RESULTS, ResultsFile
from draftsman.bench.runner import BenchConfig, run_bench
from draftsman.bench.spec import expand_value, parse_methods
from draftsman.core import Step
from draftsman.errors import InvalidArgumentError
from draftsman.strategies import registry
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.testing.tiny_models import tiny_tokenizer
from draftsman.theory.speculative import expected_speedup

# ----------------------------------------------------------------------------- method specs


def labels(text: str | list[str]) -> list[str]:
    return [c.label for c in parse_methods(text)]


def test_specs_split_options_from_methods():
    assert labels("speculative:gamma=auto,gamma_policy=heuristic,autoregressive") == [
        "autoregressive", "speculative:gamma=auto,gamma_policy=heuristic"]
    assert labels("speculative:gamma=4,speculative:draft=ngram;staged:subdraft=ngram,gamma=4") \
        == ["autoregressive", "speculative:gamma=4", "speculative:draft=ngram",
            "staged:subdraft=ngram,gamma=4"]
    assert labels(["speculative", "speculative"]) == ["autoregressive", "speculative"]
    config = parse_methods("speculative:draft=ngram,gamma=4,max-gamma=8")[1]
    assert config.kwargs() == {"draft": "ngram", "gamma": 4, "max_gamma": 8}


def test_sweeps_expand_to_every_combination():
    assert labels("speculative:gamma=1|2|3")[1:] == [
        "speculative:gamma=1", "speculative:gamma=2", "speculative:gamma=3"]
    grid = labels("big-little:fallback=0.3..0.9,rollback=2..8")[1:]
    assert len(grid) == 7 * 7
    assert grid[0] == "big-little:fallback=0.3,rollback=2"
    assert grid[-1] == "big-little:fallback=0.9,rollback=8"
    assert expand_value("0.25..0.3") == ["0.25", "0.26", "0.27", "0.28", "0.29", "0.30"]
    assert expand_value("0.2..0.8..0.2") == ["0.2", "0.4", "0.6", "0.8"]
    assert expand_value("1..3|5|7") == ["1", "2", "3", "5", "7"]
    assert expand_value("../models/draft") == ["../models/draft"]  # a path, not a range


@pytest.mark.parametrize("bad", ["gamma=4", "speculative:gamma", "speculative:gamma=3..1",
                                 "speculative:gamma=1,gamma=2", "spec ulative",
                                 "speculative:gamma=1..100000"])
def test_bad_specs_are_refused(bad):
    with pytest.raises(InvalidArgumentError):
        parse_methods(bad)


# ----------------------------------------------------------------------------- metrics


def spec_steps(pattern: list[tuple[int, int, bool]], draft_s: float = 0.01,
               verify_s: float = 0.1) -> list[Step]:
    """A prefill step, then (drafted, accepted, rejected) steps with fixed timings."""
    steps = [Step([1], ["target"], target_forwards=1, prefill=True, verify_seconds=verify_s)]
    for drafted, accepted, rejected in pattern:
        n = accepted + 1
        steps.append(Step([2] * n, ["draft"] * accepted + ["target"], drafted=drafted,
                          accepted=accepted, rejected=rejected, target_forwards=1,
                          draft_forwards=drafted, draft_seconds=draft_s * drafted,
                          verify_seconds=verify_s, other_seconds=0.001,
                          extra={"gamma": drafted}))
    return steps


def test_step_metrics_alpha_tau_gamma_and_prediction():
    steps = spec_steps([(4, 4, False), (4, 2, True), (4, 0, True), (4, 3, True)])
    m = metrics.step_metrics(steps)
    # α (MLE): accepted / (accepted + rejections) = 9 / (9 + 3)
    assert m["alpha"] == pytest.approx(9 / 12)
    assert m["acceptance_rate"] == pytest.approx(9 / 16)
    # τ: 1 + (5 + 3 + 1 + 4) tokens over 5 target forwards
    assert m["new_tokens"] == 14 and m["tau"] == pytest.approx(14 / 5)
    assert m["gamma"] == 4.0
    assert m["cost_ratio"] == pytest.approx(0.01 / 0.1)
    assert m["guess_cost"] == pytest.approx(0.01 / 0.1)
    assert m["predicted_speedup"] == pytest.approx(expected_speedup(0.75, 4, 0.1))
    assert m["accepted_runs"] == [4, 2, 0, 3] and m["gammas"] == [4, 4, 4, 4]


def test_prediction_for_drafters_without_forwards():
    steps = spec_steps([(4, 4, False), (4, 1, True)], draft_s=0.001)
    for s in steps:
        s.draft_forwards = 0  # an n-gram drafter: guesses cost time but no forward
    m = metrics.step_metrics(steps)
    assert m["cost_ratio"] is None and m["guess_cost"] == pytest.approx(0.01)
    assert m["predicted_speedup"] == pytest.approx(expected_speedup(5 / 6, 4, 0.01))


def test_prediction_on_hardware_generalises_the_paper():
    assert metrics.predicted_on_hardware(0.8, 4, 0.1, 1.0) == pytest.approx(
        expected_speedup(0.8, 4, 0.1))
    assert metrics.predicted_on_hardware(0.8, 4, 0.1, 1.5, drafting_share=0.0) == \
        pytest.approx(1 / 1.5)
    half = metrics.predicted_on_hardware(0.5, 2, 0.0, 1.0, drafting_share=0.5)
    assert half == pytest.approx(0.5 * 1.75 + 0.5)


def test_staged_alpha_per_stage():
    steps = spec_steps([(4, 4, False), (4, 1, True)])
    steps[1].extra.update(sub_drafted=6, sub_accepted=3, sub_rejections=1)
    steps[2].extra.update(sub_drafted=6, sub_accepted=1, sub_rejections=1)
    m = metrics.step_metrics(steps)
    assert m["alpha_draft"] == pytest.approx(4 / 6)
    assert m["alpha"] == pytest.approx(5 / 6)


def row(label: str, key: str, repeat: int, seconds: float, tokens: int, **extra) -> dict:
    return {"label": label, "prompt_key": key, "repeat": repeat, "seconds": seconds,
            "new_tokens": tokens, "dataset": "d", "kind": "draftsman", **extra}


def test_speedup_is_time_per_token_ratio_with_median_and_spread():
    rows = [row("autoregressive", "p1", 0, 2.0, 10), row("autoregressive", "p2", 0, 4.0, 10),
            row("autoregressive", "p1", 1, 2.2, 10), row("autoregressive", "p2", 1, 3.8, 10),
            row("fast", "p1", 0, 1.0, 10), row("fast", "p2", 0, 1.0, 10),
            row("fast", "p1", 1, 1.0, 10), row("fast", "p2", 1, 1.0, 10),
            row("fast", "p3", 0, 9.0, 10)]  # a prompt the baseline lacks: not compared
    base, fast = metrics.summarise(rows)
    assert base.label == "autoregressive" and base.speedup == pytest.approx(1.0)
    assert fast.prompts == 2
    # medians over repeats: baseline 2.1 + 3.9 = 6 s, fast 2 s for 20 tokens each
    assert fast.speedup == pytest.approx(3.0)
    assert fast.speedup_median == pytest.approx((2.1 + 3.9) / 2)
    assert fast.speedup_min == pytest.approx(3.0) and fast.speedup_max == pytest.approx(3.0)
    assert fast.tokens_per_second == pytest.approx(10.0)


def test_speedup_normalises_by_tokens_when_lengths_differ():
    rows = [row("autoregressive", "p", 0, 4.0, 20), row("lossy", "p", 0, 1.0, 10)]
    assert metrics.summarise(rows)[1].speedup == pytest.approx(2.0)


def test_pooled_alpha_and_prediction_over_rows():
    a = metrics.step_metrics(spec_steps([(4, 4, False), (4, 0, True)]))
    b = metrics.step_metrics(spec_steps([(2, 1, True)]))
    rows = [row("autoregressive", "p1", 0, 1.0, 5), row("autoregressive", "p2", 0, 1.0, 5),
            {**row("s", "p1", 0, 0.5, 5), **a, "seconds": 0.5},
            {**row("s", "p2", 0, 0.5, 5), **b, "seconds": 0.5}]
    s = metrics.summarise(rows)[1]
    assert s.alpha == pytest.approx(5 / 7)
    assert s.gamma == pytest.approx(10 / 3)
    assert s.predicted_speedup == pytest.approx(expected_speedup(5 / 7, 10 / 3, 0.1))
    assert s.oracle_speedup is not None and s.oracle_speedup > 1
    assert s.verify_cost is None  # the hand-built baseline rows carry no Steps


# ----------------------------------------------------------------------------- quality

PROBLEM = {
    "prompt": "from typing import List\n\n\ndef add(xs: List[int]) -> int:\n"
              "    \"\"\"Sum of xs.\"\"\"\n",
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
            "    assert candidate([]) == 0\n",
}


def test_pass_at_1_on_right_and_wrong_solutions():
    good = "Here it is:\n```python\ndef add(xs):\n    return sum(xs)\n```\nDone."
    body_only = "    return sum(xs)\n"
    wrong = "```python\ndef add(xs):\n    return len(xs)\n```"
    crash = "```python\nimport sys\ndef add(xs):\n    sys.exit(0 if False else 3)\n```"
    assert quality.pass_at_1(good, PROBLEM)
    assert quality.pass_at_1(body_only, PROBLEM)
    assert not quality.pass_at_1(wrong, PROBLEM)
    assert not quality.pass_at_1(crash, PROBLEM)
    truncated = "```python\ndef add(xs):\n    return sum(xs)\n"  # fence never closed
    assert quality.pass_at_1(truncated, PROBLEM)


def test_pass_at_1_times_out():
    loop = "```python\ndef add(xs):\n    while True:\n        pass\n```"
    t0 = time.perf_counter()
    assert not quality.pass_at_1(loop, PROBLEM, timeout=1.0)
    assert time.perf_counter() - t0 < 10


def test_agreement_and_text_metrics():
    assert quality.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert quality.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert quality.first_divergence([1, 2], [1, 2, 3]) == 2
    assert quality.rouge_l("the cat sat", "the cat sat") == pytest.approx(1.0)
    stats = [quality.bleu_stats("a b c d e f", "a b c d e f")] * 2
    assert quality.corpus_bleu(stats) == pytest.approx(100.0)
    assert quality.corpus_bleu([]) is None


# ----------------------------------------------------------------------------- tiny models


def tiny_model(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    vocab = tiny_tokenizer(folder)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench-models")
    return tiny_model(root / "target", 0), tiny_model(root / "draft", 1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench-data") / "tiny.jsonl"
    records = [
        {"id": "add", "prompt": "def add(xs): return", "reference": " sum(xs)", **PROBLEM},
        {"id": "cat", "prompt": "the cat sat on", "reference": "the mat"},
        {"id": "spec", "prompt": "speculative decoding drafts", "reference": "tokens"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def config(out: Path, models, dataset, **kw) -> BenchConfig:
    target, draft = models
    base = dict(target=str(target), draft=str(draft), dtype="fp32", datasets=[str(dataset)],
                limit=None, max_new_tokens=8, repeats=1, out=str(out), progress=False,
                methods=["speculative:draft=ngram,gamma=2"], warmup_tokens=2, pass_timeout=5)
    base.update(kw)
    return BenchConfig(**base)


def quiet(_: str) -> None:
    pass


def test_end_to_end_rows_report_and_exactness(tmp_path, models, dataset):
    cfg = config(tmp_path / "run", models, dataset, repeats=2, peers=["hf"],
                 methods=["speculative:draft=ngram,gamma=2", "speculative:gamma=1|3",
                          "staged:subdraft=ngram,gamma=3"])
    result = run_bench(cfg, log=quiet)
    labels_ = ["autoregressive", "speculative:draft=ngram,gamma=2", "speculative:gamma=1",
               "speculative:gamma=3", "staged:subdraft=ngram,gamma=3", "hf", "hf:assisted",
               "hf:prompt-lookup"]
    rows = ResultsFile(cfg.out).rows()
    assert len(rows) == 3 * 2 * len(labels_) == result.measured
    assert [r["label"] for r in rows[: len(labels_)]] == labels_  # interleaved, baseline first
    env = rows[0]["env"]
    assert env["dtype"] == "fp32" and env["torch"] == torch.__version__ and env["cpu"]
    for r in rows:
        assert r["new_tokens"] == len(r["token_ids"]) <= 8
        if r["label"] != "autoregressive":
            assert r["identical"], r["label"]  # fp32: exact methods (and HF) agree
    add_rows = [r for r in rows if r["prompt_id"] == "add"]
    assert all("pass_at_1" in r and "rouge_l_ref" in r for r in add_rows)
    summaries = {s.label: s for s in metrics.summarise(rows)}
    assert summaries["speculative:gamma=3"].alpha is not None
    assert summaries["staged:subdraft=ngram,gamma=3"].alpha_draft is not None
    assert summaries["speculative:gamma=1"].gamma == pytest.approx(1.0)

    out = Path(cfg.out)
    html = (out / "report.html").read_text()
    plots = sorted(out.glob("*.png"))
    assert {p.name for p in plots} == {"speedup_vs_gamma.png", "tokens_per_second.png",
                                       "quality_vs_latency.png"}
    for p in plots:
        assert p.stat().st_size > 1000 and p.name in html
    summary = (out / "summary.md").read_text()
    assert "Staged: α per stage" in summary and "| speculative:gamma=3 |" in summary
    assert json.loads((out / "summary.json").read_text())["methods"][0]["label"] == \
        "autoregressive"


class Slowed(Autoregressive):
    """Autoregressive decoding with a sleep per step: must show as slower."""

    def generate(self, prompt_ids, config):
        for step in super().generate(prompt_ids, config):
            time.sleep(0.02)
            yield step


def test_slowed_method_shows_as_slower(tmp_path, models, dataset, monkeypatch):
    monkeypatch.setitem(registry.METHODS, "slowed", registry.Method(
        registry.AutoregressiveOptions, lambda engine, options: Slowed(engine.target.model)))
    cfg = config(tmp_path / "slow", models, dataset, methods=["slowed"], limit=2)
    rows = run_bench(cfg, log=quiet).rows
    base, slow = metrics.summarise(rows)
    assert slow.label == "slowed"
    assert slow.speedup < 0.7 and base.tokens_per_second > slow.tokens_per_second
    assert slow.identical_rate == 1.0


class Interrupting(Autoregressive):
    calls = 0
    fail_at = 3  # the warm-up is call 1

    def generate(self, prompt_ids, config):
        type(self).calls += 1
        if type(self).calls == self.fail_at:
            raise KeyboardInterrupt
        yield from super().generate(prompt_ids, config)


def test_interrupted_run_keeps_rows_and_resumes(tmp_path, models, dataset, monkeypatch):
    monkeypatch.setitem(registry.METHODS, "flaky", registry.Method(
        registry.AutoregressiveOptions, lambda engine, options: Interrupting(engine.target.model)))
    Interrupting.calls, Interrupting.fail_at = 0, 3
    out = tmp_path / "crash"
    cfg = config(out, models, dataset, methods=["flaky"])
    with pytest.raises(KeyboardInterrupt):
        run_bench(cfg, log=quiet)
    kept = ResultsFile(out).rows()
    # order: (add: AR, flaky), (cat: AR, flaky*) -> three rows before the interrupt
    assert [(r["prompt_id"], r["label"]) for r in kept] == [
        ("add", "autoregressive"), ("add", "flaky"), ("cat", "autoregressive")]
    with open(out / RESULTS, "a") as f:
        f.write('{"label": "half a row')  # a crash in the middle of a write
    with pytest.raises(InvalidArgumentError, match="--resume"):
        run_bench(cfg, log=quiet)
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        run_bench(config(out, models, dataset, methods=["flaky"], max_new_tokens=4,
                         resume=True), log=quiet)
    Interrupting.fail_at = -1
    result = run_bench(config(out, models, dataset, methods=["flaky"], resume=True), log=quiet)
    assert result.measured == 3
    rows = ResultsFile(out).rows()
    keys = [(r["prompt_id"], r["label"]) for r in rows]
    assert len(rows) == 6 and len(set(keys)) == 6
    assert (out / "report.html").exists()


def test_resume_refuses_rows_timed_on_another_machine(tmp_path, models, dataset):
    out = tmp_path / "moved"
    run_bench(config(out, models, dataset, limit=1), log=quiet)
    rows = ResultsFile(out).rows()
    assert rows and all(r["env"]["isa"] and r["env"]["cpu"] for r in rows)
    rows[0]["env"]["cpu"] = "Some Other CPU"
    (out / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InvalidArgumentError, match="another machine.*Some Other CPU"):
        run_bench(config(out, models, dataset, limit=2, resume=True), log=quiet)
    assert len(ResultsFile(out).rows()) == len(rows)  # nothing appended
    for r in rows:  # older rows without the field: only the keys they carry are compared
        r["env"].pop("isa")
        r["env"]["cpu"] = rows[-1]["env"]["cpu"]
    (out / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_bench(config(out, models, dataset, limit=2, resume=True),
                     log=quiet).measured > 0


def test_multi_turn_prompts_carry_each_methods_own_answers(tmp_path, models):
    import shutil

    target = tmp_path / "chat-target"
    shutil.copytree(models[0], target)
    template = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
                "<assistant>")
    (target / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<eos>", "chat_template": template}))
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"id": "c", "prompt": "the cat", "turns": ["the cat", "sat on"]})
                    + "\n")
    cfg = config(tmp_path / "turns", (target, models[1]), data, turns="all")
    rows = run_bench(cfg, log=quiet).rows
    assert sorted((r["turn"], r["label"]) for r in rows) == [
        (1, "autoregressive"), (1, "speculative:draft=ngram,gamma=2"),
        (2, "autoregressive"), (2, "speculative:draft=ngram,gamma=2")]
    first, second = (next(r for r in rows if r["turn"] == t) for t in (1, 2))
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"] - 1
    assert all(r["identical"] for r in rows if r["label"] != "autoregressive")


def test_compare_and_report_only(tmp_path, models, dataset):
    a = run_bench(config(tmp_path / "a", models, dataset, limit=1), log=quiet).out
    b = run_bench(config(tmp_path / "b", models, dataset, limit=1,
                         methods=["speculative:draft=prompt-lookup,gamma=2"]), log=quiet).out
    text = compare(a, b)
    assert "speculative:draft=ngram,gamma=2" in text and "prompt-lookup" in text
    (Path(a) / "report.html").unlink()
    paths = write_report(a)
    assert paths["html"].exists()
    runs = json.loads((Path(a) / "run.json").read_text())
    assert len(runs) == 1 and runs[0]["methods"] == ["speculative:draft=ngram,gamma=2"]


def test_cli_presets_and_overrides(monkeypatch):
    from draftsman.cli.bench_cmd import config_from_args
    from draftsman.cli.main import build_parser

    parse = build_parser().parse_args
    cfg = config_from_args(parse(["bench", "--preset", "demo", "--max-new-tokens", "16"]))
    assert cfg.methods == ["default"] and cfg.max_new_tokens == 16
    assert cfg.backend == "auto" and cfg.peers == ["llama.cpp:plain", "hf:plain"]
    assert cfg.datasets == ["humaneval", "mt-bench"] and cfg.peers
    cfg = config_from_args(parse(["bench", "--methods", "speculative:gamma=2",
                                  "--dataset", "humaneval,mt-bench", "--limit", "3"]))
    assert cfg.methods == ["speculative:gamma=2"] and cfg.limit == 3 and not cfg.peers
    with pytest.raises(InvalidArgumentError):
        config_from_args(parse(["bench", "--resume"]))


def test_torch_q4_preset_runs_the_torch_only_methods_on_q4():
    """--preset torch-q4: the three torch-only methods and prompt lookup on the q4 target
    beside llama.cpp's plain loop, small enough for a 2-core CPU; --dtype overrides it."""
    from draftsman.bench.peers import parse_peers
    from draftsman.bench.presets import PRESETS
    from draftsman.cli.bench_cmd import config_from_args
    from draftsman.cli.main import build_parser

    parse = build_parser().parse_args
    cfg = config_from_args(parse(["bench", "--preset", "torch-q4"]))
    assert (cfg.backend, cfg.dtype, cfg.temperature, cfg.max_new_tokens) == ("torch", "q4",
                                                                            0.0, 128)
    assert cfg.datasets == ["humaneval", "mt-bench"] and cfg.turns == "first"
    assert parse_peers(cfg.peers) == [("llama.cpp", "plain")]
    configs = parse_methods(cfg.methods)
    assert [c.method for c in configs] == ["autoregressive", "parallel-prompt",
                                           "parallel-prompt", "pipelined", "big-little",
                                           "big-little", "speculative"]
    for c in configs:  # every option is valid for its method (nothing is loaded)
        registry.method_options(c.method, c.kwargs())
    labels = [c.label for c in configs]
    assert "parallel-prompt:tree_size=auto" in labels
    assert "pipelined:workers=1,threads=1,main_threads=1,exit_head=shared" in labels
    assert {c.get("early_exit") for c in configs if c.method == "big-little"} == {"14", "21"}
    assert "speculative:draft=prompt-lookup,gamma=auto" in labels
    # ~20 s a 128-token generation at q4 speed, prefill included: under 25 minutes
    generations = 2 * cfg.limit * (len(configs) + len(cfg.peers))
    assert generations * 20 <= 25 * 60
    assert config_from_args(parse(["bench", "--preset", "torch-q4", "--dtype", "bf16"])
                            ).dtype == "bf16"
    # no --dtype: decided when the run starts (bf16 unless auto finds a measured record)
    assert config_from_args(parse(["bench", "--preset", "cpu"])).dtype is None
    assert all(p.dtype in (None, "bf16", "fp32", "q4", "q8") for p in PRESETS.values())


def test_a_tree_copied_without_its_history_names_its_commit(monkeypatch) -> None:
    """A lent GPU machine's git holds the session's first commit, not the tree's: rows say
    the commit DRAFTSMAN_COMMIT names there, and the checkout's own everywhere else."""
    from draftsman.bench.results import git_commit

    monkeypatch.delenv("DRAFTSMAN_COMMIT", raising=False)
    own = git_commit()
    assert own is None or len(own.removesuffix("+dirty")) == 40
    monkeypatch.setenv("DRAFTSMAN_COMMIT", "f51df96")
    assert git_commit() == "f51df96"
