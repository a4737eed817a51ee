"""GGUF -> Hugging Face folder conversion.

Unit tests build tiny random models, export them to GGUF the way llama.cpp's converter does
(names, Q/K rotary permutation for llama) and check the conversion gives back the same
model. The real-model tests compare our converted folders with transformers' own GGUF
loader, weight for weight and logit for logit, and check that a wrong Q/K permutation would
be caught by the same tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from draftsman.errors import UnsupportedError
from draftsman.store.convert import convert_gguf, hf_tensor_name
from draftsman.store.dequant import float32_to_bfloat16_bits, permute_rotary, unpermute_rotary
from draftsman.store.resolve import ensure_model, resolve_gguf

SMOLLM = "smollm2-135m-instruct"
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"
PROMPT = "def quicksort(arr):\n    # sort a list of 12 numbers\n"

# ----------------------------------------------------------------------------- unit tests


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    # One head of dim 4: HF's rotate-half layout pairs row i with row i + 2; llama.cpp's
    # layout stores the pairs adjacent: [x0, x2, x1, x3].
    hf_rows = np.array([[0.0], [1.0], [2.0], [3.0]])
    gguf_rows = permute_rotary(hf_rows, n_head=1)
    assert gguf_rows.ravel().tolist() == [0.0, 2.0, 1.0, 3.0]
    assert unpermute_rotary(gguf_rows, n_head=1).ravel().tolist() == [0.0, 1.0, 2.0, 3.0]
    rng = np.random.default_rng(0)
    for shape, heads in (((48, 5), 3), ((32,), 2), ((64, 7), 1)):
        w = rng.standard_normal(shape)
        assert np.array_equal(unpermute_rotary(permute_rotary(w, heads), heads), w)
        assert not np.array_equal(permute_rotary(w, heads), w)


def test_bfloat16_cast_matches_torch_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([
        rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10_000),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3.4e38, -3.4e38],
                 dtype=np.float32),
        # exact ties between two bfloat16 values: round to the even neighbour
        (np.arange(1, 200, dtype=np.uint32) << 16 | 0x8000).view(np.float32),
    ]).astype(np.float32)
    ours = float32_to_bfloat16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16)
    nan = np.isnan(values)
    assert np.array_equal(ours[~nan], theirs.view(torch.int16).numpy().view(np.uint16)[~nan])
    # NaN payloads differ between torch's code paths; ours must just stay NaN.
    back = torch.from_numpy(ours.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(np.isnan(back), nan)


def test_tensor_name_mapping() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.7.attn_q.bias") == "model.layers.7.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == (
        "model.layers.3.post_attention_layernorm.weight")
    assert hf_tensor_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    for bad in ("rope_freqs.weight", "blk.x.attn_q.weight", "blk.1.attn_qkv.weight"):
        with pytest.raises(UnsupportedError):
            hf_tensor_name(bad)


_GGUF_BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _export_gguf(model: torch.nn.Module, arch: str, path: Path) -> None:
    """Write `model` as llama.cpp's convert_hf_to_gguf would (float32, no tokenizer)."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_eos_token_id(3)
    writer.add_bos_token_id(1)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w = tensor.detach().float().numpy().copy()
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{_GGUF_BLOCK_NAMES[module]}.{kind}"
            if arch == "llama" and module == "self_attn.q_proj":
                w = permute_rotary(w, cfg.num_attention_heads)
            elif arch == "llama" and module == "self_attn.k_proj":
                w = permute_rotary(w, cfg.num_key_value_heads)
        else:
            gguf_name = {"model.embed_tokens.weight": "token_embd.weight",
                         "model.norm.weight": "output_norm.weight",
                         "lm_head.weight": "output.weight"}[name]
        writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny(model_type: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type, vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_theta=10000.0, **extra,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms start at 1: perturb them so a mix-up would show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize(
    "model_type, extra",
    [
        ("llama", {"tie_word_embeddings": False}),
        ("qwen2", {"tie_word_embeddings": True}),
        ("qwen3", {"tie_word_embeddings": True}),
    ],
)
def test_tiny_gguf_round_trip(tmp_path: Path, model_type: str, extra: dict) -> None:
    from transformers import AutoModelForCausalLM

    original = _tiny(model_type, **extra)
    _export_gguf(original, model_type, tmp_path / "tiny.gguf")
    out = tmp_path / "hf"
    result = convert_gguf(tmp_path / "tiny.gguf", out, torch.float32, tokenizer=False,
                          progress=False)
    assert result.architecture == model_type
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type
    assert config["tie_word_embeddings"] == extra["tie_word_embeddings"]
    assert config["head_dim"] == 16 and config["num_key_value_heads"] == 2
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = original(ids).logits, converted(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    expected = original.state_dict()
    for name, tensor in converted.state_dict().items():
        assert torch.equal(tensor, expected[name]), name

    # bfloat16 output: every tensor is the float32 one rounded, exactly as torch rounds it.
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "bf16", torch.bfloat16, tokenizer=False,
                 progress=False)
    from safetensors.torch import load_file

    for name, tensor in load_file(tmp_path / "bf16" / "model.safetensors").items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedError, match="mamba"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out", tokenizer=False, progress=False)


# ---------------------------------------------------------------- real models vs transformers


def _transformers_reference(gguf_path: Path, folder: Path):
    """transformers' own GGUF conversion: (config dict, float32 tensors by HF name).

    `AutoModelForCausalLM.from_pretrained(gguf_file=...)` needs `accelerate`, which this
    project does not depend on; its building block `load_gguf_checkpoint` does the same
    name mapping and Q/K un-permutation without it. The model passed in only tells it the
    parameter names, so a meta-device skeleton is enough.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    return parsed["config"], parsed["tensors"]


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[0].float()


def _check_against_transformers(name: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """Our folder's config and weights equal transformers' conversion of the same GGUF."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    folder, gguf_path = ensure_model(name), resolve_gguf(name)
    ref_config, ref_tensors = _transformers_reference(gguf_path, folder)
    ours = AutoConfig.from_pretrained(folder)
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings",
                "max_position_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(ours, key) == ref_config[key], key
    assert ours.rope_parameters["rope_theta"] == pytest.approx(ref_config["rope_theta"])
    assert ours.rms_norm_eps == pytest.approx(ref_config["rms_norm_eps"], rel=1e-6)
    # Our bfloat16 weights are transformers' float32 ones rounded to nearest even, bit for
    # bit, Q/K layout included.
    weights = load_file(folder / "model.safetensors")
    assert set(weights) == set(ref_tensors)
    for key, tensor in weights.items():
        assert torch.equal(tensor, ref_tensors[key].to(torch.bfloat16)), key
    return folder, ref_tensors


def _swap_qk_layout(state: dict[str, torch.Tensor], config, wrong) -> dict[str, torch.Tensor]:
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    out = {}
    for key, tensor in state.items():
        proj = key.split(".")[-2]
        if proj in heads:
            tensor = torch.from_numpy(wrong(tensor.float().numpy(), heads[proj]).copy())
        out[key] = tensor
    return out


@pytest.mark.real
@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loader() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, ref_tensors = _check_against_transformers(SMOLLM)
    # Logits of our bfloat16 folder (run in float32) against transformers' float32 weights:
    # they differ only by the bfloat16 rounding of the weights.
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT, return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = _logits(model, ids)
    model.load_state_dict(ref_tensors, strict=False)
    ref = _logits(model, ids)
    tolerance = 0.5  # measured: about 0.1 (logits span about +-30)
    assert (ours - ref).abs().max() < tolerance
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    # That tolerance catches a wrong Q/K layout: keep the rows as llama.cpp stores them.
    model.load_state_dict(_swap_qk_layout(ref_tensors, model.config, permute_rotary),
                          strict=False)
    assert (_logits(model, ids) - ref).abs().max() > 10 * tolerance


@pytest.mark.real
@pytest.mark.slow
def test_qwen_small_matches_transformers_gguf_loader() -> None:
    # Weights bit-identical to transformers' conversion (which does not permute qwen2);
    # test_qwen_small_folder_writes_code shows a permuted layout would break generation.
    _check_against_transformers(QWEN_SMALL)


@pytest.mark.real
@pytest.mark.slow
def test_qwen_small_folder_writes_code() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_model(QWEN_SMALL)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["num_hidden_layers"], config["vocab_size"]) == (24, 151936)
    assert config["tie_word_embeddings"] is False  # this GGUF stores output.weight
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643]  # <|im_end|>, <|endoftext|>
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok("x = 12345").input_ids[-5:] == [16, 17, 18, 19, 20]  # one token per digit
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Write a Python function add(a, b) that returns "
                                            "the sum of a and b. Only the code."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]

    def complete() -> str:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=24, do_sample=False)
        return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    text = complete()
    assert "def add(a, b):" in text and "return a + b" in text, text
    # The check is sensitive to the Q/K layout: un-permuting like llama breaks it.
    state = model.state_dict()
    model.load_state_dict(_swap_qk_layout(state, model.config, unpermute_rotary), strict=False)
    text = complete()
    assert "return a + b" not in text, text
