"""llama.cpp's example programs as peers: output parsing on captured runs (no binary needed)
and the command line each is given; the real runs are in test_llama_cpp.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from draftsman.bench import peer_llama_cpp as peer
from draftsman.bench.contestants import Sampling
from draftsman.errors import BackendError, InvalidArgumentError

PROMPT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\n<|im_start|>user\nRepeat exactly, nothing else: the quick "
          "brown fox jumps over the lazy dog; the quick brown fox jumps over the lazy "
          "dog.<|im_end|>\n<|im_start|>assistant\n")
# captured from llama-lookup on qwen2.5-coder-1.5b-instruct (-n 7, 2 threads)
LOOKUP_STDOUT = "\n\n" + PROMPT + "The quick brown fox jumps over the lazy dog;\n\n\n\n"
LOOKUP_STDERR = (
    "0.01.766.877 I cmn          init: llama threadpool init, n_threads = 2\n"
    "0.03.882.710 I encoded   55 tokens in    1.256 seconds, speed:   51.751 t/s\n"
    "0.03.882.778 I decoded   10 tokens in    0.373 seconds, speed:   26.841 t/s\n"
    "0.03.883.100 I \n0.03.883.114 I n_draft      = 3\n"
    "0.03.883.204 I n_accept     = 6\n"
    "0.03.883.264 I accept       = 100.000%\n"
)
EOS = "<|im_end|>"


class FakeTokenizer:
    """One id per character, id 0 for the end-of-turn token (printed by llama-lookup)."""

    eos_token = EOS

    def __init__(self) -> None:
        self.backend = SimpleNamespace(
            decode=lambda ids, skip_special_tokens=False: "".join(
                EOS if i == 0 else chr(i) for i in ids),
            token_to_id=lambda s: 0 if s == EOS else None)

    def encode(self, text: str, special: bool = False) -> list[int]:
        out: list[int] = []
        for part_index, part in enumerate(text.split(EOS)):
            if part_index:
                out.append(0)
            out += [ord(c) for c in part]
        return out


def test_parse_captured_lookup_run() -> None:
    run = peer.parse_program_output("llama-lookup", LOOKUP_STDOUT, LOOKUP_STDERR, PROMPT)
    assert run.text == "The quick brown fox jumps over the lazy dog;"
    assert (run.encode_seconds, run.decode_seconds, run.decoded) == (1.256, 0.373, 10)
    assert run.acceptance == pytest.approx(1.0)


@pytest.mark.parametrize("stdout, stderr, message", [
    (LOOKUP_STDOUT, "no timing here", "no timing"),
    ("\n\nsomething else\n", LOOKUP_STDERR, "does not echo the prompt"),
])
def test_parse_refuses_incomplete_output(stdout: str, stderr: str, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        peer.parse_program_output("llama-lookup", stdout, stderr, PROMPT)


def _fake_peer(monkeypatch: pytest.MonkeyPatch, stdout: str, calls: list[list[str]],
               files: list[str], draft_length: int | None = None) -> peer.LlamaCppLookupPeer:
    monkeypatch.setattr(peer, "ensure_binary", lambda name: Path("/bin") / name)
    monkeypatch.setattr(peer, "repack", lambda: True)

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        calls.append(cmd)
        files.append(Path(cmd[cmd.index("-f") + 1]).read_text(encoding="utf-8"))
        return subprocess.CompletedProcess(cmd, 0, stdout, LOOKUP_STDERR)

    monkeypatch.setattr(peer.subprocess, "run", run)
    return peer.LlamaCppLookupPeer(Path("t.gguf"), 2, FakeTokenizer(), frozenset({0}),
                                   draft_length)


def test_lookup_peer_command_and_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    files: list[str] = []
    tok = FakeTokenizer()
    p = _fake_peer(monkeypatch, LOOKUP_STDOUT, calls, files)
    assert p.label == "llama.cpp:lookup" and p.kind == "peer" and p.drafter == "prompt-lookup"
    out = p.run(tok.encode(PROMPT), Sampling(max_new_tokens=8), seed=0)
    cmd = calls[0]
    assert cmd[0] == "/bin/llama-lookup" and "-md" not in cmd
    assert cmd[cmd.index("-n") + 1] == "7"  # it stops past -n: 7 gives the 8 wanted
    assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == "2"
    assert cmd[cmd.index("--temp") + 1] == "0"
    assert files == [PROMPT + "\n"]  # -f drops one trailing newline
    # 44 characters printed, clipped to the 8 asked for; time = prompt + decode as reported
    assert out.token_ids == tok.encode("The quic") and out.finish == "length"
    assert out.seconds == pytest.approx(1.256 + 0.373)
    assert p.acceptance == [pytest.approx(1.0)]
    assert "--spec-draft-n-max" not in cmd and p.options == {}  # llama.cpp's own default


def test_lookup_peer_with_a_draft_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """`lookup=8`: the program is told to draft up to 8 tokens; label and options say so."""
    calls: list[list[str]] = []
    p = _fake_peer(monkeypatch, LOOKUP_STDOUT, calls, [], draft_length=8)
    assert p.label == "llama.cpp:lookup=8" and p.options == {"draft_max": "8"}
    p.run(FakeTokenizer().encode(PROMPT), Sampling(max_new_tokens=8), seed=0)
    cmd = calls[0]
    assert cmd[cmd.index("--spec-draft-n-max") + 1] == "8"


def test_lookup_peer_stops_at_the_printed_end_of_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = "\n\n" + PROMPT + "Hi." + EOS + "More" + "\n\n\n\n"
    p = _fake_peer(monkeypatch, stdout, [], [])
    out = p.run(FakeTokenizer().encode(PROMPT), Sampling(max_new_tokens=64), seed=0)
    assert out.token_ids == [ord("H"), ord("i"), ord("."), 0] and out.finish == "eos"


def test_lookup_peer_refuses_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _fake_peer(monkeypatch, LOOKUP_STDOUT, [], [])
    with pytest.raises(InvalidArgumentError, match="greedy"):
        p.run([1, 2], Sampling(max_new_tokens=8, temperature=0.7), seed=0)
