"""Method options and backend capabilities: one declaration per method, read by the CLI,
the Python API, the server and the benchmark; a bad value fails in one line naming the
option, before any model loads."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from types import SimpleNamespace

import httpx2 as httpx
import pytest
from test_server import NAME, save_model, save_tokenizer, serving

import draftsman
from draftsman.bench.spec import parse_methods
from draftsman.cli.main import main
from draftsman.errors import InvalidArgumentError, UnsupportedError
from draftsman.models.protocol import Capabilities, require
from draftsman.strategies import registry
from draftsman.strategies.options import OptionError, parse
from draftsman.strategies.registry import METHODS, SpeculativeOptions, make_strategy

# one bad value per method: (method, option, value, HTTP status)
BAD = [
    ("autoregressive", "gamma", "3", 422),  # takes no options
    ("speculative", "gamma", "0", 400),
    ("speculative", "max_gamma", "many", 422),
    ("staged", "subgamma", "x", 422),
    ("big-little", "fallback", "1.5", 400),
    ("big-little", "distance", "cosine", 400),
    ("pipelined", "workers", "0", 400),
    ("parallel-prompt", "tree", "oak", 400),
    ("parallel-prompt", "tree_size", "2.5", 422),
]
IDS = [f"{m}-{o}" for m, o, _, _ in BAD]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> draftsman.Engine:
    folder = tmp_path_factory.mktemp("options") / NAME
    folder.mkdir()
    save_model(folder, save_tokenizer(folder), seed=1)
    return draftsman.load(str(folder), dtype="fp32")


def test_every_method_declares_its_options():
    assert set(METHODS) == {"autoregressive", "speculative", "staged", "big-little",
                            "pipelined", "parallel-prompt"}
    # parallel-prompt takes a draft only by name: --draft filling it in would turn it into
    # the speculative combination (the bench did, before the first GPU run)
    assert [n for n, m in METHODS.items() if m.takes_draft] == [
        "speculative", "staged", "big-little"]
    assert "draft" in {f.name for f in dataclasses.fields(METHODS["parallel-prompt"].options)}
    o = parse(SpeculativeOptions, {"gamma": "auto", "branches": "3", "drafter": "ngram"},
              "speculative")
    assert (o.gamma, o.branches, o.draft, o.max_gamma) == ("auto", 3, "ngram", 12)
    assert parse(SpeculativeOptions, {"gamma": 5.0, "max_gamma": None}, "speculative") \
        == SpeculativeOptions(gamma=5)


@pytest.mark.parametrize("method,name,value,status", BAD, ids=IDS)
def test_parser_names_the_option(method, name, value, status):
    with pytest.raises(OptionError) as info:
        registry.method_options(method, {name: value})
    assert info.value.option == name and info.value.status == status
    assert name in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("method,name,value,status", BAD, ids=IDS)
def test_cli_fails_before_loading(method, name, value, status, capsys):
    # the target does not exist: loading it would fail with another error
    code = main(["generate", "hello", "--target", "/nonexistent/model", "--method", method,
                 "--option", f"{name}={value}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and name in err and "\n" not in err, err
    assert "nonexistent" not in err


@pytest.mark.parametrize("method,name,value,status", BAD, ids=IDS)
def test_python_api_names_the_option(engine, method, name, value, status):
    with pytest.raises(InvalidArgumentError, match=name):
        engine.prepare("hello", method=method, **{name: value})
    with pytest.raises(InvalidArgumentError, match=name):
        engine.generate("hello", method=method, max_new_tokens=2, **{name: value})


def test_server_names_the_option(engine):
    with serving(engine) as live:
        for method, name, value, status in BAD:
            body = {"model": NAME, "prompt": "hello", "max_tokens": 2,
                    "draftsman": {"method": method, name: value}}
            response = httpx.post(f"{live.url}/v1/completions", json=body, timeout=30)
            assert response.status_code == status, (method, name, response.text)
            error = response.json()["error"]
            assert error["param"] == f"draftsman.{name}" and name in error["message"]


def test_bench_specs_use_the_same_parser():
    with pytest.raises(OptionError, match="fallback"):
        parse_methods("big-little:fallback=0.5..1.5")
    with pytest.raises(InvalidArgumentError, match="unknown method"):
        parse_methods("telepathy")


def test_help_options_lists_the_declaration(capsys):
    assert main(["generate", "--method", "big-little", "--help-options"]) == 0
    out = capsys.readouterr().out
    assert "fallback (float, default 0.5)" in out
    assert "max_small (int | 'off', default 10)" in out
    assert "choices: cross-entropy, total-variation, kl" in out
    assert main(["generate", "--method", "autoregressive", "--help-options"]) == 0
    assert "none" in capsys.readouterr().out


LLAMA_LIKE = Capabilities(backend="llama.cpp", layer_ranges=False, input_embeddings=False,
                          hidden_states=False, exact_tree_keep=False, max_tree_rows=64,
                          device="cpu", numerics="llama.cpp")


def test_capabilities_are_checked_by_name(engine):
    caps = engine.target.model.capabilities
    assert caps.hidden_states and caps.exact_tree_keep and caps.max_tree_rows is None
    require(caps, "hidden_states", "pipelined", "hidden states")
    with pytest.raises(UnsupportedError, match="hidden_states.*--backend torch"):
        require(LLAMA_LIKE, "hidden_states", "pipelined", "hidden states")
    model = SimpleNamespace(capabilities=LLAMA_LIKE)
    fake = SimpleNamespace(target=SimpleNamespace(model=model))
    for method, options in (("pipelined", {}), ("parallel-prompt", {}),
                            ("big-little", {"early_exit": 1})):
        with pytest.raises(UnsupportedError, match="llama.cpp backend.*--backend torch"):
            make_strategy(method, fake, options)
    with pytest.raises(InvalidArgumentError, match="trees of up to 64"):
        make_strategy("speculative", SimpleNamespace(target=SimpleNamespace(model=model)),
                      {"draft": "ngram", "branches": 8})
    assert replace(caps, exact_tree_keep=False).exact_tree_keep is False


def test_bitwise_numerics_on_torch_is_refused_before_loading():
    with pytest.raises(InvalidArgumentError, match="--numerics bitwise.*llama.cpp"):
        draftsman.load("no-such-model", backend="torch", numerics="bitwise")
    with pytest.raises(InvalidArgumentError, match="unknown --numerics"):
        draftsman.load("no-such-model", backend="llama.cpp", numerics="approximate")


def test_the_suffix_drafter_is_an_option(capsys):
    assert main(["generate", "--method", "speculative", "--help-options"]) == 0
    assert "suffix" in capsys.readouterr().out
    options = registry.method_options("speculative", {"draft": "suffix", "gamma": "auto",
                                                      "branches": "auto"})
    assert options.draft == "suffix"
