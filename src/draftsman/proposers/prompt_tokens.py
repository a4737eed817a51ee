"""Speculative decoding with a draft model that drafts with its own prompt tokens (Chen et
al., "Hardware-Aware Parallel Prompt Decoding", section 5.3): fewer draft forwards per drafted
token. The prompt tokens' weights live in models/prompt_tokens.py, the tree forward that reads
their guesses in verification/prompt_tree.py."""

from __future__ import annotations

import torch

from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler
from draftsman.verification.prompt_tree import TreeDecoder

# ----------------------------------------------------------------------------- acceptance


# ----------------------------------------------------------------------------- decoding


class PromptTokenDraftProposer(Proposer):
    """Speculative decoding with a draft model that decodes with its own prompt tokens.

    The draft's greedy continuation is produced with tree forwards (exact for the draft), so
    a proposal of γ tokens costs fewer than γ draft forwards. Guesses are deterministic
    (q = None), so speculative sampling stays exact for the target in every setting.
    """

    name = "prompt-token-draft"
    uses_model = True

    def __init__(self, decoder: TreeDecoder) -> None:
        self.decoder = decoder
        self.cache = None
        self.fed: list[int] = []
        self.guesses: torch.Tensor | None = None
        self.guess_key: tuple[int, int] | None = None  # (len(fed), pending token) they follow

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.cache = self.decoder.model.new_cache(capacity + self.decoder.max_rows + 2)
        self.fed = []
        self.guesses, self.guess_key = None, None

    def _sync(self, committed: list[int]) -> list[int]:
        n = min(len(self.fed), len(committed))
        i = 0
        while i < n and self.fed[i] == committed[i]:
            i += 1
        if i < len(self.fed):
            del self.fed[i:]
            self.cache.truncate(i)
        return committed[i:]

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        pending = self._sync(committed)
        out: list[int] = []
        forwards = 0
        while len(out) < gamma:
            valid = self.guess_key == (len(self.fed), pending[-1]) and len(pending) == 1
            res = self.decoder.step(self.cache, pending, self.guesses if valid else None)
            forwards += 1
            self.fed.extend(pending + res.accepted)
            out.extend(res.accepted + [res.next_token])
            pending = [res.next_token]
            self.guesses, self.guess_key = res.guesses, (len(self.fed), res.next_token)
        return Proposal(out[:gamma], None, forwards)

    def commit(self, committed: list[int]) -> None:
        self._sync(committed)
