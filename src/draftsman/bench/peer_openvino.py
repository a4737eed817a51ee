"""OpenVINO GenAI as a peer: its `LLMPipeline` on the CPU, plain, with a draft model and with
prompt lookup, on the default pair exported to OpenVINO IR (scripts/export_openvino.sh,
`make openvino`): `openvino` on 4-bit weights, `openvino-int8` on 8-bit ones (target and
draft alike). int4 is the peer at its best on the CPUs measured (bench-results/openvino-int8),
so `openvino` means int4.

- plain: `LLMPipeline(target, "CPU")`, greedy.
- speculative: the same pipeline built with `draft_model=draft_model(draft, "CPU")` and
  `num_assistant_tokens=5`, OpenVINO's documented default setup for speculative decoding
  (its speculative-decoding samples set 5 and note that it defaults to 5 when unset; on the
  paged-attention backend used here the number is fixed, not adapted, per step).
- lookup: the pipeline built with `prompt_lookup=True`, `num_assistant_tokens=5`,
  `max_ngram_size=3` (OpenVINO's documented prompt-lookup example settings).
- `speculative=N` / `lookup=N`: `num_assistant_tokens=N` instead of 5.

Fairness rules:
- the prompt goes in as the same token ids as for every contestant (`TokenizedInputs`: no
  chat template, no tokenization inside the timed call);
- greedy only (as the llama.cpp peer), the same max_new_tokens and EOS ids (`stop_token_ids`,
  `ignore_eos` false), no repetition penalty;
- `INFERENCE_NUM_THREADS` = the benchmark's threads, for the draft model too;
- time is the wall time of `generate()` (prefill included; loading and compiling excluded);
  new tokens are counted with the shared rule (`contestants.clip_new_tokens`);
- OpenVINO's CPU defaults are kept otherwise (its paged-attention backend, u8 KV cache,
  dynamic quantization of activations) except one: the pipeline's default scheduler
  reuses the KV cache of earlier requests that share a prefix (prefix caching), which would
  skip the prefill of a repeated prompt and no other contestant gets; it is turned off.
The weights differ from draftsman's (OpenVINO's int4, not bf16 or a GGUF), so its text is
its own: agreement with the baseline measures that. Speculative and lookup are exact against
OpenVINO's plain run in exact arithmetic, but under those CPU defaults (bf16 compute on CPUs
that have it, u8 KV cache) a several-token verify rounds differently from a one-token step,
so at a near-tie they can part from plain's tokens (with f32 compute and KV cache and no
dynamic quantization they matched where the defaults did not).
"""

from __future__ import annotations

import importlib
import re
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from draftsman.bench.contestants import Contestant, Outcome, Sampling, clip_new_tokens
from draftsman.errors import BackendError, InvalidArgumentError
from draftsman.store.home import draftsman_home

VARIANTS = ("plain", "speculative", "lookup")
# what `--peer openvino` runs: the documented settings, and lookup with 8 assistant tokens
# (17.38 against 15.46 tok/s for 5 over the cpu preset on the AMX Xeon, bench-results/
# peer-draft-lengths)
DEFAULT_VARIANTS = (*VARIANTS, "lookup=8")
DEVICE = "CPU"
WEIGHTS = "int4"  # the exported folders `openvino` loads: <name>-int4
# peer name -> the weight format of the exports it loads (<name>-<format>)
PEERS = {"openvino": WEIGHTS, "openvino-int8": "int8"}
SPECULATIVE_DRAFT_TOKENS = 5
LOOKUP_DRAFT_TOKENS = 5
LOOKUP_NGRAM = 3
INSTALL = "make openvino (or: .venv/bin/pip install -e '.[openvino]')"
EXPORT = "make openvino (or: scripts/export_openvino.sh)"
_NNCF = re.compile(r'<(mode|group_size|ratio) value="([^"]*)"')


def peer_name(weights: str) -> str:
    """`openvino` for the int4 exports, `openvino-<format>` for the others."""
    return next(name for name, w in PEERS.items() if w == weights)


def label(variant: str, weights: str = WEIGHTS, draft_length: int | None = None) -> str:
    name = peer_name(weights)
    tail = "" if draft_length is None else f"={draft_length}"
    return name if variant == "plain" else f"{name}:{variant}{tail}"


def genai() -> Any:
    """The `openvino_genai` module, or a BackendError saying how to install it."""
    try:
        return importlib.import_module("openvino_genai")
    except ImportError as e:
        raise BackendError(f"the openvino peer needs openvino-genai ({e}); run: {INSTALL}") \
            from None


def genai_version() -> str:
    try:
        return metadata.version("openvino-genai")
    except metadata.PackageNotFoundError:
        return "unknown"


def openvino_dir() -> Path:
    """Where scripts/export_openvino.sh writes: $DRAFTSMAN_HOME/openvino."""
    return draftsman_home() / "openvino"


def exported_folder(spec: str, weights: str = WEIGHTS) -> Path:
    """The OpenVINO IR folder for a model: an exported folder itself, or the export of a
    catalogue model (by its name or its folder's name) under openvino_dir()."""
    path = Path(spec).expanduser()
    if (path / "openvino_model.xml").is_file():
        return path
    name = spec.rstrip("/").rsplit("/", 1)[-1]
    folder = openvino_dir() / f"{name}-{weights}"
    missing = [f for f in ("openvino_model.xml", "openvino_tokenizer.xml")
               if not (folder / f).is_file()]
    if missing:
        raise BackendError(f"{folder} has no {missing[0]} (no OpenVINO export of {name}); "
                           f"run: {EXPORT}")
    return folder


def weight_format(folder: Path) -> str:
    """The weight compression nncf recorded in the IR (its tail), e.g. `int4_asym g128 r1.0`."""
    xml = folder / "openvino_model.xml"
    with xml.open("rb") as f:
        f.seek(max(xml.stat().st_size - 32768, 0))
        tail = f.read().decode("utf-8", errors="replace")
    block = tail.partition("<weight_compression>")[2].partition("</weight_compression>")[0]
    found = dict(_NNCF.findall(block))
    if "mode" not in found:
        return "uncompressed"
    return " ".join([found["mode"]] + [f"{k[0]}{found[k]}" for k in ("group_size", "ratio")
                                       if k in found])


def _check_greedy(sampling: Sampling) -> None:
    if sampling.temperature > 0:
        raise InvalidArgumentError("the openvino peer runs greedy decoding only")


def scheduler_config(ov_genai: Any) -> Any:
    """OpenVINO's latency-oriented scheduler (unbounded prefill chunk) without prefix caching."""
    config = ov_genai.SchedulerConfig()
    config.max_num_batched_tokens = 2**64 - 1
    config.enable_prefix_caching = False
    return config


class OpenVINOPeer(Contestant):
    """One `openvino_genai.LLMPipeline`, built once, run on each prompt's token ids."""

    def __init__(self, variant: str, target: Path, threads: int, eos: frozenset[int], *,
                 draft: Path | None = None, draft_name: str | None = None,
                 weights: str = WEIGHTS, draft_length: int | None = None) -> None:
        if variant not in VARIANTS:
            raise InvalidArgumentError(f"unknown openvino variant {variant!r}")
        if variant == "speculative" and draft is None:
            raise InvalidArgumentError("openvino:speculative needs a draft model")
        self.genai = ov_genai = genai()
        import openvino

        self.tensor = openvino.Tensor
        props: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads}
        options = {"openvino_genai": genai_version(), "weights": weight_format(target),
                   "threads": str(threads)}
        extra: dict[str, Any] = {"scheduler_config": scheduler_config(ov_genai)}
        self.draft_tokens = draft_length or {"speculative": SPECULATIVE_DRAFT_TOKENS,
                                             "lookup": LOOKUP_DRAFT_TOKENS}.get(variant, 0)
        if variant == "speculative":
            assert draft is not None
            extra["draft_model"] = ov_genai.draft_model(str(draft), DEVICE, **props)
            options.update(draft_weights=weight_format(draft),
                           num_assistant_tokens=str(self.draft_tokens))
        elif variant == "lookup":
            extra["prompt_lookup"] = True
            options.update(num_assistant_tokens=str(self.draft_tokens),
                           max_ngram_size=str(LOOKUP_NGRAM))
        try:
            self.pipeline = ov_genai.LLMPipeline(str(target), DEVICE, **extra, **props)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[:1]
            raise BackendError(f"OpenVINO could not load {target}: {first}") from None
        drafter = {"speculative": draft_name, "lookup": "prompt-lookup"}.get(variant)
        super().__init__(label=label(variant, weights, draft_length),
                         method=f"openvino-{variant}", kind="peer",
                         exactness="reference" if variant == "plain" else "exact",
                         drafter=drafter, options=options)
        self.variant = variant
        self.eos = frozenset(eos)

    def generation_config(self, sampling: Sampling) -> Any:
        config = self.genai.GenerationConfig()
        config.max_new_tokens = sampling.max_new_tokens
        config.do_sample = False
        config.repetition_penalty = 1.0
        config.ignore_eos = False
        if self.eos:
            config.eos_token_id = min(self.eos)
            config.stop_token_ids = set(self.eos)
        if self.variant in ("speculative", "lookup"):
            config.num_assistant_tokens = self.draft_tokens
        if self.variant == "lookup":
            config.max_ngram_size = LOOKUP_NGRAM
        return config

    def inputs(self, prompt_ids: list[int]) -> Any:
        import numpy as np

        ids = np.asarray([prompt_ids], dtype=np.int64)
        return self.genai.TokenizedInputs(self.tensor(ids), self.tensor(np.ones_like(ids)))

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        _check_greedy(sampling)
        config = self.generation_config(sampling)
        inputs = self.inputs(prompt_ids)
        t0 = time.perf_counter()
        result = self.pipeline.generate(inputs, config)
        seconds = time.perf_counter() - t0
        new = clip_new_tokens([int(t) for t in result.tokens[0]], self.eos,
                              sampling.max_new_tokens)
        ttft = result.perf_metrics.get_ttft().mean / 1000 if new else None
        return Outcome(new, seconds, ttft, None,
                       "eos" if new and new[-1] in self.eos else "length")
