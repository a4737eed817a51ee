"""Prompt tokens (Chen et al., "Hardware-Aware Parallel Prompt Decoding"): trained embeddings
appended after the last token let the target guess several future tokens in the forward pass
that verifies the previous guesses.

Three pieces live here:

* `PromptTokens`: the embeddings E [m, n, H] (m prompt tokens, n ensemble prompt tokens
  (EPTs) each, hidden size H), saved as ``prompt_tokens.safetensors`` + ``prompt_tokens.json``
  (+ ``trees.json``, the dynamic sparse trees computed from validation accuracies) in a
  folder beside the model, or shipped in ``draftsman/assets/prompt_tokens/<model name>/``.
* `TreeDecoder`: one tree forward of a model with prompt tokens. Input rows: the missing
  committed tokens, the candidate tree (root = last committed token), and prompt tokens on
  every candidate (tree.py). Output: the accepted path, the next token, and the guesses for
  the next step read from the prompt tokens of the last accepted node:
  guess_i = top-k of (1/n) sum_e logits(prompt token i, EPT e), i = 1..k, which guesses the
  token at distance i + 1 from that node, i.e. distance i after the next token.
  The number k of prompt tokens the accepted node carried is the *state* of the dynamic
  sparse tree: the next tree has candidates up to depth k.
* `PromptTokenDraftProposer`: a draft model that drafts with its own prompt tokens (fewer
  draft forwards per drafted token), for speculative decoding (the paper's section 5.3).

Exactness: candidate rows never attend to prompt rows, so the target's argmax at each
candidate row equals its argmax after the same prefix in an ordinary forward; greedy matching
(`accept_greedy`) therefore commits exactly the autoregressive tokens. Typical acceptance
(Medusa) for sampling is lossy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from draftsman.errors import DraftsmanError, IncompatibleModelsError
from draftsman.models.base import DecoderLM
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler
from draftsman.tree import TreeLayout, TreeSpec, accept_greedy, fill_tokens, layout

EMBEDDINGS_FILE = "prompt_tokens.safetensors"
META_FILE = "prompt_tokens.json"
TREES_FILE = "trees.json"
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "prompt_tokens"


@dataclass
class PromptTokens:
    """Embeddings [m, n, H] (float32) and what they were trained for."""

    embeddings: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None

    @property
    def count(self) -> int:
        """m: prompt tokens (the deepest guess distance)."""
        return int(self.embeddings.shape[0])

    @property
    def epts(self) -> int:
        """n: ensemble prompt tokens per prompt token."""
        return int(self.embeddings.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.embeddings.shape[2])

    @classmethod
    def from_vocabulary(cls, model: DecoderLM, count: int = 3, epts: int = 1,
                        seed: int = 0) -> PromptTokens:
        """Initialise every EPT from the embedding of a random real token (the paper's init)."""
        if count < 1 or epts < 1:
            raise ValueError("need at least one prompt token and one EPT")
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (count * epts,), generator=gen)
        pos = torch.zeros_like(ids)
        with torch.inference_mode():
            rows = model.embed(ids[None], pos[None])[0].float()  # [m*n, H]
        emb = rows.reshape(count, epts, -1).clone()
        return cls(emb, {"init": "vocabulary", "seed": seed, **model_fingerprint(model)})

    def check(self, model: DecoderLM) -> None:
        c = model.config
        if self.hidden_size != c.hidden_size:
            raise IncompatibleModelsError(
                f"prompt tokens have hidden size {self.hidden_size}, the model {c.hidden_size}")
        want = model_fingerprint(model)
        have = {k: self.meta.get(k) for k in want}
        if any(have[k] is not None and have[k] != want[k] for k in want):
            raise IncompatibleModelsError(
                f"prompt tokens were trained for a different model ({have} vs {want})")

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"embeddings": self.embeddings.detach().float().contiguous()},
                  str(folder / EMBEDDINGS_FILE))
        (folder / META_FILE).write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        self.folder = folder
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> PromptTokens:
        folder = Path(folder)
        if folder.is_file():
            folder = folder.parent
        path = folder / EMBEDDINGS_FILE
        if not path.is_file():
            raise DraftsmanError(f"no prompt tokens at {folder} (expected {EMBEDDINGS_FILE})")
        emb = load_file(str(path))["embeddings"].float()
        if emb.dim() != 3:
            raise DraftsmanError(f"{path}: expected embeddings [m, n, H], got {list(emb.shape)}")
        meta_path = folder / META_FILE
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        return cls(emb, meta, folder)

    def trees(self) -> dict[str, Any] | None:
        """The cached trees.json beside the embeddings (see sparse_tree.py), if any."""
        if self.folder is None or not (self.folder / TREES_FILE).is_file():
            return None
        return json.loads((self.folder / TREES_FILE).read_text())


def model_fingerprint(model: DecoderLM) -> dict[str, int]:
    c = model.config
    return {"hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "num_layers": c.num_layers}


def find_prompt_tokens(model_folder: Path | None, name: str | None) -> Path | None:
    """Where a model's prompt tokens are: beside the model, else in the shipped assets."""
    options: list[Path] = []
    if model_folder is not None:
        options.append(Path(model_folder) / "prompt_tokens")
    for n in (name, model_folder.name if model_folder is not None else None):
        if n:
            options.append(ASSETS / Path(str(n)).name)
    for folder in options:
        if (folder / EMBEDDINGS_FILE).is_file():
            return folder
    return None


# ----------------------------------------------------------------------------- acceptance


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance (lossy): keep candidate x after node u iff
    p_u(x) > min(threshold, alpha * exp(-H(p_u))), with p_u the target's tempered
    distribution at u and H its entropy. Defaults are Medusa's (0.09, 0.3)."""

    threshold: float = 0.09
    alpha: float = 0.3


def accept_typical(lay: TreeLayout, tokens: torch.Tensor, probs: torch.Tensor,
                   rule: TypicalAcceptance) -> int:
    """Deepest node whose path passes the typical-acceptance test; ties: the higher path
    probability. probs [C, V] are the target's distributions after each node."""
    p_tok = probs[lay.parent, tokens]  # [C] probability of each candidate at its parent
    entropy = -(probs * torch.log(probs.clamp_min(1e-10))).sum(-1)  # [C]
    cut = torch.clamp(rule.alpha * torch.exp(-entropy), max=rule.threshold)
    ok = p_tok > cut[lay.parent]
    ok[0] = True
    path_ok = ok[lay.ancestors].all(-1)
    logp = torch.log(p_tok.clamp_min(1e-30))
    logp[0] = 0.0
    path_logp = logp[lay.ancestors].sum(-1) - logp * (lay.ancestors.shape[1] - 1 - lay.depth)
    score = torch.where(path_ok, lay.depth.double() * 1e6 + path_logp.double(), -math.inf)
    return int(score.argmax())


# ----------------------------------------------------------------------------- decoding


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
        self._layouts: dict[tuple[int, int], TreeLayout] = {}

    @property
    def max_rows(self) -> int:
        return max(s.size(self.prompts.epts) for s in self.trees.values())

    def layout(self, state: int | None, prefix: int) -> TreeLayout:
        """state None: the root alone with all m prompt tokens (prefill, stale guesses)."""
        key = (-1 if state is None else state, prefix)
        lay = self._layouts.get(key)
        if lay is None:
            spec = TreeSpec(((),), (self.m,)) if state is None else self.trees[state]
            lay = layout(spec, self.prompts.epts, prefix)
            if prefix <= 1:  # prefills vary in length: cache only the per-step layouts
                self._layouts[key] = lay
        return lay

    def step(self, cache, pending: list[int], guesses: torch.Tensor | None,
             sampler: Sampler | None = None,
             typical: TypicalAcceptance | None = None) -> Outcome:
        """One forward over pending[:-1] (plain), the tree rooted at pending[-1], prompts.

        Greedy matching when `sampler` is None or greedy; otherwise typical acceptance and
        the next token drawn from the target's distribution after the accepted path.
        """
        model = self.model
        state = None if guesses is None else int(guesses.shape[0])
        lay = self.layout(state, len(pending) - 1)
        cand = fill_tokens(lay, guesses, pending[-1])  # [C]
        ids = torch.zeros(lay.rows, dtype=torch.long)  # prompt rows: any id, replaced below
        ids[: lay.prefix] = torch.tensor(pending[:-1], dtype=torch.long)
        ids[lay.node_rows] = cand
        start = cache.length
        pos = (lay.offsets + start + lay.prefix)[None]  # [1, T]
        embeds = model.embed(ids[None].to(model.device), pos.to(model.device))  # [1, T, H]
        if lay.prompt_owner.numel():
            embeds[0, lay.node_rows.numel() + lay.prefix:] = \
                self.embeds[lay.prompt_index - 1, lay.prompt_ept]
        out = model(None, pos, cache, mask=lay.mask, inputs_embeds=embeds,
                    logits_at=lay.node_rows, start=start)
        logits = out.logits[0]  # [C, V]
        greedy = sampler is None or sampler.greedy
        if greedy:
            argmax = logits.argmax(-1)
            end = accept_greedy(lay, cand, argmax)
            next_token = int(argmax[end])
        else:
            probs = sampler.probs(logits)
            end = accept_typical(lay, cand, probs, typical or TypicalAcceptance())
            next_token = sampler.draw(probs[end])
        path = lay.path_to(end)
        slots = list(range(start, start + lay.prefix)) + [start + lay.node_rows_list[j]
                                                          for j in path]
        cache.keep(slots, start)
        k = lay.prompt_count_list[end]
        new_guesses = None
        if k:
            rows = lay.prompt_rows[end, :k].reshape(-1)  # [k * n]
            g = model.head(out.hidden[0, rows])  # [k * n, V]
            g = g.view(k, lay.epts, -1).float().mean(1)  # EPT ensemble: mean of logits
            new_guesses = g.topk(min(self.topk, g.shape[-1]), dim=-1).indices  # [k, K]
        children = any(p == end for p in lay.parent_list[1:])
        return Outcome(accepted=cand[path[1:]].tolist(), next_token=next_token, state=k,
                       guesses=new_guesses, drafted=len(lay.spec.paths) - 1,
                       rejected=children, rows=lay.rows)


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
