"""Speculative decoding with a draft model that drafts with its own prompt tokens (Chen et
al., "Hardware-Aware Parallel Prompt Decoding", section 5.3): fewer draft forwards per drafted
token. The prompt tokens' weights live in models/prompt_tokens.py, the tree forward that reads
their guesses in verification/prompt_tree.py."""

from __future__ import annotations

import torch

from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.verification.prompt_tree import TreeDecoder


class PromptTokenDraftProposer(Proposer):
    """Speculative decoding with a draft model that decodes with its own prompt tokens.

    The draft's greedy continuation is produced with tree forwards (exact for the draft), so
    a proposal of γ tokens costs fewer than γ draft forwards. Guesses are deterministic
    (q = None), so speculative sampling stays exact for the target in every setting.
    The guesses read at one step stay valid for the next only if the text continued with
    the token they follow (`guess_key`).
    """

    name = "prompt-token-draft"
    uses_model = True

    def __init__(self, decoder: TreeDecoder) -> None:
        self.decoder = decoder
        self.state: ModelState | None = None
        self.guesses: torch.Tensor | None = None
        self.guess_key: tuple[int, int] | None = None  # (len(fed), pending token) they follow

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        # tree nodes and prompt tokens are written after the text, then compacted
        self.state = ModelState(self.decoder.model, capacity,
                                extra_rows=self.decoder.max_rows + 2)
        self.guesses, self.guess_key = None, None

    def propose(self, committed: list[int], gamma: int, sampler: Sampler,
                stop_below: float | None = None) -> Proposal:
        state = self.state
        pending = state.sync(committed, final=False)  # a cascade may still drop its tail
        out: list[int] = []
        forwards = 0
        while len(out) < gamma:
            valid = self.guess_key == (len(state.fed), pending[-1]) and len(pending) == 1
            res = self.decoder.step(state.cache, pending, self.guesses if valid else None)
            forwards += 1
            state.record(pending + res.accepted)
            out.extend(res.accepted + [res.next_token])
            pending = [res.next_token]
            self.guesses, self.guess_key = res.guesses, (len(state.fed), res.next_token)
        return Proposal(out[:gamma], None, forwards)

    def commit(self, committed: list[int]) -> None:
        self.state.sync(committed)
