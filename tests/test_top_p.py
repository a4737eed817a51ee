"""top-p ranks only a head of the vocabulary where that decides a row: the kept tokens are
the float64 reference's (ties lower id first) whichever way each row is decided, the same
alone and in a batch, and a head trusted without its check would keep the wrong tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftsman import sampling
from draftsman.sampling import SamplingConfig, probabilities, top_p_kept
from draftsman.testing.reference import reference_probabilities

VOCAB = 151936


def peaked(seed: int, rows: int, vocab: int = VOCAB, spread: float = 2.0,
           peaks: bool = True) -> torch.Tensor:
    """LM-like logits: a broad body and (`peaks`) a few tokens far above it; bf16-rounded,
    so that equal logits (ties) are common. Without peaks the nucleus spans thousands."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, vocab, generator=g) * spread
    if peaks:
        top = torch.randint(0, vocab, (rows, 8), generator=g)
        z.scatter_(-1, top, 6 + 4 * torch.rand(rows, 8, generator=g))
    return z.to(torch.bfloat16).float()


def reference_kept(z: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    return torch.stack([torch.from_numpy(
        reference_probabilities(r.double().numpy(), temperature, top_k, top_p) > 0) for r in z])


def assert_kept_as_reference(got: torch.Tensor, z: torch.Tensor, temperature: float,
                             top_k: int, top_p: float) -> None:
    """got is the reference's kept set, but where float32 sums meet top_p: a token kept by
    one and not the other must have the float64 mass ranked above it within 1e-5 of top_p."""
    want = reference_kept(z, temperature, top_k, top_p)
    for row, g, w in zip(z, got, want, strict=True):
        differ = (g != w).nonzero().flatten()
        if differ.numel() == 0:
            continue
        p = torch.from_numpy(reference_probabilities(row.double().numpy(), temperature, top_k))
        order = sorted(range(p.numel()), key=lambda i: (-float(p[i]), i))
        above = dict(zip(order, np.cumsum([0.0] + [float(p[i]) for i in order[:-1]]),
                         strict=True))
        assert all(abs(above[int(i)] - top_p) < 1e-5 for i in differ), differ


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.9), (1.0, 0, 0.95),
                                                     (1.0, 40, 0.9), (1.5, 0, 0.5)])
def test_kept_tokens_are_the_references(temperature, top_k, top_p):
    z = peaked(1, 6)
    got = probabilities(z, SamplingConfig(temperature, top_k, top_p)) > 0
    assert_kept_as_reference(got, z, temperature, top_k, top_p)


def test_rows_past_the_head_and_flat_rows():
    """A flat row's nucleus holds most of the vocabulary: it is ranked whole, its batch
    neighbours from their heads; each row as alone."""
    z = torch.cat([peaked(2, 3), peaked(3, 2, spread=0.05, peaks=False)])
    kept = top_p_kept(z, 0.9)
    assert int(kept[3].sum()) > VOCAB // 4  # past every head
    assert torch.equal(kept, torch.stack([top_p_kept(r, 0.9) for r in z]))
    assert_kept_as_reference(kept, z, 1.0, 0, 0.9)


def test_head_and_whole_ranking_keep_the_same(monkeypatch):
    z = torch.cat([peaked(4, 4), peaked(5, 2, spread=0.3, peaks=False)])
    by_heads = top_p_kept(z, 0.95)
    monkeypatch.setattr(sampling, "TOP_P_HEAD", VOCAB)  # past a quarter: every row whole
    assert torch.equal(by_heads, top_p_kept(z, 0.95))


def test_ties_across_the_cut_keep_the_lower_ids():
    """Equal probabilities straddling the cut: the lower ids stay (the reference's order)."""
    z = torch.full((1, 5000), -20.0)
    z[0, [4000, 17, 2500, 900]] = 3.0  # four tied tokens, ~0.25 each
    kept = top_p_kept(z, 0.6)  # needs three of them
    assert kept[0].nonzero().flatten().tolist() == [17, 900, 2500]
    assert torch.equal(kept, reference_kept(z, 1.0, 0, 0.6))


def trusting_head(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """A mutation: the first head's ranking taken as the answer, unchecked."""
    mask, _ = sampling._kept_of_head(logits.softmax(-1).reshape(-1, logits.shape[-1]),
                                     sampling.TOP_P_HEAD, top_p)
    return mask.reshape(logits.shape)


def test_an_unchecked_head_fails():
    z = peaked(6, 2, spread=0.3, peaks=False)  # nuclei of thousands of tokens
    got = top_p_kept(z, 0.9)
    assert int(got.sum(-1).min()) > sampling.TOP_P_HEAD
    assert_kept_as_reference(got, z, 1.0, 0, 0.9)
    assert int(trusting_head(z, 0.9).sum(-1).max()) <= sampling.TOP_P_HEAD


def test_distribution_sums_to_one_on_the_kept():
    z = peaked(7, 3)
    p = probabilities(z, SamplingConfig(0.8, 0, 0.9))
    assert np.allclose(p.sum(-1).numpy(), 1.0, atol=1e-5)
    assert torch.equal(p > 0, top_p_kept(z / 0.8, 0.9))
