"""llama.cpp as a peer: its own plain decoding and its own speculative decoding, on the same
GGUF files, prompt token ids, greedy settings and thread count as draftsman's llama.cpp
backend.

- plain: llama.cpp's decode loop as its `simple` example writes it (one `llama_decode` per
  token, llama.cpp's greedy sampler picks), run in-process through the C API. The `simple`
  binary itself cannot be told a thread count (it takes llama.cpp's default of 4), so the
  loop is driven here with the benchmark's threads; nothing else differs.
- speculative: the `llama-speculative-simple` program (built on first use by
  scripts/build_llama_cpp.sh) with the same draft GGUF and llama.cpp's default draft
  settings. Its time is what it reports for prompt processing plus decoding (model loading
  is excluded, as for every contestant); its text is tokenized back to count tokens.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from draftsman.backends.llama_cpp import has_amx, install_dir, llama, model_params
from draftsman.bench.contestants import Contestant, Outcome, Sampling, clip_new_tokens
from draftsman.errors import BackendError, InvalidArgumentError

VARIANTS = ("plain", "speculative")
SPECULATIVE_BINARY = "llama-speculative-simple"
_TIMING = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def label(variant: str) -> str:
    return "llama.cpp" if variant == "plain" else f"llama.cpp:{variant}"


def _check_greedy(sampling: Sampling) -> None:
    if sampling.temperature > 0:
        raise InvalidArgumentError("the llama.cpp peer runs greedy decoding only")


class LlamaCppPlainPeer(Contestant):
    def __init__(self, gguf: Path, threads: int, eos: frozenset[int]) -> None:
        super().__init__(label=label("plain"), method="llama.cpp-plain", kind="peer",
                         exactness="reference", options={})
        self.lib = lib = llama()
        self.model = lib.llama_model_load_from_file(str(gguf).encode(), model_params(lib))
        if not self.model:
            raise BackendError(f"llama.cpp could not load {gguf}")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.threads = threads
        self.eos = eos

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        _check_greedy(sampling)
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = len(prompt_ids) + sampling.max_new_tokens + 1
        params.n_batch = max(len(prompt_ids), 1)
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model, params)
        sampler = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        lib.llama_sampler_chain_add(sampler, lib.llama_sampler_init_greedy())
        try:
            prompt = (ctypes.c_int32 * len(prompt_ids))(*prompt_ids)
            one = (ctypes.c_int32 * 1)()
            out: list[int] = []
            t0 = time.perf_counter()
            ttft = None
            batch = lib.llama_batch_get_one(prompt, len(prompt_ids))
            while len(out) < sampling.max_new_tokens:
                if lib.llama_decode(ctx, batch) != 0:
                    raise BackendError("llama_decode failed in the llama.cpp peer")
                token = lib.llama_sampler_sample(sampler, ctx, -1)
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                out.append(int(token))
                if token in self.eos:
                    break
                one[0] = token
                batch = lib.llama_batch_get_one(one, 1)
            seconds = time.perf_counter() - t0
        finally:
            lib.llama_sampler_free(sampler)
            lib.llama_free(ctx)
        new = clip_new_tokens(out, self.eos, sampling.max_new_tokens)
        return Outcome(new, seconds, ttft, None, "eos" if new and new[-1] in self.eos
                       else "length")


class LlamaCppSpeculativePeer(Contestant):
    def __init__(self, target_gguf: Path, draft_gguf: Path, draft_name: str, threads: int,
                 tokenizer: Any, eos: frozenset[int]) -> None:
        super().__init__(label=label("speculative"), method="llama.cpp-speculative",
                         kind="peer", exactness="exact", drafter=draft_name, options={})
        self.program = ensure_binary(SPECULATIVE_BINARY)
        self.target, self.draft = target_gguf, draft_gguf
        self.threads = threads
        self.tokenizer = tokenizer
        self.eos = eos
        self.acceptance: list[float] = []

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        _check_greedy(sampling)
        prompt = self.tokenizer.backend.decode(prompt_ids, skip_special_tokens=False)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as f:
            f.write(prompt)
            f.flush()
            cmd = [str(self.program), "-m", str(self.target), "-md", str(self.draft),
                   "-f", f.name, "-n", str(sampling.max_new_tokens), "--temp", "0",
                   "-t", str(self.threads), "-td", str(self.threads), "-tb", str(self.threads),
                   "-c", str(len(prompt_ids) + sampling.max_new_tokens + 64), "--seed", "0",
                   "--spec-type", "draft-simple"] + (["--no-repack"] if has_amx() else [])
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if r.returncode != 0:
            raise BackendError(f"{SPECULATIVE_BINARY} failed ({r.returncode}): "
                               f"{r.stderr.strip().splitlines()[-1:]}")
        found = _TIMING.findall(r.stderr + r.stdout)
        timings = {kind: float(sec) for kind, _, sec in found}
        decoded = next((int(n) for kind, n, _ in found if kind == "decoded"), 0)
        if set(timings) != {"encoded", "decoded"}:
            raise BackendError(f"{SPECULATIVE_BINARY}: no timing in its output")
        accept = _ACCEPT.findall(r.stderr + r.stdout)
        if accept:
            self.acceptance.append(float(accept[-1]) / 100)
        # it echoes the prompt but its last token, then the new text
        head = self.tokenizer.backend.decode(prompt_ids[:-1], skip_special_tokens=False)
        start = r.stdout.find(head)
        if start < 0:
            raise BackendError(f"{SPECULATIVE_BINARY}: its output does not echo the prompt")
        generated = r.stdout[start + len(head):]
        ids = self.tokenizer.encode(generated.rstrip("\n"), special=False)
        eos = self.tokenizer.backend.token_to_id(self.tokenizer.eos_token or "")
        if len(ids) < decoded and decoded < sampling.max_new_tokens and eos is not None:
            ids.append(eos)  # it stopped at end-of-generation, which it does not print
        new = clip_new_tokens(ids, self.eos, sampling.max_new_tokens)
        return Outcome(new, timings["encoded"] + timings["decoded"], None, None,
                       "eos" if new and new[-1] in self.eos else "length")


def ensure_binary(name: str) -> Path:
    """llama.cpp's example program `name`, built by scripts/build_llama_cpp.sh if missing."""
    path = install_dir() / "bin" / name
    if path.is_file():
        return path
    script = Path(__file__).resolve().parents[3] / "scripts" / "build_llama_cpp.sh"
    if not script.is_file():
        raise BackendError(f"{path} is missing and scripts/build_llama_cpp.sh is not here")
    venv = install_dir().parent
    print(f"draftsman: building llama.cpp's {name} once (several minutes)", file=sys.stderr)
    subprocess.run([str(script), str(venv), name], check=True)
    return path
