"""Load a Hugging Face-style folder (config.json + *.safetensors) into our modules."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from draftsman.errors import DraftsmanError, IntegrityError, ModelNotFoundError, UnsupportedError
from draftsman.models.base import DecoderLM
from draftsman.models.config import ModelConfig
from draftsman.models.draft_vocab import VocabSubsetHead, narrowed_linear
from draftsman.models.gpt2 import GPT2Model
from draftsman.models.llama import LlamaModel
from draftsman.models.packed_cache import load_or_pack
from draftsman.models.quant_linear import hf_weight_names, quantize_model
from draftsman.models.weight_formats import FORMATS, QUANT_KINDS, parse_dtype


def model_class(config: ModelConfig) -> type[DecoderLM]:
    return GPT2Model if config.family == "gpt2" else LlamaModel


def read_safetensors(folder: Path, skip: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files but those named in `skip` (which are
    never read: each file is read tensor by tensor when something is skipped)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        if any(folder.glob("*.bin")):
            raise DraftsmanError(f"{folder} has only .bin weights; convert them to safetensors")
        raise ModelNotFoundError(f"no *.safetensors weights in {folder}")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            if not skip:
                state.update(load_file(str(f)))
                continue
            with safe_open(str(f), framework="pt") as st:
                names = [k for k in st.keys() if k not in skip]  # noqa: SIM118 (not a dict)
                state.update((k, st.get_tensor(k)) for k in names)
        except (SafetensorError, OSError, ValueError) as exc:
            raise IntegrityError(f"cannot read weights {f}: {exc}") from exc
    return state


def build_model(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    max_positions: int | None = None,
    device: torch.device | None = None,
    without_linears: bool = False,
) -> DecoderLM:
    """Instantiate the family's module and load a Hugging Face-named state dict into it,
    its weights on `device` (None: where `state` is, the CPU for files). `without_linears`:
    `state` has no Linear weights and they stay on the meta device, for quantize_model to
    replace (biases are loaded)."""
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config, max_positions)
    ours = cls.convert_hf_state(state, config)
    expected = set(model.state_dict().keys())
    if without_linears:
        expected -= {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if config.tie_word_embeddings or config.family == "gpt2":
        expected.discard("lm_head.weight")
    missing = expected - ours.keys()
    unexpected = ours.keys() - expected
    if missing or unexpected:
        raise IntegrityError(
            f"weights do not match the config: missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]}"
        )
    ours = {k: v.to(device=device, dtype=dtype) for k, v in ours.items()}
    model.load_state_dict(ours, strict=False, assign=True)
    if config.family == "gpt2":
        model.lm_head.weight = model.wte.weight
    elif config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def load_model(
    folder: str | Path, dtype: str | torch.dtype = "bf16", max_positions: int | None = None,
    device: torch.device | None = None,
    gguf: str | Path | None = None,
    head_rows: torch.Tensor | None = None,
) -> DecoderLM:
    """The folder's model in `dtype`. For "q4" / "q8" every Linear is packed from `gguf`
    (the same model's GGUF: its own blocks, see models/quant_linear.py); embeddings and
    norms come from the folder in bf16. Without a GGUF, q8 quantises the folder's weights.
    `head_rows`: the LM head scores only these token ids, -inf elsewhere (a draft's
    vocabulary, models/draft_vocab.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelNotFoundError(f"model folder {folder} does not exist")
    config = ModelConfig.from_folder(folder)
    dtype = parse_dtype(dtype)
    if dtype in QUANT_KINDS:
        from draftsman.store.gguf_blocks import read_gguf_blocks

        if FORMATS[dtype].needs_gguf and gguf is None:
            raise DraftsmanError(
                f"--dtype {dtype} runs a GGUF's own blocks and {folder} comes with none: "
                "pass a catalogue name or a .gguf file")
        if device is not None and device.type != "cpu":
            # every quantised format's kernels are CPU kernels
            raise UnsupportedError(f"--dtype {dtype} runs on the CPU only, not on {device}")
        if gguf is None:  # q8 of the folder's own weights
            model = build_model(config, read_safetensors(folder), torch.bfloat16, max_positions)
            return quantize_model(model, str(dtype), None, head_rows)
        return load_or_pack(
            folder, Path(gguf), str(dtype), max_positions, head_rows,
            lambda: _quantized_from_blocks(folder, config, str(dtype), read_gguf_blocks(gguf),
                                           max_positions, head_rows))
    model = build_model(config, read_safetensors(folder), dtype, max_positions, device)
    if head_rows is not None:
        head = narrowed_linear(model.lm_head, head_rows)
        model.lm_head = VocabSubsetHead(head, head_rows.to(head.weight.device),
                                        config.vocab_size)
    return model


def _quantized_from_blocks(folder: Path, config: ModelConfig, kind: str, blocks,
                           max_positions: int | None, head_rows: torch.Tensor | None
                           ) -> DecoderLM:
    """Every Linear packed from `blocks` without its bf16 weights ever being read: the model
    is built with Linears on the meta device, the folder gives only embeddings, norms and
    biases (the 1.5B then peaks at 1.2 GiB of memory instead of 5.3)."""
    with torch.device("meta"):
        skeleton = model_class(config)(config, max_positions)
    tied = config.tie_word_embeddings
    # a tied model's folder may still hold an lm_head copy: unused, never read
    skip = frozenset({"lm_head.weight"} | {
        hf for name, m in skeleton.named_modules() if isinstance(m, nn.Linear)
        for hf in hf_weight_names(name, tied) if hf != "model.embed_tokens.weight"})
    state = read_safetensors(folder, skip)
    model = build_model(config, state, torch.bfloat16, max_positions, without_linears=True)
    del state
    model = quantize_model(model, kind, blocks, head_rows)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise IntegrityError(f"{folder}: no weights for {', '.join(left[:4])}")
    return model
