"""Tiny random models built in the test process: a Hugging Face reference and our copy."""

from __future__ import annotations

import torch
import transformers

from draftsman.models.base import DecoderLM
from draftsman.models.config import ModelConfig
from draftsman.models.loader import build_model

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

FAMILIES: dict[str, tuple[type, dict]] = {
    "llama": (transformers.LlamaConfig, dict(COMMON, tie_word_embeddings=False)),
    "llama3-rope": (transformers.LlamaConfig, dict(
        COMMON, rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 32})),
    "mistral": (transformers.MistralConfig, dict(COMMON, sliding_window=None)),
    "qwen2": (transformers.Qwen2Config, dict(COMMON, tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, dict(COMMON, head_dim=16)),
    "gpt2": (transformers.GPT2Config, dict(vocab_size=97, n_embd=64, n_layer=3, n_head=4,
                                           n_positions=256)),
}


def hf_model(family: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    cls, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = cls(**{**kwargs, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # random init leaves norms at 1 and biases at 0: perturb them so the test sees them
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def ours_from_hf(model: transformers.PreTrainedModel, dtype=torch.float32) -> DecoderLM:
    config = ModelConfig.from_dict(model.config.to_dict())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return build_model(config, state, dtype)


def tiny_pair(family: str = "llama", seed: int = 0, **overrides) -> tuple:
    hf = hf_model(family, seed, **overrides)
    return hf, ours_from_hf(hf)


def fresh_cache(model, tokens: list[int]):
    """A cache holding `tokens`, prefilled in one forward: the reference for rollbacks."""
    cache = model.new_cache(len(tokens) + 1)
    model(torch.tensor([tokens]), torch.arange(len(tokens))[None], cache)
    return cache


def assert_cache_holds(cache, model, tokens: list[int]) -> None:
    """The cache's first len(tokens) slots equal a fresh prefill of `tokens`."""
    n = len(tokens)
    assert cache.length == n
    ref = fresh_cache(model, tokens)
    torch.testing.assert_close(cache.k[:, :, :, :n], ref.k[:, :, :, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :n], ref.v[:, :, :, :n], rtol=1e-5, atol=1e-5)
