"""llama.cpp as a peer: its own plain, speculative and lookup decoding, on the same
GGUF files, prompt token ids, greedy settings and thread count as draftsman's llama.cpp
backend.

- plain: llama.cpp's decode loop as its `simple` example writes it (one `llama_decode` per
  token, llama.cpp's greedy sampler picks), run in-process through the C API. The `simple`
  binary itself cannot be told a thread count (it takes llama.cpp's default of 4), so the
  loop is driven here with the benchmark's threads; nothing else differs.
- speculative: the `llama-speculative-simple` program (built on first use by
  scripts/build_llama_cpp.sh) with the same draft GGUF and llama.cpp's default draft
  settings (3 tokens a step; `speculative=N` drafts up to N, `--spec-draft-n-max`).
- lookup: the `llama-lookup` program (built the same way): llama.cpp's prompt-lookup
  decoding over n-grams of the prompt and of the text generated so far (the same default
  and `lookup=N`).

The two programs' time is what they report for prompt processing plus decoding (model
loading is excluded, as for every contestant); their text is tokenized back to count tokens.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsman.backends.llama_cpp import install_dir, llama, model_params, repack
from draftsman.bench.contestants import Contestant, Outcome, Sampling, clip_new_tokens
from draftsman.errors import BackendError, InvalidArgumentError

VARIANTS = ("plain", "speculative", "lookup")
# what `--peer llama.cpp` runs: its variants at llama.cpp's defaults, and lookup drafting up to
# 10 tokens, which copy-heavy text rewards (18.84 against the default's 16.65 tok/s over the
# cpu preset on the AMX Xeon, bench-results/peer-draft-lengths): the peer at its best either way
DEFAULT_VARIANTS = (*VARIANTS, "lookup=10")
SPECULATIVE_BINARY = "llama-speculative-simple"
LOOKUP_BINARY = "llama-lookup"
_TIMING = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def label(variant: str, draft_length: int | None = None) -> str:
    tail = "" if draft_length is None else f"={draft_length}"
    return "llama.cpp" if variant == "plain" else f"llama.cpp:{variant}{tail}"


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


@dataclass(frozen=True)
class ProgramRun:
    """What one run of a llama.cpp example program reported."""

    text: str  # the generated text, special-token pieces included, as the program printed it
    encode_seconds: float
    decode_seconds: float
    decoded: int  # tokens it says it decoded (it may overshoot the limit)
    acceptance: float | None


def parse_program_output(program: str, stdout: str, stderr: str, prompt: str) -> ProgramRun:
    """Split a run's output: it prints the prompt's pieces, then the new ones, on stdout,
    and its timing and acceptance on stderr. Raises BackendError if a part is missing."""
    found = _TIMING.findall(stderr + stdout)
    timings = {kind: float(sec) for kind, _, sec in found}
    if set(timings) != {"encoded", "decoded"}:
        raise BackendError(f"{program}: no timing in its output")
    decoded = next(int(n) for kind, n, _ in found if kind == "decoded")
    start = stdout.find(prompt)
    if start < 0:
        raise BackendError(f"{program}: its output does not echo the prompt")
    accept = _ACCEPT.findall(stderr + stdout)
    # it ends its output with blank lines of its own
    text = stdout[start + len(prompt):].rstrip("\n")
    return ProgramRun(text, timings["encoded"], timings["decoded"], decoded,
                      float(accept[-1]) / 100 if accept else None)


class LlamaCppProgramPeer(Contestant):
    """A llama.cpp example program run once per prompt on the same GGUF, threads and greedy
    settings; its time is what it reports for prompt processing plus decoding."""

    binary = ""

    def __init__(self, variant: str, target_gguf: Path, threads: int, tokenizer: Any,
                 eos: frozenset[int], drafter: str, draft_length: int | None = None) -> None:
        options = {} if draft_length is None else {"draft_max": str(draft_length)}
        super().__init__(label=label(variant, draft_length), method=f"llama.cpp-{variant}",
                         kind="peer", exactness="exact", drafter=drafter, options=options)
        self.draft_length = draft_length
        self.program = ensure_binary(self.binary)
        self.target = target_gguf
        self.threads = threads
        self.tokenizer = tokenizer
        self.eos = eos
        self.acceptance: list[float] = []

    def arguments(self, sampling: Sampling) -> list[str]:
        """The program's own flags beyond the shared ones."""
        raise NotImplementedError

    def length_arguments(self) -> list[str]:
        """Both programs read the draft length from the same flag."""
        return [] if self.draft_length is None else ["--spec-draft-n-max",
                                                     str(self.draft_length)]

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        _check_greedy(sampling)
        prompt = self.tokenizer.backend.decode(prompt_ids, skip_special_tokens=False)
        with tempfile.TemporaryDirectory(prefix="draftsman-peer-") as tmp:
            path = Path(tmp) / "prompt.txt"
            # `-f` drops one trailing newline of the file: the extra one keeps the prompt whole
            path.write_text(prompt + "\n", encoding="utf-8")
            cmd = [str(self.program), "-m", str(self.target), "-f", str(path),
                   "--temp", "0", "-t", str(self.threads), "-tb", str(self.threads),
                   "-c", str(len(prompt_ids) + sampling.max_new_tokens + 64), "--seed", "0",
                   *self.arguments(sampling), *self.length_arguments()] \
                + ([] if repack() else ["--no-repack"])
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=tmp)
        if r.returncode != 0:
            raise BackendError(f"{self.binary} failed ({r.returncode}): "
                               f"{r.stderr.strip().splitlines()[-1:]}")
        out = parse_program_output(self.binary, r.stdout, r.stderr, prompt)
        if out.acceptance is not None:
            self.acceptance.append(out.acceptance)
        ids = self.tokenizer.encode(out.text, special=False)
        eos = self.tokenizer.backend.token_to_id(self.tokenizer.eos_token or "")
        stopped = out.decoded < sampling.max_new_tokens and not any(t in self.eos for t in ids)
        if stopped and len(ids) < out.decoded and eos is not None:
            ids.append(eos)  # it stopped at end-of-generation without printing it
        new = clip_new_tokens(ids, self.eos, sampling.max_new_tokens)
        return Outcome(new, out.encode_seconds + out.decode_seconds, None, None,
                       "eos" if new and new[-1] in self.eos else "length")


class LlamaCppSpeculativePeer(LlamaCppProgramPeer):
    """`llama-speculative-simple` with the draft GGUF and llama.cpp's default draft settings
    (or `draft_length` tokens a step at most)."""

    binary = SPECULATIVE_BINARY

    def __init__(self, target_gguf: Path, draft_gguf: Path, draft_name: str, threads: int,
                 tokenizer: Any, eos: frozenset[int], draft_length: int | None = None) -> None:
        super().__init__("speculative", target_gguf, threads, tokenizer, eos, draft_name,
                         draft_length)
        self.draft = draft_gguf

    def arguments(self, sampling: Sampling) -> list[str]:
        return ["-md", str(self.draft), "-td", str(self.threads), "-n", _limit(sampling),
                "--spec-type", "draft-simple"]


class LlamaCppLookupPeer(LlamaCppProgramPeer):
    """`llama-lookup`: prompt lookup over n-grams of the prompt and the text so far
    (n-gram sizes 1-4, llama.cpp's default draft length or `draft_length`), no cache kept
    between prompts."""

    binary = LOOKUP_BINARY

    def __init__(self, target_gguf: Path, threads: int, tokenizer: Any,
                 eos: frozenset[int], draft_length: int | None = None) -> None:
        super().__init__("lookup", target_gguf, threads, tokenizer, eos, "prompt-lookup",
                         draft_length)

    def arguments(self, sampling: Sampling) -> list[str]:
        return ["-n", _limit(sampling)]


def _limit(sampling: Sampling) -> str:
    """Both programs stop once they have *more* than -n tokens: n - 1 gets the n wanted
    without one more forward (a last verify may still accept past it; that is clipped)."""
    return str(max(sampling.max_new_tokens - 1, 1))


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
