"""A float64 reference sampler written from the definitions, independent of sampling.py.

Order and conventions (those of Hugging Face transformers' warpers, checked in the tests):
1. temperature T > 0 divides the logits;
2. top-k keeps every token whose logit is >= the k-th largest (ties at the cut are kept);
3. top-p ranks the remaining tokens by probability (ties: lower token id first) and keeps
   a token iff the probability of the tokens ranked before it is < top_p, so the kept set is
   the shortest head whose mass reaches top_p (the token that crosses it included, the
   first always kept);
4. the kept tokens' softmax is the distribution. T = 0 (or top_k = 1) is the one-hot
   distribution on the argmax (lowest id on ties).
"""

from __future__ import annotations

import numpy as np


def reference_probabilities(logits, temperature: float, top_k: int = 0,
                            top_p: float = 1.0) -> np.ndarray:
    """logits [V] (anything numpy reads) -> float64 probabilities [V]."""
    z = np.asarray(logits, dtype=np.float64).copy()
    if temperature == 0 or top_k == 1:
        out = np.zeros_like(z)
        out[int(np.argmax(z))] = 1.0
        return out
    z /= temperature
    keep = np.ones(z.shape, dtype=bool)
    if 0 < top_k < z.size:
        kth = np.sort(z)[::-1][top_k - 1]
        keep &= z >= kth
    if top_p < 1.0:
        p = _softmax(np.where(keep, z, -np.inf))
        order = sorted(np.flatnonzero(keep), key=lambda i: (-p[i], i))
        before = 0.0
        for i in order:
            if before >= top_p:
                keep[i] = False
            before += p[i]
    return _softmax(np.where(keep, z, -np.inf))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z[np.isfinite(z)].max())
    return e / e.sum()
