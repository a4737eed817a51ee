"""A CPU draw is the inverse of the cumulative distribution at a seeded uniform: tokens of
mass 0 are never drawn, frequencies follow the probabilities (with a negative control), and
the same seed gives the same draws on the host and the tensor paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftsman.sampling import Sampler, SamplingConfig, inverse_cdf_draw

SPARSE = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])


@pytest.mark.parametrize("u,token", [(0.0, 1), (0.1999, 1), (0.2, 3), (0.6999, 3), (0.7, 4),
                                     (float(np.nextafter(np.float32(1), np.float32(0))), 4)])
def test_each_uniform_picks_its_token(u, token):
    assert int(inverse_cdf_draw(SPARSE, torch.tensor(u))) == token


def test_unnormalised_masses_and_last_token_of_mass():
    p = SPARSE * 7.5  # any total
    assert int(inverse_cdf_draw(p, torch.tensor(0.99999994))) == 4  # never the zero past it
    assert int(inverse_cdf_draw(torch.tensor([0.0, 0.0, 3.0]), torch.tensor(0.0))) == 2


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def frequencies(draw, probs: torch.Tensor, n: int) -> np.ndarray:
    return np.bincount([int(draw(probs)) for _ in range(n)], minlength=probs.numel())


def test_frequencies_follow_the_probabilities():
    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(40, generator=g) * 2, -1)
    probs[[3, 17]] = 0.0
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=11))
    counts = frequencies(sampler.draw_tensor, probs, 20000)
    assert counts[3] == counts[17] == 0
    # 37 degrees of freedom: the 0.999 quantile is ~69.3
    assert chi_square(counts, probs.numpy()) < 69.3
    # negative control: a draw off by one token is far outside
    shifted = frequencies(lambda p: (sampler.draw_tensor(p) + 1) % p.numel(), probs, 20000)
    assert chi_square(shifted, probs.numpy()) > 1000


def test_same_seed_same_draws_on_both_paths():
    probs = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(2)), -1)
    a, b = Sampler(SamplingConfig(1.0, seed=4)), Sampler(SamplingConfig(1.0, seed=4))
    assert [a.draw(probs) for _ in range(50)] == [int(b.draw_tensor(probs)) for _ in range(50)]
