"""Methods on a device: parallel prompt decoding keeps its tensors on the model's device and
commits exactly what autoregressive decoding does there. CPU always; CUDA marked `gpu`."""

from __future__ import annotations

import pytest
import torch
from devices import devices
from test_parallel_prompt import SHAPES, run, sharp_model

from draftsman.models.prompt_tokens import PromptTokens
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.parallel_prompt import ParallelPrompt
from draftsman.trees.layout import TreeSpec, layout
from draftsman.verification.prompt_tree import TreeDecoder


def test_layout_moves_whole() -> None:
    lay = layout(TreeSpec.build([((), 2), ((0,), 1), ((1,), 0)]), 2, prefix=3)
    assert lay.to(torch.device("cpu")) is lay
    meta = lay.to(torch.device("meta"))
    assert meta.mask.device.type == "meta" and meta.prompt_rows.device.type == "meta"
    assert meta.spec == lay.spec and meta.prefix == 3 and meta.offsets.shape == lay.offsets.shape


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", ["chain", "dynamic-24", "random-20"])
def test_parallel_prompt_exact_on_the_device(device: str, shape: str) -> None:
    model = sharp_model()
    ref = run(Autoregressive(model), n=24)
    model = model.to(device)
    prompts = PromptTokens.from_vocabulary(model, 3, 1, seed=1)
    assert prompts.embeddings.device.type == "cpu"  # a host object; the decoder moves it
    decoder = TreeDecoder(model, prompts, SHAPES[shape](3))
    assert decoder.embeds.device.type == device
    assert run(ParallelPrompt(decoder), n=24) == ref
    cache = model.new_cache(64)
    out = decoder.step(cache, [5, 17, 3], None)
    assert out.guesses is not None and out.guesses.device.type == device
    assert all(isinstance(t, int) for t in [*out.accepted, out.next_token])


@pytest.mark.parametrize("device", devices())
def test_parallel_prompt_sampling_reproducible_on_the_device(device: str) -> None:
    model = sharp_model().to(device)
    prompts = PromptTokens.from_vocabulary(model, 3, 1, seed=1)
    strategy = ParallelPrompt(TreeDecoder(model, prompts, SHAPES["dynamic-8"](3)))
    runs = [run(strategy, n=20, temperature=0.8, seed=3) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 20
