"""Device parametrisation for tests: "cpu" always, "cuda" (marked gpu) where torch sees one."""

from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()


def devices() -> list:
    """pytest.param values for `@pytest.mark.parametrize("device", devices())`: the CUDA
    case is marked `gpu` and skipped without a GPU, so `make test-gpu` selects it."""
    return ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not CUDA, reason="needs a CUDA GPU")])]
