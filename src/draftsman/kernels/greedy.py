"""Each row's greedy token: the argmax of logits, by the fastest way this process has.

Below the models and the sampling: a model's head may give greedy tokens instead of logits
(`DecoderLM.greedy_head`), and `sampling` takes them from logits the same way.
"""

from __future__ import annotations

import torch

from draftsman.kernels import native


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dim of logits [..., V] (int64 [...]): the first index of the
    maximum, a NaN counting as the maximum, exactly as `Tensor.argmax(-1)`. On the CPU: one
    AVX-512 pass a row (`draftsman::greedy_rows`) where the kernels are loaded with it, else
    `max(-1).indices`, the same rule through a faster reduction than argmax's. bf16 logits of
    16 x 151,936 (a verify's rows): argmax 3.85 ms, max 0.82, greedy_rows 0.13; one row
    0.49 / 0.10 / 0.015 (an AMX Xeon, 2 threads; bench-results/logits-read). Elsewhere
    argmax itself."""
    if logits.device.type != "cpu":
        return logits.argmax(-1)
    if (logits.dtype in (torch.float32, torch.bfloat16) and logits.is_contiguous()
            and logits.shape[-1] > 0 and native.greedy_rows_ready()):
        return torch.ops.draftsman.greedy_rows(logits)
    return logits.max(-1).indices
