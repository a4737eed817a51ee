"""q4-draft: a draft's matrices all on Q4_K blocks (models/quant_linear.py,
kernels/gguf_convert.cpp), and engines that load their drafts in it (engine.py).

The requantiser's bytes must be Q4_K as gguf reads them (a wrong scale packing or nibble
order shows up as a large error against the float weights), padding must add exactly zero,
rows must stay batch-invariant, and a q4 target verifying a q4-draft draft must emit its own
autoregressive tokens.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import gguf_model, quantised
from test_speculative import prompts, run

import draftsman.engine as engine_module
from draftsman.engine import Engine, LoadedModel
from draftsman.errors import ModelNotFoundError
from draftsman.kernels.native import kquant_available
from draftsman.models.quant_linear import KQuantMatrix, KQuantRecordsMatrix
from draftsman.models.weight_formats import companion_dtype
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.server.worker import pin_models
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.speculative import Speculative

needs_kernel = pytest.mark.skipif(not kquant_available(), reason="the K-quant kernel does not "
                                  "build here")


def requantised(w: torch.Tensor) -> torch.Tensor:
    """w through quantize_q4k, read back by gguf's own Q4_K decoder: [N, K padded]."""
    rows = torch.ops.draftsman.quantize_q4k(w.contiguous()).numpy()
    width = -(-w.shape[1] // 256) * 256
    return torch.from_numpy(dequantize(rows, Q.Q4_K).astype(np.float32)).reshape(-1, width)


@needs_kernel
@pytest.mark.parametrize("k", [256, 320, 896])
def test_requantised_blocks_are_q4k_as_gguf_reads_them(k):
    w = torch.randn(40, k, generator=torch.Generator().manual_seed(k)) * 0.02
    w[3, :32] = -0.01  # a constant negative sub-block: all of it in the min
    w[4] = 0.0
    back = requantised(w)
    assert back.shape == (40, -(-k // 256) * 256)
    assert torch.equal(back[:, k:], torch.zeros_like(back[:, k:]))  # padding is exactly zero
    assert torch.equal(back[4], torch.zeros_like(back[4]))
    # its min is a 6-bit multiple of the block's dmin = (largest min) / 63: half a step off
    dmin = float(w[3, :256].reshape(-1, 32).amin(-1).clamp(max=0).abs().max()) / 63
    torch.testing.assert_close(back[3, :32], w[3, :32], rtol=0, atol=dmin / 2 + 1e-6)
    err = back[:, :k] - w
    # 16 levels over a sub-block's range: a Gaussian's RMS error is ~0.075 of its sd after
    # the refits; a wrong scale packing or nibble order gives errors of the weights' size
    assert float(err.pow(2).mean().sqrt()) < 0.09 * float(w.std())
    # each weight within 3/4 of its sub-block's min-max step (half a step, plus the 6-bit
    # scales' rounding); the constant sub-block, a zero-width range, was checked above
    groups = w.reshape(40, -1, 32)
    step = (groups.amax(-1) - groups.amin(-1).clamp(max=0)) / 15
    step[3, 0] = float("inf")
    assert bool((err.reshape(40, -1, 32).abs() <= 0.75 * step[..., None] + 1e-7).all())


@needs_kernel
def test_padded_matrix_computes_the_requantised_weights_batch_invariantly():
    """K = 320 padded to 512 with zero weights: the kernel takes the 320-wide rows as they
    are, bitwise what it computes from rows zero-padded (to 384, the end of the records'
    half last record; both kernel paths this CPU runs), close to the float product, and
    batch invariant."""
    from draftsman.models.quant_linear import requantized_q4k

    w = torch.randn(48, 320, generator=torch.Generator().manual_seed(1)) * 0.05
    matrix = requantized_q4k(w)
    assert isinstance(matrix, KQuantMatrix | KQuantRecordsMatrix)
    x = torch.randn(17, 320, generator=torch.Generator().manual_seed(2))
    want = x @ requantised(w)[:, :320].T
    got = matrix(x)
    assert got.shape == (17, 48)
    padded = torch.nn.functional.pad(x, (0, 64))
    assert torch.equal(got, matrix(padded))
    assert torch.equal(matrix(x.bfloat16()), matrix(padded.bfloat16()))
    # activations are rounded to int8 per 256 inputs: half a step of each block's largest
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    for rows in (1, 3, 16):
        assert torch.equal(matrix(x[:rows]), got[:rows])
    with pytest.raises(RuntimeError, match="kquant"):
        matrix(x[:, :256])  # a whole block short: not this matrix's input


@needs_kernel
def test_q4_draft_runs_every_matrix_on_q4k_and_stays_close():
    config, state, blocks = gguf_model("qwen2")
    q4 = quantised(config, state, blocks)
    draft = quantised(config, state, blocks, kind="q4-draft")
    assert set(draft.quant_summary) == {"Q4_K -> Q4_K kernel (as stored)",
                                        "Q6_K -> Q4_K kernel (requantised)",
                                        "Q4_1 -> Q4_K kernel (requantised)",
                                        "Q4_0 -> Q4_K kernel (requantised)",
                                        "Q8_0 -> Q4_K kernel (requantised)"}
    kernels = (KQuantMatrix, KQuantRecordsMatrix)
    for name, module in draft.named_modules():
        if name.endswith("parts"):
            assert all(isinstance(p, kernels) for p in module), name
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(10)[None]
    want = q4(ids, pos, q4.new_cache(10)).logits
    got = draft(ids, pos, draft.new_cache(10)).logits
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cos) > 0.98


@needs_kernel
def test_q4_target_with_a_q4_draft_draft_emits_its_own_tokens():
    config, state, blocks = gguf_model("llama", seed=0, lm_scale=8.0)
    target = quantised(config, state, blocks)
    draft = quantised(config, state, blocks, kind="q4-draft")
    reference = Autoregressive(target)
    accepted = 0
    for prompt in prompts(3):
        want, _ = run(reference, prompt, max_new=24)
        got, steps = run(Speculative(target, DraftModelProposer(draft), make_policy(4, None)),
                         prompt, max_new=24)
        assert got == want
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0


# ---------------------------------------------------------------------- engines' drafts


def stub(name: str, dtype) -> LoadedModel:
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=97), dtype=dtype)
    tokenizer = SimpleNamespace(vocab={"a": 0}, backend=object())  # its own parse
    return LoadedModel(name, Path("/nonexistent"), model, tokenizer)


@pytest.fixture
def q4_engine(monkeypatch):
    loads: list[tuple[str, object]] = []

    def load_bundle(spec, dtype, *args):
        loads.append((spec, dtype))
        return stub(spec, dtype)

    monkeypatch.setattr(engine_module, "load_bundle", load_bundle)
    return Engine(stub("target", "q4"), "q4"), loads


def test_a_q4_engine_loads_drafts_as_q4_draft_once(q4_engine):
    engine, loads = q4_engine
    assert companion_dtype("q4") == "q4-draft" and companion_dtype(torch.bfloat16) == torch.bfloat16
    first = engine.model("small")
    assert engine.model("small") is first and engine.model("small", "q4-draft") is first
    as_stored = engine.model("small", "q4")
    assert as_stored is not first and engine.model("small", "q4") is as_stored
    assert loads == [("small", "q4-draft"), ("small", "q4")]


def test_a_server_serves_its_drafts_in_one_format(q4_engine):
    engine, loads = q4_engine
    engine.model("small")
    pin_models(engine, ["small"], "small")
    assert engine.model("small").model.dtype == "q4-draft"
    with pytest.raises(ModelNotFoundError, match="as q4-draft, not q8"):
        engine.model("small", "q8")
    assert loads == [("small", "q4-draft")]
