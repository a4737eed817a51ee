"""q4 / q8 from a GGUF file without the folder's bf16 matrices (models/loader.py).

A tiny random model saved as a folder (config.json + safetensors) beside a GGUF file of its
blocks: the memory-light loader must build the same model as packing the fully loaded one
(every tensor, the summary, the logits), must never read a Linear weight from the folder,
and must still load when the folder's Linear weights are not there at all.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import safetensors.torch
import torch
from test_quant import DIMS, gguf_model
from tiny import hf_model

import draftsman.models.loader as loader
from draftsman.errors import DraftsmanError
from draftsman.models.loader import build_model, load_model
from draftsman.models.quant_linear import quantize_model
from draftsman.store.convert import _BLOCK_TENSORS, _GLOBAL_TENSORS
from draftsman.store.dequant import permute_rotary
from draftsman.store.gguf_blocks import read_gguf_blocks

GGUF_NAMES = {v: k for k, v in _GLOBAL_TENSORS.items()} | {
    f"model.layers.{i}.{module}.weight": f"blk.{i}.{short}.weight"
    for i in range(DIMS["num_hidden_layers"]) for short, module in _BLOCK_TENSORS.items()}


def write_gguf(path, family: str, blocks) -> None:
    """The blocks as a GGUF file: llama's Q/K rows permuted as llama.cpp stores them."""
    cfg = hf_model(family, 0, **DIMS).config
    writer = gguf.GGUFWriter(str(path), "llama" if family == "llama" else family)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    for name, b in blocks.items():
        rows = b.rows
        if family == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            rows = permute_rotary(rows, heads)
        writer.add_tensor(GGUF_NAMES[name], np.ascontiguousarray(rows),
                          raw_shape=rows.shape, raw_dtype=gguf.GGMLQuantizationType(b.qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(params=["llama", "qwen2"])
def saved(request, tmp_path):
    family = request.param
    config, state, blocks = gguf_model(family)
    folder = tmp_path / "model"
    hf = hf_model(family, 0, **DIMS)
    hf.config.save_pretrained(folder)
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    safetensors.torch.save_file(bf16, str(folder / "model.safetensors"))
    write_gguf(tmp_path / "model.gguf", family, blocks)
    return config, bf16, folder, tmp_path / "model.gguf"


def _linear_names(model) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_light_load_equals_packing_the_full_model(saved, kind, monkeypatch):
    config, state, folder, path = saved
    want = quantize_model(build_model(config, state, torch.bfloat16), kind,
                          read_gguf_blocks(path))
    read: list[str] = []
    real_open = loader.safe_open

    class Spy:
        def __init__(self, *args, **kwargs) -> None:
            self.inner = real_open(*args, **kwargs)

        def __enter__(self):
            self.handle = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.handle.keys()

        def get_tensor(self, name: str):
            read.append(name)
            return self.handle.get_tensor(name)

    monkeypatch.setattr(loader, "safe_open", Spy)
    got = load_model(folder, kind, gguf=path)
    assert got.quant_summary == want.quant_summary
    assert _linear_names(got) == set()  # every Linear replaced, none left on meta
    assert not any(t.is_meta for t in [*got.parameters(), *got.buffers()])
    ws, gs = want.state_dict(), got.state_dict()
    assert ws.keys() == gs.keys()
    for name in ws:
        assert torch.equal(ws[name], gs[name]), name
    # only embeddings, norms and biases came from the folder
    assert read and all("norm" in n or n.endswith(".bias") or "embed_tokens" in n
                        for n in read), read
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    pos = torch.arange(8)[None]
    assert torch.equal(got(ids, pos, got.new_cache(8)).logits,
                       want(ids, pos, want.new_cache(8)).logits)


def test_folder_without_linear_weights_loads_as_q4(saved, tmp_path):
    config, state, folder, path = saved
    kept = {k: v for k, v in state.items() if v.dim() == 1 or "embed_tokens" in k}
    assert len(kept) < len(state)
    safetensors.torch.save_file(kept, str(folder / "model.safetensors"))
    model = load_model(folder, "q4", gguf=path)
    assert model.quant_summary and not _linear_names(model)
    # the full loader needs them: this folder is what only the light path can load
    with pytest.raises(DraftsmanError, match="missing"):
        load_model(folder, "bf16")
    del kept[next(k for k in kept if "norm" in k)]
    safetensors.torch.save_file(kept, str(folder / "model.safetensors"))
    with pytest.raises(DraftsmanError, match="missing"):
        load_model(folder, "q4", gguf=path)


def test_a_truncated_gguf_is_one_line(saved, tmp_path):
    *_, path = saved
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(DraftsmanError, match="not a readable GGUF") as err:
        read_gguf_blocks(cut)
    assert "\n" not in str(err.value)
