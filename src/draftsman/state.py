"""A model together with its KV cache and the tokens that cache holds.

`fed` mirrors the cache: fed[i] is the token whose keys/values sit at slot i. Keeping a
model "in step" with the committed text is then one rule: roll the cache back to the longest
common prefix of `fed` and the committed tokens, and feed what is missing.
"""

from __future__ import annotations

import torch

from draftsman.models.base import ALL, DecoderLM, Output


class ModelState:
    def __init__(self, model: DecoderLM, capacity: int) -> None:
        self.model = model
        self.cache = model.new_cache(capacity)
        self.fed: list[int] = []
        self.forwards = 0

    def feed(self, tokens: list[int], logits_at: slice | torch.Tensor | None = ALL) -> Output:
        """Run the model on `tokens` appended after the cached ones."""
        start = len(self.fed)
        ids = torch.tensor([tokens], dtype=torch.long)
        pos = torch.arange(start, start + len(tokens), dtype=torch.long)[None]
        out = self.model(ids, pos, self.cache, logits_at=logits_at)
        self.fed.extend(tokens)
        self.forwards += 1
        return out

    def sync(self, committed: list[int]) -> list[int]:
        """Roll back to the common prefix with `committed`; return the tokens still to feed."""
        n = min(len(self.fed), len(committed))
        i = 0
        while i < n and self.fed[i] == committed[i]:
            i += 1
        if i < len(self.fed):
            del self.fed[i:]
            self.cache.truncate(i)
        return committed[i:]
