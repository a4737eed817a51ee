"""Hugging Face transformers as a peer: plain `generate`, assisted generation with the same
draft model, prompt lookup, and `compiled` (its static cache + torch.compile, the setup
transformers documents for fast GPU decoding), on the same weights, prompt token ids and
sampling settings.

Fairness rules:
- the same folder and dtype as the draftsman target (and draft) are loaded with
  `AutoModelForCausalLM.from_pretrained`;
- the model folders' `generation_config.json` is replaced by library defaults, then every
  setting that matters is passed explicitly (greedy or the same temperature / top-k / top-p,
  no repetition penalty, `min_new_tokens` unset, the same EOS ids), so HF decodes the same
  distribution as draftsman;
- new tokens are counted from the returned ids with the shared rule
  (`contestants.clip_new_tokens`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from draftsman.bench import peer_llama_cpp, peer_openvino
from draftsman.bench.contestants import Contestant, Outcome, Sampling, clip_new_tokens
from draftsman.errors import InvalidArgumentError
from draftsman.models.base import growing_attention

VARIANTS = ("plain", "assisted", "prompt-lookup", "compiled")
PROMPT_LOOKUP_TOKENS = 10
# `compiled`: one static cache of this many slots for every prompt, so the compiled decode
# step has one shape and is compiled once (in the warm-up), never inside a timed run
COMPILED_CACHE_SLOTS = 4096


# the variants of llama.cpp and OpenVINO whose draft length `variant=N` sets (`speculative=8`)
SIZED_VARIANTS = ("speculative", "lookup")
MAX_DRAFT_LENGTH = 64


def split_variant(variant: str) -> tuple[str, int | None]:
    """`speculative=8` -> ("speculative", 8): the variant and the draft length it asks for
    (None: the peer's own default)."""
    base, sep, length = variant.partition("=")
    if not sep:
        return base, None
    if not length.isdigit() or not 1 <= int(length) <= MAX_DRAFT_LENGTH:
        raise InvalidArgumentError(f"bad draft length in peer variant {variant!r}: give a whole "
                                   f"number of tokens from 1 to {MAX_DRAFT_LENGTH}")
    return base, int(length)


def parse_peers(specs: list[str] | None) -> list[tuple[str, str]]:
    """(peer, variant) pairs. `hf` -> plain, assisted and prompt-lookup (`compiled` only by
    name: it compiles a model of its own), `hf:plain,assisted` -> those;
    `llama.cpp` and `openvino` (`openvino-int8`: its 8-bit exports) -> their plain,
    speculative and lookup decoding, and lookup with a longer draft (their DEFAULT_VARIANTS);
    `speculative=N` / `lookup=N` set the draft length (else the peer's default); `;` or
    repeated specs are merged."""
    known = {"hf": VARIANTS, "llama.cpp": peer_llama_cpp.VARIANTS}
    known |= {name: peer_openvino.VARIANTS for name in peer_openvino.PEERS}
    default = {"hf": VARIANTS[:3], "llama.cpp": peer_llama_cpp.DEFAULT_VARIANTS}
    default |= {name: peer_openvino.DEFAULT_VARIANTS for name in peer_openvino.PEERS}
    out: list[tuple[str, str]] = []
    for spec in specs or []:
        for item in (s.strip() for s in spec.split(";")):
            if not item:
                continue
            name, _, rest = item.partition(":")
            name = name.strip().lower()
            if name not in known:
                raise InvalidArgumentError(
                    f"unknown peer {name!r}; the peers are {', '.join(known)}")
            wanted = [v.strip() for v in rest.split(",") if v.strip()] or list(default[name])
            for v in wanted:
                base, length = split_variant(v)
                if base not in known[name]:
                    raise InvalidArgumentError(
                        f"unknown {name} variant {v!r}; choose from {', '.join(known[name])}")
                if length is not None and (name == "hf" or base not in SIZED_VARIANTS):
                    raise InvalidArgumentError(
                        f"{name}:{base} takes no draft length; `=N` is for the "
                        f"{' and '.join(SIZED_VARIANTS)} variants of llama.cpp and openvino")
                if (name, v) not in out:
                    out.append((name, v))
    return out


def label(variant: str) -> str:
    return "hf" if variant == "plain" else f"hf:{variant}"


def load_hf(folder: str, dtype: torch.dtype, device: torch.device | None = None) -> Any:
    """transformers' model of `folder`, on our engine's device (peers compare like for like)."""
    import transformers

    transformers.logging.set_verbosity_error()  # generate's deprecation chatter
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    model.generation_config = transformers.GenerationConfig()
    if device is not None:
        model = model.to(device)
    return model.eval()


class HFPeer(Contestant):
    def __init__(self, variant: str, model: Any, eos: frozenset[int], *,
                 assistant: Any | None = None, drafter: str | None = None) -> None:
        if variant == "assisted" and assistant is None:
            raise InvalidArgumentError("hf:assisted needs a draft model")
        super().__init__(label=label(variant), method=f"hf-{variant}", kind="peer",
                         exactness="reference" if variant == "plain" else "exact",
                         drafter=drafter, options={})
        self.variant = variant
        self.model = model
        self.assistant = assistant
        self.eos = frozenset(eos)
        self.cache: Any | None = None  # `compiled`: the one static cache, reset per run

    def static_cache(self) -> Any:
        import transformers

        if self.cache is None:
            self.cache = transformers.StaticCache(config=self.model.config,
                                                  max_cache_len=COMPILED_CACHE_SLOTS)
        self.cache.reset()
        return self.cache

    def generation_config(self, sampling: Sampling) -> Any:
        import transformers

        eos = sorted(self.eos)
        config = transformers.GenerationConfig(
            max_new_tokens=sampling.max_new_tokens, do_sample=False, repetition_penalty=1.0,
            eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
        if sampling.temperature > 0:  # the same standardisation as draftsman's sampler
            config.do_sample = True
            config.temperature = sampling.temperature
            config.top_k = sampling.top_k  # 0 = off, as in draftsman
            config.top_p = sampling.top_p
        if self.variant == "prompt-lookup":
            config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
        if self.variant == "compiled":
            # transformers compiles the decode step itself for a static cache on a GPU;
            # elsewhere (the CPU dry run) dynamo traces it without a backend compiler
            gpu = self.model.device.type == "cuda"
            compile_config = transformers.CompileConfig(
                fullgraph=True, mode="reduce-overhead" if gpu else None,
                backend="inductor" if gpu else "eager")
            compile_config._compile_all_devices = True
            config.compile_config = compile_config
        return config

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        config = self.generation_config(sampling)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.model.device)
        mask = torch.ones_like(ids)
        extra: dict[str, Any] = {}
        if self.variant == "assisted":
            extra["assistant_model"] = self.assistant
        torch.manual_seed(seed)
        synchronize(self.model.device)
        t0 = time.perf_counter()
        # a dynamic cache's key length grows every token: SDPA off cuDNN, as for our own
        # dynamic forwards (models/base.py growing_attention), so the peer is at its best
        backends = (contextlib.nullcontext() if self.variant == "compiled"
                    else growing_attention(self.model.device))
        with torch.inference_mode(), backends:
            if self.variant == "compiled":  # made and reset inside: inference tensors
                extra["past_key_values"] = self.static_cache()
            out = self.model.generate(ids, attention_mask=mask, generation_config=config,
                                      **extra)
        synchronize(self.model.device)  # generate may return before the GPU is done
        seconds = time.perf_counter() - t0
        new = clip_new_tokens(out[0, ids.shape[1]:].tolist(), self.eos, sampling.max_new_tokens)
        finish = "eos" if new and new[-1] in self.eos else "length"
        return Outcome(new, seconds, None, None, finish)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
