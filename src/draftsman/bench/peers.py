"""Hugging Face transformers as a peer: plain `generate`, assisted generation with the same
draft model, and prompt lookup, on the same weights, prompt token ids and sampling settings.

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

import time
from typing import Any

import torch

from draftsman.bench import peer_llama_cpp
from draftsman.bench.contestants import Contestant, Outcome, Sampling, clip_new_tokens
from draftsman.errors import InvalidArgumentError

VARIANTS = ("plain", "assisted", "prompt-lookup")
PROMPT_LOOKUP_TOKENS = 10


def parse_peers(specs: list[str] | None) -> list[tuple[str, str]]:
    """(peer, variant) pairs. `hf` -> every hf variant, `hf:plain,assisted` -> those;
    `llama.cpp` -> its plain, speculative and lookup decoding; `;` or repeated specs are merged."""
    known = {"hf": VARIANTS, "llama.cpp": peer_llama_cpp.VARIANTS}
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
            wanted = [v.strip() for v in rest.split(",") if v.strip()] or list(known[name])
            for v in wanted:
                if v not in known[name]:
                    raise InvalidArgumentError(
                        f"unknown {name} variant {v!r}; choose from {', '.join(known[name])}")
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
        return config

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        config = self.generation_config(sampling)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.model.device)
        mask = torch.ones_like(ids)
        extra = {"assistant_model": self.assistant} if self.variant == "assisted" else {}
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, generation_config=config,
                                      **extra)
        seconds = time.perf_counter() - t0
        new = clip_new_tokens(out[0, ids.shape[1]:].tolist(), self.eos, sampling.max_new_tokens)
        finish = "eos" if new and new[-1] in self.eos else "length"
        return Outcome(new, seconds, None, None, finish)
