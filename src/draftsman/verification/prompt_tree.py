"""One tree forward of a model with prompt tokens (parallel prompt decoding).

Input rows: the missing committed tokens, the candidate tree (root = last committed
token), and prompt tokens on every candidate (trees/layout.py). Output: the accepted path,
the next token, and the guesses for the next step read from the prompt tokens of the last
accepted node: guess_i = top-k of (1/n) sum_e logits(prompt token i, EPT e), i = 1..k, which
guesses the token at distance i + 1 from that node, i.e. distance i after the next token.
The number k of prompt tokens the accepted node carried is the *state* of the dynamic
sparse tree: the next tree has candidates up to depth k.

Exactness: candidate rows never attend to prompt rows, so the target's argmax at each
candidate row equals its argmax after the same prefix in an ordinary forward; greedy
matching (`accept_greedy`) therefore commits exactly the autoregressive tokens. Typical
acceptance (Medusa) for sampling is lossy.

Devices: every tensor of a step lives on the model's device (the layouts are moved there
once and cached); the host keeps only the integers it branches on. A greedy step makes one
transfer: the accepted node, the next token and the path's tokens together."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsman.models.base import DecoderLM
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.sampling import Sampler, greedy_tokens
from draftsman.trees.layout import TreeLayout, TreeSpec, fill_tokens, layout
from draftsman.verification.tree import TypicalAcceptance, accept_typical, greedy_end


@dataclass
class Outcome:
    """What one tree forward decided."""

    accepted: list[int]  # candidate tokens kept (now in the cache)
    next_token: int  # the target's token after them (not in the cache yet)
    state: int  # prompt tokens the last accepted node carried = depth of the next guesses
    guesses: torch.Tensor | None  # [state, K] ranked guesses for distances 1..state
    drafted: int  # candidate nodes in the tree (excluding the root)
    rejected: bool  # the last accepted node had candidate children (a guess was refused)
    rows: int  # rows of the forward


class TreeDecoder:
    """A model with prompt tokens and one tree spec per state (0..m).

    Invariant: before `step`, the cache holds exactly the committed tokens except the
    `pending` ones passed in; after it, it holds them plus the accepted candidates, and the
    returned next_token is the new single pending token.
    """

    def __init__(self, model: DecoderLM, prompts: PromptTokens,
                 trees: dict[int, TreeSpec], topk: int | None = None) -> None:
        prompts.check(model)
        self.model = model
        self.prompts = prompts
        self.m = prompts.count
        self.embeds = prompts.embeddings.to(device=model.device, dtype=model.dtype)  # [m,n,H]
        self.trees: dict[int, TreeSpec] = {}
        for state in range(self.m + 1):
            spec = trees.get(state) or trees[max(s for s in trees if s <= state)]
            if spec.depth > state:
                raise ValueError(f"tree for state {state} is deeper ({spec.depth}) than the "
                                 "guesses available")
            if max(spec.prompts) > self.m:
                raise ValueError(f"a tree node carries more than the {self.m} prompt tokens")
            self.trees[state] = spec
        need = max((max(s.topk(), default=0) for s in self.trees.values()), default=0)
        self.topk = max(1, topk or need, need)
        # (host layout for the integer lists, the same on the model's device for tensor ops)
        self._layouts: dict[tuple[int, int], tuple[TreeLayout, TreeLayout]] = {}

    @property
    def max_rows(self) -> int:
        return max(s.size(self.prompts.epts) for s in self.trees.values())

    def layout(self, state: int | None, prefix: int) -> TreeLayout:
        """state None: the root alone with all m prompt tokens (prefill, stale guesses)."""
        return self._layout_pair(state, prefix)[0]

    def _layout_pair(self, state: int | None, prefix: int) -> tuple[TreeLayout, TreeLayout]:
        key = (-1 if state is None else state, prefix)
        pair = self._layouts.get(key)
        if pair is None:
            spec = TreeSpec(((),), (self.m,)) if state is None else self.trees[state]
            lay = layout(spec, self.prompts.epts, prefix)
            pair = (lay, lay.to(self.model.device))
            if prefix <= 1:  # prefills vary in length: cache only the per-step layouts
                self._layouts[key] = pair
        return pair

    def step(self, cache, pending: list[int], guesses: torch.Tensor | None,
             sampler: Sampler | None = None,
             typical: TypicalAcceptance | None = None) -> Outcome:
        """One forward over pending[:-1] (plain), the tree rooted at pending[-1], prompts.

        Greedy matching when `sampler` is None or greedy; otherwise typical acceptance and
        the next token drawn from the target's distribution after the accepted path.
        """
        model = self.model
        state = None if guesses is None else int(guesses.shape[0])
        lay, dl = self._layout_pair(state, len(pending) - 1)  # host, device
        dev = model.device
        cand = fill_tokens(dl, guesses, pending[-1])  # [C] on the device
        ids = torch.zeros(lay.rows, dtype=torch.long, device=dev)  # prompt rows: replaced below
        ids[: lay.prefix] = torch.tensor(pending[:-1], dtype=torch.long, device=dev)
        ids[dl.node_rows] = cand
        start = cache.length
        pos = (dl.offsets + start + lay.prefix)[None]  # [1, T]
        embeds = model.embed(ids[None], pos)  # [1, T, H]
        if lay.prompt_owner.numel():
            embeds[0, lay.node_rows.numel() + lay.prefix:] = \
                self.embeds[dl.prompt_index - 1, dl.prompt_ept]
        out = model(None, pos, cache, mask=dl.mask, inputs_embeds=embeds,
                    logits_at=dl.node_rows, start=start)
        logits = out.logits[0]  # [C, V]
        greedy = sampler is None or sampler.greedy
        if greedy:
            argmax = greedy_tokens(logits)
            end_t = greedy_end(dl, cand, argmax)
            # one transfer: the node, the target's next token, the tokens root..node
            got = torch.cat([end_t[None], argmax[end_t][None], cand[dl.ancestors[end_t]]])
            end, next_token, *along = got.tolist()
            accepted = along[1: lay.depth_list[end] + 1]
        else:
            probs = sampler.probs(logits)
            end = accept_typical(dl, cand, probs, typical or TypicalAcceptance())
            next_token = sampler.draw(probs[end])
            accepted = cand[dl.ancestors[end, 1: lay.depth_list[end] + 1]].tolist()
        path = lay.path_to(end)
        slots = list(range(start, start + lay.prefix)) + [start + lay.node_rows_list[j]
                                                          for j in path]
        cache.keep(slots, start)
        k = lay.prompt_count_list[end]
        new_guesses = None
        if k:
            rows = dl.prompt_rows[end, :k].reshape(-1)  # [k * n]
            g = model.head(out.hidden[0, rows])  # [k * n, V]
            g = g.view(k, lay.epts, -1).float().mean(1)  # EPT ensemble: mean of logits
            new_guesses = g.topk(min(self.topk, g.shape[-1]), dim=-1).indices  # [k, K]
        children = any(p == end for p in lay.parent_list[1:])
        return Outcome(accepted=accepted, next_token=next_token, state=k,
                       guesses=new_guesses, drafted=len(lay.spec.paths) - 1,
                       rejected=children, rows=lay.rows)

