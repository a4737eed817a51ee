"""Integration tests on the embedded real models (pulled on first use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import draftsman
from draftsman.store.resolve import ensure_model

pytestmark = pytest.mark.real

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in two sentences.",
    "def fibonacci(n):",
]


@pytest.fixture(scope="module")
def qwen_small_fp32():
    ensure_model("qwen2.5-coder-0.5b-instruct")
    return draftsman.load("qwen2.5-coder-0.5b-instruct", dtype="fp32")


def test_greedy_matches_transformers_on_converted_folder(qwen_small_fp32):
    """The converted folder loads in transformers, and both produce the same 24 tokens (a
    code and a chat prompt)."""
    import transformers

    engine = qwen_small_fp32
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.target.folder,
                                                           dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(engine.target.folder)
    for prompt in PROMPTS[:2]:
        ids = engine.encode_prompt(prompt)
        hf_ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                         add_generation_prompt=True, tokenize=True)
        if hasattr(hf_ids, "keys"):
            hf_ids = hf_ids["input_ids"]
        assert list(hf_ids) == ids, "chat template rendering differs from transformers"
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                              min_new_tokens=24, eos_token_id=None, pad_token_id=0)
        expected = out[0, len(ids):].tolist()
        got = engine.generate(ids, max_new_tokens=24).token_ids
        eos = engine.target.tokenizer.eos_token_ids
        n = next((i + 1 for i, t in enumerate(expected) if t in eos), 24)
        assert got == expected[:n]


def test_speculative_exact_on_real_model(qwen_small_fp32):
    """Prompt lookup on one prompt, the n-gram drafter on another (32 tokens each)."""
    engine = qwen_small_fp32
    for prompt, drafter in zip(PROMPTS[:2], ("prompt-lookup", "ngram"), strict=True):
        ref = engine.generate(prompt, max_new_tokens=32)
        got = engine.generate(prompt, max_new_tokens=32, method="speculative", draft=drafter,
                              gamma=4)
        assert got.token_ids == ref.token_ids
        assert got.text == ref.text
        # plain decoding would pass the identity check too: some guesses must have been
        # kept (the accept path ran) and some refused (the recovery path ran)
        accepted = sum(s.accepted for s in got.steps)
        assert 0 < accepted < sum(s.drafted for s in got.steps), (prompt, drafter)


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsman.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=600)


def test_cli_json_fields():
    ensure_model("smollm2-135m-instruct")
    r = cli("generate", "--target", "smollm2-135m-instruct", "--max-new-tokens", "8", "--json",
            "--method", "speculative", "--draft", "prompt-lookup", "Say hello.")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "token_ids", "new_tokens", "seconds", "tokens_per_second", "method",
                "target_forwards", "drafted", "accepted", "alpha", "tau", "gamma"):
        assert key in out
    assert out["new_tokens"] == len(out["token_ids"]) <= 8


def test_cli_stdin_and_stream():
    # the prompt comes only from stdin, and it decides the output: the count goes on
    proc = subprocess.Popen([sys.executable, "-m", "draftsman.cli.main", "generate", "--target",
                             "smollm2-135m-instruct", "--max-new-tokens", "6", "--no-chat",
                             "--stream"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(b"1, 2, 3, 4, 5, 6,")
    proc.stdin.close()
    # --stream: the text arrives piece by piece (several reads of the pipe while the model
    # runs, not one write at the end), then the summary line on stderr
    chunks = []
    while chunk := os.read(proc.stdout.fileno(), 1 << 16):
        chunks.append(chunk)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 0, err
    text = b"".join(chunks).decode()
    assert text.startswith(" 7, 8") and text.endswith("\n"), text
    assert len([c for c in chunks if c.strip()]) > 1, chunks
    assert err.splitlines()[-1].startswith("[6 tokens, "), err


@pytest.mark.parametrize("args,needle", [
    (["--target", "no-such-model", "hi"], "unknown model"),
    (["--target", "/no/such/folder", "hi"], "/no/such/folder"),
    (["--top-p", "2", "hi"], "top-p"),
    (["--temperature", "-1", "hi"], "temperature"),
    (["--target", "smollm2-135m-instruct", ""], "empty"),
    (["--target", "smollm2-135m-instruct", "--max-new-tokens", "8", "word " * 9000], "context"),
    (["--target", "smollm2-135m-instruct", "--method", "speculative", "--draft",
      "qwen2.5-coder-0.5b-instruct", "hi"], "vocabular"),
    (["--target", "smollm2-135m-instruct", "--method", "warp-drive", "hi"], "unknown method"),
])
def test_cli_bad_input_is_one_clear_line(args, needle):
    r = cli("generate", *args)
    assert r.returncode == 2
    assert r.stdout == ""
    # exactly one line on stderr: no traceback, no warnings, no usage text around it
    assert r.stderr.count("\n") == 1 and r.stderr.endswith("\n"), r.stderr
    assert r.stderr.startswith("draftsman: error: "), r.stderr
    assert needle.lower() in r.stderr.lower(), r.stderr


def test_q4_runs_the_ggufs_own_blocks():
    """The 1.5B loads as q4 from its GGUF (Q4_K and Q6_K as stored on the K-quant kernel, or
    onto PyTorch's int4 / int8 kernels where it does not build) and generates."""
    from draftsman.kernels.native import kquant_available
    from draftsman.store.status import model_status

    name = "qwen2.5-coder-1.5b-instruct"
    status = model_status(name)
    if not (status.installed and status.has_gguf):
        pytest.skip(f"{name} is not pulled")
    engine = draftsman.load(name, dtype="q4")
    summary = engine.target.model.quant_summary
    if kquant_available():
        assert summary["Q4_K -> Q4_K kernel (as stored)"] > 100
        assert summary["Q6_K -> Q6_K kernel (as stored)"] > 0  # ffn_down / attn_v / LM head
    else:
        assert summary["Q4_K -> int4 (exact)"] > 100
        assert summary["Q6_K -> int8 per row (requantised)"] > 0
    result = engine.generate("def fibonacci(n):", max_new_tokens=6)
    assert result.new_tokens == 6 and result.text.strip()
