"""`--backend auto` and `--method default`: the choice function's table, the measured-default
record, `--methods default` in the bench, and plain `generate` on a tiny (GGUF-less) model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_bench import tiny_model

import draftsman
from draftsman.backends.choose import Need, choose_backend
from draftsman.backends.llama_cpp import LlamaCppLM
from draftsman.bench.records import fastest_exact, record_fastest
from draftsman.bench.runner import BenchConfig, run_bench
from draftsman.bench.spec import engine_static, parse_engine, parse_methods
from draftsman.cli.main import main
from draftsman.errors import InvalidArgumentError
from draftsman.models.static_step import StaticConfig
from draftsman.strategies import default_method as dm

CAPS = LlamaCppLM.capabilities
EMBEDS = Need("parallel-prompt", "input_embeddings", "prompt-token embeddings")
FACTS = dict(llama_cpp=CAPS, has_gguf=True, has_cuda=False)


def never_called() -> str | None:
    raise AssertionError("the bindings were probed although another condition decided")


@pytest.mark.parametrize("requested, facts, backend, reason", [
    ("auto", {}, "llama.cpp", "no CUDA GPU"),
    ("auto", dict(has_gguf=False, llama_cpp_problem=never_called), "torch", "no GGUF"),
    ("auto", dict(has_cuda=True, llama_cpp_problem=never_called), "torch", "CUDA GPU"),
    ("auto", dict(needs=[EMBEDS], llama_cpp_problem=never_called), "torch",
     "parallel-prompt needs prompt-token embeddings, which llama.cpp does not expose"),
    ("auto", dict(needs=[Need("speculative", "device", "a device")]), "llama.cpp", ""),
    ("auto", dict(llama_cpp_problem=lambda: "libllama.so missing"), "torch",
     "bindings do not load: libllama.so missing"),
    ("auto", dict(dtype="fp32", llama_cpp_problem=never_called), "torch", "--dtype fp32"),
    ("torch", {}, "torch", "asked for"),
    ("llama.cpp", dict(has_gguf=False, has_cuda=True, needs=[EMBEDS]), "llama.cpp",
     "asked for"),
])
def test_choice_table(requested, facts, backend, reason):
    choice = choose_backend(requested, **{**FACTS, **facts})
    assert choice.backend == backend
    assert reason in choice.reason


def test_unknown_backend_is_refused():
    with pytest.raises(InvalidArgumentError, match="unknown backend 'cuda'"):
        choose_backend("cuda", **FACTS)


# ---- the measured-default record -----------------------------------------------------------

def record(**kw) -> dm.Measured:
    base = dict(cpu="CPU-A", target="tgt", backend="llama.cpp", numerics="fast",
                spec="speculative:draft=ngram,gamma=3", tokens_per_second=30.0)
    return dm.Measured(**{**base, **kw})


def test_record_round_trip_and_keys(tmp_path):
    path = tmp_path / "d.json"
    dm.write_record(record(), path)
    dm.write_record(record(target="other", spec="autoregressive"), path)
    dm.write_record(record(spec="speculative:draft=prompt-lookup,gamma=2"), path)  # replaces
    assert len(dm.read_records(path)) == 2
    got = dm.resolve_default("tgt", "llama.cpp", "fast", cpu="CPU-A", path=path)
    assert got.measured and got.spec == "speculative:draft=prompt-lookup,gamma=2"
    assert "30.0 tok/s" in got.reason
    for other in (dict(cpu="CPU-B"), dict(target="nope")):
        args = {"target": "tgt", "cpu": "CPU-A", **other}
        miss = dm.resolve_default(args["target"], "llama.cpp", "fast", cpu=args["cpu"],
                                  path=path)
        assert not miss.measured and miss.spec == dm.DEFAULT_METHOD
    assert dm.resolve_default("tgt", "llama.cpp", "bitwise", cpu="CPU-A",
                              path=path).spec == dm.DEFAULT_METHOD
    torch_default = dm.resolve_default("tgt", "torch", "bf16", cpu="CPU-A", path=path)
    assert torch_default.spec == dm.TORCH_DEFAULT_METHOD


@pytest.mark.parametrize("content", ["{not json", '{"version": 1, "records": [{"cpu": 1}]}',
                                     '{"version": 99, "records": []}', "[1, 2]"])
def test_corrupt_record_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "d.json"
    path.write_text(content)
    warnings: list[str] = []
    got = dm.resolve_default("tgt", "llama.cpp", "fast", cpu="CPU-A", path=path,
                             warn=warnings.append)
    assert got.spec == dm.DEFAULT_METHOD and not got.measured
    assert len(warnings) == 1 and str(path) in warnings[0]
    dm.write_record(record(), path, warn=warnings.append)  # a rewrite repairs it
    assert dm.lookup("tgt", "llama.cpp", "fast", cpu="CPU-A", path=path) == record()


def test_split_spec():
    assert dm.split_spec("speculative:draft=prompt-lookup,gamma=auto") == (
        "speculative", {"draft": "prompt-lookup", "gamma": "auto"})
    assert dm.split_spec("autoregressive") == ("autoregressive", {})


# ---- the bench ------------------------------------------------------------------------------

def test_methods_default_parses_without_options():
    assert [c.label for c in parse_methods("default,speculative:gamma=2")] == [
        "autoregressive", "default", "speculative:gamma=2"]
    with pytest.raises(InvalidArgumentError, match="default takes no options"):
        parse_methods("default:gamma=2")


def row(method: str, tokens: int, seconds: float, kind: str = "draftsman",
        exactness: str = "exact", **options: str) -> dict:
    return {"method": method, "options": options, "kind": kind, "exactness": exactness,
            "new_tokens": tokens, "seconds": seconds}


def test_fastest_exact_skips_peers_and_lossy_methods():
    rows = [row("autoregressive", 10, 1.0, kind="baseline"),
            row("speculative", 10, 0.4, draft="ngram", gamma="2"),
            row("speculative", 10, 0.6, draft="ngram", gamma="2"),  # 20 tokens / 1.0 s
            row("big-little", 10, 0.1, exactness="lossy"),
            row("hf", 10, 0.05, kind="peer")]
    assert fastest_exact(rows) == ("speculative:draft=ngram,gamma=2", pytest.approx(20.0), 20)
    assert fastest_exact([row("hf", 1, 1.0, kind="peer")]) is None
    # plain decoding is a configuration too: when nothing beats it, it is the default
    plain = [row("autoregressive", 30, 1.0, kind="baseline", exactness="reference"),
             row("speculative", 10, 1.0, draft="ngram", gamma="2")]
    assert fastest_exact(plain) == ("autoregressive", pytest.approx(30.0), 30)


def test_a_smaller_run_does_not_replace_a_larger_runs_record(tmp_path):
    path = tmp_path / "d.json"
    assert dm.write_record(record(tokens=5000), path) is None
    kept = dm.write_record(record(spec="autoregressive", tokens=40), path)  # a smoke run
    assert kept is not None and kept.tokens == 5000
    assert dm.read_records(path)[0].spec == "speculative:draft=ngram,gamma=3"
    assert dm.write_record(record(spec="autoregressive", tokens=6000), path) is None
    assert dm.read_records(path)[0].spec == "autoregressive"


def test_the_same_run_again_replaces_its_record_though_its_replies_end_elsewhere(tmp_path):
    path = tmp_path / "d.json"
    assert dm.write_record(record(tokens=1467), path) is None
    assert dm.write_record(record(spec="autoregressive", tokens=1456), path) is None
    assert dm.read_records(path)[0].spec == "autoregressive"
    kept = dm.write_record(record(spec="speculative:draft=suffix,gamma=auto", tokens=1300), path)
    assert kept is not None and kept.spec == "autoregressive"


def test_bench_records_only_greedy_runs_on_catalogue_targets(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    engine = SimpleNamespace(backend="llama.cpp", numerics_key="fast")
    rows = [row("autoregressive", 10, 1.0, kind="baseline"),
            row("speculative", 10, 0.5, draft="prompt-lookup", gamma="auto")]
    smol = "smollm2-135m-instruct"
    record_fastest(smol, 0.7, "fast", engine, rows, lambda _: None)
    record_fastest(str(tmp_path), 0.0, "fast", engine, rows, lambda _: None)
    assert not dm.record_path().exists()
    record_fastest(smol, 0.0, "fast", engine, rows, lambda _: None)
    got = dm.resolve_default("smollm2-135m-instruct", "llama.cpp", "fast")
    assert got.measured and got.spec == "speculative:draft=prompt-lookup,gamma=auto"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("default-choice") / "target", 0)


def tiny_bench(tmp_path: Path, target: Path, dtype: str | None, methods: list[str]):
    """A 4-token bench run of `methods` on one prompt, records under tmp_path/home."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "a", "prompt": "the cat sat on"}) + "\n")
    cfg = BenchConfig(target=str(target), dtype=dtype, datasets=[str(data)], limit=None,
                      max_new_tokens=4, out=str(tmp_path / "run"), progress=False,
                      methods=methods, warmup_tokens=2)
    return run_bench(cfg, log=lambda _: None)


def test_bench_of_default_alone_loads_the_measured_backend_and_dtype(tmp_path, target,
                                                                      monkeypatch):
    """`bench --preset demo` (backend auto, only `default`, no --dtype) times what `draftsman
    generate` runs: the backend and dtype of this machine's fastest record, as engine.load
    picks them, not the rule's bf16 engine; a given dtype keeps the rule."""
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path / "home"))
    dm.write_record(dm.measured_now(str(target), "torch", "fp32",
                                    "speculative:draft=ngram,gamma=2", 99.0))
    result = tiny_bench(tmp_path / "auto", target, None, ["default"])
    assert [r["label"] for r in result.rows] == ["autoregressive",
                                                 "default (speculative:draft=ngram,gamma=2)"]
    run = json.loads((tmp_path / "auto" / "run" / "run.json").read_text())[0]
    assert (run["backend"], run["dtype"]) == ("torch", "fp32")
    given = tiny_bench(tmp_path / "given", target, "bf16", ["default"])
    assert [r["label"] for r in given.rows] == ["autoregressive", "default (autoregressive)"]
    run = json.loads((tmp_path / "given" / "run" / "run.json").read_text())[0]
    assert run["dtype"] == "bf16"


def test_bench_methods_default_times_what_generate_runs(tmp_path, target, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path / "home"))
    result = tiny_bench(tmp_path, target, "fp32", ["default"])
    assert [r["label"] for r in result.rows] == ["autoregressive", "default (autoregressive)"]
    assert result.rows[1]["identical"]
    assert json.loads((tmp_path / "run" / "run.json").read_text())[0]["backend"] == "torch"


# ---- generate with every default ------------------------------------------------------------

def test_generate_defaults_on_a_tiny_model(target, capsys):
    rc = main(["generate", "--target", str(target), "--no-chat", "--max-new-tokens", "4",
               "--dtype", "fp32", "--verbose", "--json", "the cat sat on"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["method"] == "autoregressive"
    assert "backend: torch" in err and "method: default -> autoregressive" in err
    engine = draftsman.load(str(target), dtype="bf16")
    assert engine.backend == "torch" and "no GGUF" in engine.backend_reason
    assert engine.generate("the cat", chat=False, max_new_tokens=3).method == "autoregressive"


def test_generate_takes_the_spec_verbose_prints(target, capsys):
    # what `--verbose` and the bench write (method:key=value,...) is a --method too, and runs
    # as the same options given as flags
    def run(*argv: str) -> dict:
        rc = main(["generate", "--target", str(target), "--no-chat", "--max-new-tokens", "6",
                   "--dtype", "fp32", "--json", *argv, "the cat sat on"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        return json.loads(out)

    spec = run("--method", "speculative:draft=ngram,gamma=2")
    flags = run("--method", "speculative", "--draft", "ngram", "--gamma", "2")
    assert spec["method"] == flags["method"] == "speculative"
    assert spec["options"] == flags["options"] == {"draft": "ngram", "gamma": "2"}
    assert spec["token_ids"] == flags["token_ids"]
    both = run("--method", "speculative:draft=ngram", "--gamma", "2")
    assert both["options"] == {"draft": "ngram", "gamma": "2"}


@pytest.mark.parametrize("argv, needle", [
    (["--method", "speculative:draft=ngram", "--draft", "suffix"],
     "--method sets draft=ngram and a flag sets draft=suffix"),
    (["--method", "speculative:gamma=2,engine=torch-q4"], "--backend torch --dtype q4"),
    (["--method", ":gamma=2"], "name a method before the ':'"),
    (["--method", "speculative:gamma=zero"], "gamma"),
])
def test_a_bad_method_spec_is_one_line_before_loading(argv, needle, capsys):
    # the target does not exist: loading it would fail with another error
    rc = main(["generate", "--target", "/nonexistent/model", *argv, "hello"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and needle in err, err


def test_a_measured_default_is_what_generate_runs(target, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    engine = draftsman.load(str(target), dtype="fp32")
    dm.write_record(dm.measured_now(str(target), "torch", "fp32",
                                    "speculative:draft=ngram,gamma=2", 99.0))
    result = engine.generate("the cat sat on", chat=False, max_new_tokens=6)
    assert result.method == "speculative" and result.options == {"draft": "ngram",
                                                                  "gamma": "2"}
    plain = engine.generate("the cat sat on", chat=False, max_new_tokens=6,
                            method="autoregressive")
    assert result.token_ids == plain.token_ids



# ---- serve -----------------------------------------------------------------------------------

def serve_settings(target: Path, monkeypatch, *flags: str):
    import argparse

    from draftsman.cli import serve_cmd
    from draftsman.server import app

    monkeypatch.setattr(app, "create_app", lambda engine, settings, **_: settings)
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    return serve_cmd.build_app(parser.parse_args(["serve", "--target", str(target),
                                                  "--dtype", "fp32", *flags]))


def test_serve_resolves_the_default_as_generate_does(target, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    settings = serve_settings(target, monkeypatch)  # torch, no record: generate's rule
    assert (settings.method, settings.options) == (dm.TORCH_DEFAULT_METHOD, {})
    dm.write_record(dm.measured_now(str(target), "torch", "fp32",
                                    "speculative:draft=ngram,gamma=3", 50.0))
    settings = serve_settings(target, monkeypatch)
    assert (settings.method, settings.options) == ("speculative", {"draft": "ngram",
                                                                   "gamma": "3"})
    settings = serve_settings(target, monkeypatch, "--method", "autoregressive")
    assert settings.method == "autoregressive"


# ---- backend and dtype by measurement ---------------------------------------------------------

def test_fastest_here_compares_backends_and_dtypes(tmp_path):
    path = tmp_path / "d.json"
    for kw in (dict(backend="llama.cpp", numerics="fast", tokens_per_second=14.0),
               dict(backend="torch", numerics="q8", tokens_per_second=26.8),
               dict(backend="torch", numerics="q4", tokens_per_second=20.0),
               dict(backend="llama.cpp", numerics="bitwise", tokens_per_second=30.0),
               dict(cpu="CPU-B", backend="torch", numerics="bf16", tokens_per_second=99.0),
               dict(target="other", backend="torch", numerics="fp32", tokens_per_second=99.0)):
        dm.write_record(record(**kw), path)
    best = dm.fastest_here("tgt", "fast", cpu="CPU-A", path=path)
    assert (best.backend, best.numerics) == ("torch", "q8")
    best = dm.fastest_here("tgt", "bitwise", cpu="CPU-A", path=path)
    assert (best.backend, best.numerics) == ("llama.cpp", "bitwise")
    assert dm.fastest_here("tgt", cpu="CPU-C", path=path) is None


def test_auto_without_a_dtype_loads_what_was_measured_fastest(target, tmp_path, monkeypatch):
    from draftsman.strategies import default_method as engine_module

    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    assert draftsman.load(str(target)).numerics_key == "bf16"  # no record: the rule
    dm.write_record(dm.measured_now(str(target), "torch", "fp32",
                                    "speculative:draft=ngram,gamma=2", 99.0))
    engine = draftsman.load(str(target))
    assert engine.numerics_key == "fp32" and "measured fastest here" in engine.backend_reason
    assert engine.generate("the cat", chat=False, max_new_tokens=4).method == "speculative"
    # an explicit dtype, backend or method is honoured, not overridden by the record
    assert draftsman.load(str(target), dtype="bf16").numerics_key == "bf16"
    assert "measured" not in draftsman.load(str(target), backend="torch").backend_reason
    assert engine_module.measured_configuration(
        str(target), "fast", [("autoregressive", {})]) is None


# ---- backends and dtypes side by side in one bench run ----------------------------------------

def test_engine_option_is_a_label_not_a_method_option():
    got = parse_methods("speculative:draft=ngram,gamma=2,engine=torch-q4|torch-q8")
    assert [m.label for m in got[1:]] == ["speculative:draft=ngram,gamma=2,engine=torch-q4",
                                         "speculative:draft=ngram,gamma=2,engine=torch-q8"]
    assert got[1].engine == "torch-q4" and "engine" not in got[1].kwargs()
    assert got[1].without_engine().label == "speculative:draft=ngram,gamma=2"
    for bad in ("torch", "cuda-q4", "torch-q5", "torch-bf16+eager", "llama.cpp+static"):
        with pytest.raises(InvalidArgumentError):
            parse_methods(f"autoregressive:engine={bad}")


def test_engine_tags_choose_the_kind_of_step():
    """`+static` / `+compiled` time step kinds side by side (the GPU check's AR rows)."""
    assert parse_engine("torch-bf16+compiled") == ("torch", "bf16")
    assert engine_static("torch-bf16") is False and engine_static("torch-bf16+static") is True
    assert engine_static("torch-bf16+compiled") == StaticConfig(compile=True)


def test_each_engine_gets_its_own_record(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    engine = SimpleNamespace(backend="llama.cpp", numerics_key="fast")
    rows = [row("autoregressive", 10, 1.0, kind="baseline"),
            row("speculative", 10, 0.5, draft="suffix", gamma="auto"),
            row("autoregressive", 10, 0.8, engine="torch-q4"),
            row("speculative", 10, 0.25, draft="prompt-lookup", gamma="auto", engine="torch-q4")]
    assert fastest_exact(rows)[0] == "speculative:draft=suffix,gamma=auto"
    assert fastest_exact(rows, "torch-q4")[0] == "speculative:draft=prompt-lookup,gamma=auto"
    record_fastest("smollm2-135m-instruct", 0.0, "fast", engine, rows, lambda _: None)
    best = dm.fastest_here("smollm2-135m-instruct", "fast")
    assert (best.backend, best.numerics, best.spec) == (
        "torch", "q4", "speculative:draft=prompt-lookup,gamma=auto")
    assert dm.lookup("smollm2-135m-instruct", "llama.cpp", "fast").spec.startswith(
        "speculative:draft=suffix")


def test_a_run_times_a_second_engine_beside_its_own(tmp_path, target, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path / "home"))
    result = tiny_bench(tmp_path, target, "bf16", ["autoregressive:engine=torch-fp32",
                                                   "speculative:draft=ngram,gamma=2,"
                                                   "engine=torch-fp32"])
    labels = [r["label"] for r in result.rows]
    assert labels == ["autoregressive", "autoregressive:engine=torch-fp32",
                      "speculative:draft=ngram,gamma=2,engine=torch-fp32"]
    assert result.rows[2]["options"]["engine"] == "torch-fp32"
    assert result.rows[2]["token_ids"] == result.rows[1]["token_ids"]  # exact on its engine
