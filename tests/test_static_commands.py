"""`--static` on bench and profile: the same tokens as the eager path (fp32, tiny models),
recorded in the run's settings and environment, and a profile of its own."""

from __future__ import annotations

import json
from pathlib import Path

from test_bench import config, dataset, models, quiet  # noqa: F401 (fixtures)

from draftsman import profiling
from draftsman.bench.results import ResultsFile
from draftsman.bench.runner import run_bench
from draftsman.cli.bench_cmd import config_from_args
from draftsman.cli.main import build_parser, main
from draftsman.engine import load_bundle
from draftsman.profiling import model_kind

METHODS = ["speculative:draft=ngram,gamma=2", "speculative:gamma=3"]


def _tokens(out: Path) -> dict[tuple[str, str], list[int]]:
    return {(r["prompt_id"], r["label"]): r["token_ids"] for r in ResultsFile(out).rows()}


def test_bench_static_generates_the_eager_tokens(tmp_path, models, dataset) -> None:  # noqa: F811
    eager = config(tmp_path / "eager", models, dataset, methods=METHODS, backend="torch")
    static = config(tmp_path / "static", models, dataset, methods=METHODS, static=True)
    run_bench(eager, log=quiet)
    run_bench(static, log=quiet)
    assert _tokens(tmp_path / "static") == _tokens(tmp_path / "eager")
    rows = ResultsFile(tmp_path / "static").rows()
    assert rows[0]["env"]["static"] is True
    assert ResultsFile(tmp_path / "eager").rows()[0]["env"]["static"] is False
    assert static.settings()["static"] is True and "static" not in eager.settings()


def test_bench_and_profile_take_static() -> None:
    parser = build_parser()
    for command in (["bench"], ["profile"]):
        assert parser.parse_args(command + ["--static"]).static
        assert not parser.parse_args(command).static
    assert config_from_args(parser.parse_args(["bench", "--static"])).static


def test_profile_static_is_a_profile_of_its_own(tmp_path, models, monkeypatch,  # noqa: F811
                                                capsys) -> None:
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path / "home"))
    target = str(models[0])
    kinds = []
    for extra in ([], ["--static"]):
        assert main(["profile", "--target", target, "--dtype", "fp32", "--device", "cpu",
                     "--lengths", "1,4", "--context", "8", "--repeats", "1", "--threads", "1",
                     "--json", *extra]) == 0
        kinds.append(json.loads(capsys.readouterr().out)["profile"])
    assert kinds[0] != kinds[1] and "static" in kinds[1]
    static = load_bundle(target, "fp32", device="cpu", static=True)
    assert model_kind(static.model, "fp32") == "fp32-static"


def test_profile_json_records_where_and_how_it_was_timed(tmp_path, models, monkeypatch,  # noqa: F811
                                                         capsys) -> None:
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(profiling, "STREAM_PROBE_MIB", 4)
    assert main(["profile", "--target", str(models[0]), "--dtype", "fp32", "--device", "cpu",
                 "--lengths", "1,2", "--context", "8", "--repeats", "1", "--threads", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the host's memory stream before and after the curve, in the output and the profile
    stream = out["stream_gbs"]
    assert stream is None or (len(stream) == 2 and min(stream) > 0)
    saved = json.loads(Path(out["profile"]).read_text())
    assert saved["stream_gbs"] == stream
    # and its dot products; no floor for float weights (records_floor: records products only)
    dots = out["dots_g"]
    assert dots is None or (len(dots) == 2 and min(dots) > 0)
    assert saved["dots_g"] == dots and out["floor"] is None and saved["floor"] is None
    assert set(out["latency"]) == {"1", "2"}
    # each round's L(n) / L(1): least, median, most (one round here), saved beside the curve
    ratios = out["round_ratios"]
    assert ratios["1"] == [1.0, 1.0, 1.0] and saved["round_ratios"] == ratios
    least, mid, most = ratios["2"]
    assert least == mid == most and abs(most - out["latency"]["2"] / out["latency"]["1"]) < 1e-9
    assert out["settings"] == {"model": str(models[0]), "backend": "torch", "lengths": [1, 2],
                               "context": 8, "repeats": 1, "greedy": False}
    env = out["env"]
    assert env["threads"] == 1 and env["dtype"] == "fp32" and "git_commit" in env
    assert {"cpu", "isa", "cores", "torch"} <= set(env)
    assert out["command"].startswith("draftsman")
    # greedy verifies: their own profile, named so, beside the logits one
    assert main(["profile", "--target", str(models[0]), "--dtype", "fp32", "--device", "cpu",
                 "--lengths", "1,2", "--context", "8", "--repeats", "1", "--threads", "1",
                 "--json", "--greedy"]) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert greedy["settings"]["greedy"] and greedy["profile"].endswith("-fp32-greedy-t1.json")
    assert set(greedy["latency"]) == {"1", "2"} and greedy["profile"] != out["profile"]
