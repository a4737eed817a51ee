"""OpenVINO GenAI as a peer: the --peer spec, the one-line errors when the package or the
exported folder is missing (always run), and a real plain + lookup run on the int4 export
(only where openvino-genai is installed and `make openvino` has exported the model)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsman.bench import peer_openvino as peer
from draftsman.bench.contestants import Sampling
from draftsman.bench.peers import parse_peers
from draftsman.bench.runner import BenchConfig, openvino_peers
from draftsman.errors import BackendError, InvalidArgumentError
from draftsman.store.home import HOME_ENV

TARGET = "qwen2.5-coder-1.5b-instruct"
NNCF_TAIL = """<rt_info><nncf><weight_compression>
<backup_mode value="int8_asym" /><group_size value="128" /><mode value="int4_asym" />
<ratio value="1.0" /></weight_compression></nncf></rt_info></net>
"""


def test_parse_peers_openvino() -> None:
    assert parse_peers(["openvino"]) == [("openvino", "plain"), ("openvino", "speculative"),
                                         ("openvino", "lookup"), ("openvino", "lookup=8")]
    assert parse_peers(["llama.cpp"])[-1] == ("llama.cpp", "lookup=10")
    assert parse_peers(["openvino:lookup,plain; llama.cpp:plain"]) == [
        ("openvino", "lookup"), ("openvino", "plain"), ("llama.cpp", "plain")]
    with pytest.raises(InvalidArgumentError, match="unknown openvino variant 'assisted'"):
        parse_peers(["openvino:assisted"])
    with pytest.raises(InvalidArgumentError, match="openvino"):
        parse_peers(["openvin"])
    # the 8-bit exports are a peer of their own, with the same variants
    assert parse_peers(["openvino-int8:plain; openvino:plain"]) == [
        ("openvino-int8", "plain"), ("openvino", "plain")]
    assert [peer.label(v, w) for v in ("plain", "lookup") for w in ("int4", "int8")] == [
        "openvino", "openvino-int8", "openvino:lookup", "openvino-int8:lookup"]
    # a draft length for the drafting variants of llama.cpp and OpenVINO, and nowhere else
    assert parse_peers(["openvino:lookup=3,lookup; llama.cpp:speculative=8"]) == [
        ("openvino", "lookup=3"), ("openvino", "lookup"), ("llama.cpp", "speculative=8")]
    assert peer.label("speculative", "int8", 8) == "openvino-int8:speculative=8"
    for bad, message in [("openvino:plain=3", "takes no draft length"),
                         ("hf:assisted=3", "takes no draft length"),
                         ("llama.cpp:lookup=0", "bad draft length"),
                         ("llama.cpp:lookup=x", "bad draft length"),
                         ("openvino:lookup=65", "bad draft length")]:
        with pytest.raises(InvalidArgumentError, match=message):
            parse_peers([bad])


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "openvino_genai", None)  # import raises ImportError
    with pytest.raises(BackendError) as e:
        peer.OpenVINOPeer("plain", tmp_path, 2, frozenset({0}))
    assert "make openvino" in str(e.value) and "\n" not in str(e.value)


def test_missing_export_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    with pytest.raises(BackendError) as e:
        peer.exported_folder(TARGET)
    message = str(e.value)
    assert str(tmp_path / "openvino" / f"{TARGET}-int4") in message
    assert "make openvino" in message and "\n" not in message
    # the runner maps the catalogue name (or a model folder) to the same export
    engine = SimpleNamespace(target=SimpleNamespace(
        tokenizer=SimpleNamespace(eos_token_ids=frozenset({0}))))
    assert openvino_peers(engine, BenchConfig(), []) == []
    with pytest.raises(BackendError, match="no OpenVINO export"):
        openvino_peers(engine, BenchConfig(target=f"/somewhere/{TARGET}/"), ["plain"])
    with pytest.raises(BackendError, match=f"{TARGET}-int8 has no"):
        openvino_peers(engine, BenchConfig(target=TARGET), ["plain"], "int8")


def test_an_exported_folder_is_taken_as_is(tmp_path: Path) -> None:
    (tmp_path / "openvino_model.xml").write_text("<net>" + NNCF_TAIL)
    assert peer.exported_folder(str(tmp_path)) == tmp_path
    assert peer.weight_format(tmp_path) == "int4_asym g128 r1.0"
    (tmp_path / "openvino_model.xml").write_text("<net></net>\n")
    assert peer.weight_format(tmp_path) == "uncompressed"


def test_greedy_only() -> None:
    contestant = object.__new__(peer.OpenVINOPeer)  # the check comes before any model use
    with pytest.raises(InvalidArgumentError, match="greedy"):
        contestant.run([1, 2, 3], Sampling(max_new_tokens=4, temperature=0.7), 0)


def _export(weights: str) -> Path | None:
    if importlib.util.find_spec("openvino_genai") is None:
        return None
    try:
        return peer.exported_folder(TARGET, weights)
    except BackendError:
        return None


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_plain_and_lookup_agree_under_greedy(weights: str) -> None:
    folder = _export(weights)
    if folder is None:
        pytest.skip(f"needs openvino-genai and `make openvino` ({TARGET}-{weights})")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = ("<|im_start|>user\nRepeat exactly, nothing else: the quick brown fox jumps over "
              "the lazy dog.<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    eos = frozenset(tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>"))
    sampling = Sampling(max_new_tokens=16)
    runs = {}
    for variant, length in (("plain", None), ("lookup", None), ("lookup", 3)):
        contestant = peer.OpenVINOPeer(variant, folder, 2, eos, weights=weights,
                                       draft_length=length)
        assert contestant.options["weights"].startswith(weights)
        assert contestant.label == peer.label(variant, weights, length)
        assert contestant.options["openvino_genai"] == peer.genai_version()
        if variant == "lookup":
            assert contestant.options["num_assistant_tokens"] == str(length or 5)
        runs[variant, length] = contestant.run(ids, sampling, 0)
    plain, lookup = runs["plain", None], runs["lookup", None]
    assert runs["lookup", 3].token_ids == plain.token_ids
    assert 0 < len(plain.token_ids) <= 16 and plain.seconds > 0
    assert len(plain.token_ids) == 16 or plain.token_ids[-1] in eos
    assert "quick brown fox" in tokenizer.decode(plain.token_ids)
    assert lookup.token_ids == plain.token_ids
