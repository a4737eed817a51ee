"""Model configuration built from a Hugging Face `config.json`.

One dataclass serves both families; `family` says which forward implementation reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsman.errors import DraftsmanError, ModelNotFoundError

LLAMA_FAMILY = {"llama", "mistral", "qwen2", "qwen3"}
GPT2_FAMILY = {"gpt2"}


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llama" (Llama, Mistral, SmolLM, Qwen2/2.5/3) or "gpt2"
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2: bias on q, k, v projections
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "")
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        if model_type in GPT2_FAMILY:
            hidden = raw["n_embd"]
            heads = raw["n_head"]
            return cls(
                family="gpt2",
                model_type=model_type,
                vocab_size=raw["vocab_size"],
                hidden_size=hidden,
                intermediate_size=raw.get("n_inner") or 4 * hidden,
                num_layers=raw["n_layer"],
                num_heads=heads,
                num_kv_heads=heads,
                head_dim=hidden // heads,
                max_position_embeddings=raw["n_positions"],
                norm_eps=raw.get("layer_norm_epsilon", 1e-5),
                tie_word_embeddings=True,
                eos_token_ids=eos_ids,
                bos_token_id=raw.get("bos_token_id"),
            )
        if model_type not in LLAMA_FAMILY:
            raise DraftsmanError(
                f"unsupported model_type {model_type!r}; supported: "
                f"{', '.join(sorted(LLAMA_FAMILY | GPT2_FAMILY))}"
            )
        heads = raw["num_attention_heads"]
        hidden = raw["hidden_size"]
        rope_scaling = raw.get("rope_scaling")
        rope_theta = raw.get("rope_theta")
        rope_params = raw.get("rope_parameters")  # transformers >= 5 nests rope settings here
        if rope_params:
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", "default") != "default":
                rope_scaling = rope_params
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
            rope_scaling = None
        return cls(
            family="llama",
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            attention_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window") else None,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ModelNotFoundError(f"no config.json in {folder}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DraftsmanError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw)
