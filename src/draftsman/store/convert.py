"""GGUF -> Hugging Face-style folder (config.json, tokenizer, model.safetensors).

Supported GGUF architectures: `llama`, `qwen2`, `qwen3` (not `gpt2`, nor llama-3 style
`rope_freqs` tensors: those stop with UnsupportedError). The output loads as-is with
`AutoTokenizer.from_pretrained(folder)` and `AutoModelForCausalLM.from_pretrained(folder)`.

Weights are dequantised one tensor at a time and written into their place in a single
safetensors file, so peak memory is about one tensor in float32, not the whole model. The
converter is exact up to the final cast: each output tensor is `dequantize(gguf) -> float32
-> dtype` (round to nearest even), with llama's Q/K rotary permutation undone (a pure
reordering of rows).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from draftsman.errors import (
    DraftsmanError,
    InvalidArgumentError,
    ModelNotFoundError,
    UnsupportedError,
)
from draftsman.store.dequant import (
    ITEMSIZE,
    OUTPUT_DTYPES,
    TensorJob,
    run_job,
)
from draftsman.store.tokenizer import save_gguf_tokenizer

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
_SAFETENSORS_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class _Arch:
    model_type: str
    hf_class: str
    rotary_permuted: bool  # llama.cpp's converter permuted Q/K rows for this architecture


# Only llama among these has permuted Q/K: llama.cpp's convert_hf_to_gguf permutes for its
# LlamaModel class (llama.cpp rotates adjacent pairs there) but not for Qwen2/Qwen3, whose
# GGUF rope type is NeoX (rotate halves, HF's layout). The logits tests pin this down.
ARCHITECTURES: dict[str, _Arch] = {
    "llama": _Arch("llama", "LlamaForCausalLM", rotary_permuted=True),
    "qwen2": _Arch("qwen2", "Qwen2ForCausalLM", rotary_permuted=False),
    "qwen3": _Arch("qwen3", "Qwen3ForCausalLM", rotary_permuted=False),
}

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Control tokens that end a turn. llama.cpp stops generation on these besides the declared
# eos/eot/eom (its end-of-generation set), so a faithful generation_config lists them too.
_END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end|>",
        "<end_of_turn>",
        "<|end_of_text|>",
        "<EOT>",
    }
)


@dataclass(frozen=True)
class ConversionResult:
    out_dir: Path
    architecture: str
    n_tensors: int
    n_params: int
    dtype: str
    seconds: float


def hf_tensor_name(gguf_name: str) -> str:
    """Hugging Face parameter name for a GGUF tensor name; UnsupportedError if unknown."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".")
    is_block = len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
    if is_block and parts[3] in ("weight", "bias"):
        module = _BLOCK_TENSORS.get(parts[2])
        if module is not None:
            return f"model.layers.{int(parts[1])}.{module}.{parts[3]}"
    raise UnsupportedError(f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent here")


class GGUFMetadata:
    """Typed access to a GGUF file's key/value metadata."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields
        self.architecture: str = self.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def arch(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped key, e.g. `arch("block_count")` -> `qwen2.block_count`."""
        return self.get(f"{self.architecture}.{key}", default)

    def control_tokens(self) -> dict[int, str]:
        """id -> text of tokens of type CONTROL (reading only those strings: vocabs are big)."""
        types = self._fields.get("tokenizer.ggml.token_type")
        tokens = self._fields.get("tokenizer.ggml.tokens")
        if types is None or tokens is None:
            return {}
        type_values = np.asarray([types.parts[i][0] for i in types.data])
        out = {}
        for token_id in np.flatnonzero(type_values == 3):  # gguf.TokenType.CONTROL
            raw = tokens.parts[tokens.data[token_id]]
            out[int(token_id)] = bytes(raw).decode("utf-8", errors="replace")
        return out


def end_of_generation_ids(meta: GGUFMetadata) -> list[int]:
    """The GGUF eos first, then eot/eom and end-of-turn control tokens (llama.cpp's EOG set)."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    for token_id, text in sorted(meta.control_tokens().items()):
        if text in _END_OF_GENERATION_TEXTS and token_id not in ids:
            ids.append(token_id)
    return ids


def build_config(meta: GGUFMetadata, tensors: dict[str, tuple[int, ...]], dtype: torch.dtype
                 ) -> dict[str, Any]:
    """config.json content from GGUF metadata; `tensors` maps GGUF names to HF shapes."""
    from transformers import AutoConfig

    arch = ARCHITECTURES[meta.architecture]
    hidden = int(meta.arch("embedding_length"))
    n_heads = int(meta.arch("attention.head_count"))
    vocab_size = tensors["token_embd.weight"][0]
    kwargs: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "hidden_size": hidden,
        "intermediate_size": int(meta.arch("feed_forward_length")),
        "num_hidden_layers": int(meta.arch("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.arch("attention.head_count_kv", n_heads)),
        "head_dim": int(meta.arch("attention.key_length", hidden // n_heads)),
        "rms_norm_eps": _f32(meta.arch("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(meta.arch("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.arch("context_length")),
        "vocab_size": int(vocab_size),
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "silu",
        "dtype": _dtype_name(dtype),
    }
    for key in ("bos", "eos", "padding"):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            kwargs["pad_token_id" if key == "padding" else f"{key}_token_id"] = int(value)
    if arch.model_type in ("llama", "qwen3"):
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if arch.model_type == "llama":
        kwargs["mlp_bias"] = False
    rope_scaling = _rope_scaling(meta)
    if rope_scaling:
        kwargs["rope_scaling"] = rope_scaling
    config = AutoConfig.for_model(arch.model_type, **kwargs).to_diff_dict()
    # Readers written against transformers 4.x (and our own model code) look for these
    # top-level keys; transformers 5 moved them into rope_parameters / dtype. Keep both.
    config["rope_theta"] = kwargs["rope_theta"]
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    config["torch_dtype"] = kwargs["dtype"]
    return config


def _f32(value: Any) -> float:
    """GGUF stores float32: give its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _rope_scaling(meta: GGUFMetadata) -> dict[str, Any] | None:
    kind = meta.arch("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise UnsupportedError(f"GGUF rope scaling type {kind!r} is not supported")
    scaling: dict[str, Any] = {"rope_type": kind, "factor": _f32(meta.arch("rope.scaling.factor"))}
    original = meta.arch("rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _hf_shape(tensor: Any) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first (ne0 = row length); PyTorch lists them slowest-first.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _write_safetensors_header(
    path: Path, specs: list[tuple[str, tuple[int, ...]]], dtype: str
) -> list[int]:
    """Create `path` holding a safetensors header for `specs` and room for all the data.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's
    dtype, shape and byte range, then the raw bytes back to back. Every shape and the output
    dtype are known before any data, so the header is written first and the data regions
    are filled later, in any order. Returns each tensor's absolute file offset.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    relative: list[int] = []
    for name, shape in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dtype]
        header[name] = {
            "dtype": _SAFETENSORS_DTYPE[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        relative.append(offset)
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(len(raw).to_bytes(8, "little"))
        handle.write(raw)
        handle.truncate(8 + len(raw) + offset)
    return [8 + len(raw) + r for r in relative]


def convert_gguf(
    gguf_path: Path | str,
    out_dir: Path | str,
    dtype: torch.dtype = torch.bfloat16,
    *,
    tokenizer: bool = True,
    progress: bool = True,
) -> ConversionResult:
    """Convert a GGUF checkpoint into a Hugging Face-style folder at `out_dir`.

    Writes config.json, generation_config.json, model.safetensors (every tensor in `dtype`)
    and, unless `tokenizer=False`, tokenizer.json + tokenizer_config.json (with the GGUF's
    chat template). `out_dir` is created if needed; existing files are overwritten. No
    manifest is written: installing (atomic rename, manifest) is the caller's job.
    """
    from gguf import GGUFReader

    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    dtype_name = _dtype_name(dtype)
    if dtype_name not in OUTPUT_DTYPES:
        raise InvalidArgumentError(f"unsupported dtype {dtype}; choose one of {', '.join(DTYPES)}")
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"{gguf_path}: no such GGUF file")
    start = time.perf_counter()
    try:
        reader = GGUFReader(gguf_path)
    except (ValueError, OSError) as exc:
        raise DraftsmanError(f"{gguf_path}: not a readable GGUF file ({exc})") from None
    meta = GGUFMetadata(reader)
    if meta.architecture not in ARCHITECTURES:
        raise UnsupportedError(
            f"{gguf_path.name}: GGUF architecture {meta.architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    shapes = {t.name: _hf_shape(t) for t in reader.tensors}
    specs = [(hf_tensor_name(t.name), shapes[t.name]) for t in reader.tensors]
    config = build_config(meta, shapes, dtype)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write_generation_config(meta, out_dir)
    weights_path = out_dir / "model.safetensors"
    offsets = _write_safetensors_header(weights_path, specs, dtype_name)
    jobs = _tensor_jobs(reader, meta, config, gguf_path, weights_path, offsets, dtype_name)
    n_params = sum(job.n_elements for job in jobs)
    # One tensor at a time: peak memory is the largest tensor in float32 plus temporaries.
    with tqdm(total=n_params, unit="param", unit_scale=True, leave=False,
              desc=f"converting {gguf_path.name}", disable=None if progress else True) as bar:
        for job in jobs:
            bar.update(run_job(job))
    if tokenizer:
        save_gguf_tokenizer(
            gguf_path,
            out_dir,
            split_digits=meta.get("tokenizer.ggml.pre") == "smollm",
            chat_template=meta.get("tokenizer.chat_template"),
            context_length=meta.arch("context_length"),
        )
    return ConversionResult(out_dir, meta.architecture, len(jobs), n_params, dtype_name,
                            time.perf_counter() - start)


def _tensor_jobs(reader: Any, meta: GGUFMetadata, config: dict[str, Any], gguf_path: Path,
                 weights_path: Path, offsets: list[int], dtype_name: str) -> list[TensorJob]:
    permuted = ARCHITECTURES[meta.architecture].rotary_permuted
    jobs = []
    for tensor, offset in zip(reader.tensors, offsets, strict=True):
        heads = 0
        if permuted and ".attn_q." in tensor.name:
            heads = config["num_attention_heads"]
        elif permuted and ".attn_k." in tensor.name:
            heads = config["num_key_value_heads"]
        jobs.append(TensorJob(
            gguf_path=str(gguf_path),
            data_offset=int(tensor.data_offset),
            n_bytes=int(tensor.n_bytes),
            qtype=int(tensor.tensor_type),
            shape=_hf_shape(tensor),
            unpermute_heads=heads,
            out_path=str(weights_path),
            out_offset=offset,
            out_dtype=dtype_name,
        ))
    return jobs


def _write_generation_config(meta: GGUFMetadata, out_dir: Path) -> None:
    # Only what the GGUF states: token ids. Sampling defaults are not in GGUF metadata.
    generation: dict[str, Any] = {}
    if eos := end_of_generation_ids(meta):
        generation["eos_token_id"] = eos
    for key, hf_key in (("bos", "bos_token_id"), ("padding", "pad_token_id")):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            generation[hf_key] = int(value)
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
