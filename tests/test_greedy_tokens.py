"""`greedy_tokens` is argmax's rule (the first index of the maximum, a NaN counting as the
maximum) on every float dtype and shape the engine hands it, ties and NaNs included, both
ways it is taken on the CPU: the `greedy_rows` kernel (where the kernels build) and
`max(-1).indices`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftsman.kernels import native
from draftsman.sampling import SamplingConfig, greedy_tokens, probabilities

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(params=["kernel", "max"])
def path(request, monkeypatch):
    """Which way greedy_tokens takes: the kernel (skipped where it does not build) or max."""
    if request.param == "kernel":
        if not native.kquant_available():
            pytest.skip(f"the kernels do not build here: {native.unavailable_reason()}")
        monkeypatch.setattr(native, "greedy_rows_ready", lambda: True)
    else:
        monkeypatch.setattr(native, "greedy_rows_ready", lambda: False)
    return request.param


def first_max(row: np.ndarray) -> int:
    """The rule written out: the first NaN if there is one, else the first maximum."""
    nan = np.flatnonzero(np.isnan(row))
    if nan.size:
        return int(nan[0])
    return int(np.flatnonzero(row == row.max())[0])


def reference(x: torch.Tensor) -> torch.Tensor:
    flat = x.float().reshape(-1, x.shape[-1]).numpy()
    return torch.tensor([first_max(r) for r in flat], dtype=torch.long).reshape(x.shape[:-1])


def tied_logits(seed: int, rows: int, vocab: int) -> torch.Tensor:
    """Small integers, each row's maximum at least twice (its last entry repeats it)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 4, (rows, vocab), generator=g).float()
    if vocab > 1:
        x[:, -1] = x[:, :-1].max(-1).values
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 1), (1, 7), (2, 17), (3, 1000), (16, 151936)])
def test_ties_take_the_first_maximum(path, dtype, rows, vocab):
    x = tied_logits(rows + vocab, rows, vocab).to(dtype)
    # the data must tell first from last: each row's maximum appears more than once
    assert vocab == 1 or all(int((r == r.max()).sum()) > 1 for r in x.float())
    got = greedy_tokens(x)
    assert got.dtype == torch.long and got.shape == (rows,)
    assert torch.equal(got, reference(x))
    assert torch.equal(got, x.argmax(-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_infinities(path, dtype):
    x = tied_logits(7, 6, 500)
    x[0, 123] = float("nan")
    x[0, 400] = float("nan")  # the first NaN wins
    x[1, :] = float("-inf")  # all -inf: index 0
    x[2, 77] = float("inf")
    x[3, ::2] = float("-inf")
    x[4, 499] = float("nan")
    x[5, :] = float("inf")
    x[5, 3] = float("nan")  # a NaN after +infs still wins
    x = x.to(dtype)
    got = greedy_tokens(x)
    assert got.tolist() == [123, 0, 77, got.tolist()[3], 499, 3]
    assert torch.equal(got, reference(x))
    assert torch.equal(got, x.argmax(-1))


def test_one_row_and_batches_of_rows(path):
    x = tied_logits(3, 24, 64).to(torch.bfloat16)
    assert greedy_tokens(x[5]).shape == ()  # [V] -> a 0-d tensor, as argmax()
    assert int(greedy_tokens(x[5])) == int(reference(x)[5])
    batched = x.reshape(2, 12, 64)
    assert torch.equal(greedy_tokens(batched), reference(batched))


def test_greedy_probabilities_are_one_hot_on_it(path):
    x = tied_logits(11, 4, 300)
    p = probabilities(x, SamplingConfig())
    assert torch.equal(p.argmax(-1), reference(x))
    assert torch.equal(p.sum(-1), torch.ones(4))


def test_the_kernel_alone_and_in_a_batch():
    """The op's row is its own: the same token alone and among other rows, on any threads."""
    if not native.kquant_available():
        pytest.skip(f"the kernels do not build here: {native.unavailable_reason()}")
    x = tied_logits(13, 16, 5000).to(torch.bfloat16)
    x[9, 4000] = float("nan")
    batch = torch.ops.draftsman.greedy_rows(x)
    alone = torch.stack([torch.ops.draftsman.greedy_rows(r) for r in x])
    assert torch.equal(batch, alone) and torch.equal(batch, reference(x))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(torch.ops.draftsman.greedy_rows(x), batch)
    finally:
        torch.set_num_threads(threads)


def test_kernel_refuses_what_it_does_not_take():
    if not native.kquant_available():
        pytest.skip(f"the kernels do not build here: {native.unavailable_reason()}")
    with pytest.raises(RuntimeError, match="float32 or bfloat16 only"):
        torch.ops.draftsman.greedy_rows(torch.zeros(2, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.draftsman.greedy_rows(torch.zeros(8, 2).t())


def test_other_dtypes_and_layouts_fall_back(path):
    x = tied_logits(17, 8, 300)
    assert torch.equal(greedy_tokens(x.to(torch.float16)), reference(x))
    strided = x.t().contiguous().t()  # the same values, not contiguous
    assert not strided.is_contiguous()
    assert torch.equal(greedy_tokens(strided), reference(x))


def test_a_last_maximum_rule_fails_these_checks():
    """Negative control: taking the last maximum instead gives other tokens on this data."""
    x = tied_logits(5, 8, 1000)
    last = torch.tensor([int(np.flatnonzero(r == r.max())[-1]) for r in x.numpy()])
    assert not torch.equal(last, reference(x))
    assert not torch.equal(last, greedy_tokens(x))
