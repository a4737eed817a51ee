"""A draft whose LM head scores only the tokens text uses most (frequency-ranked drafting).

A small draft spends a large share of each forward on its head: the 0.5B's 151,936 x 896
head is a quarter of its weights. Guesses are almost always common tokens (on MT-Bench
answers the 32,768 most frequent ShareGPT tokens cover 98% of the target's output), so the
draft may score only those: its head keeps the rows of the `n` most frequent tokens (plus the
tokenizer's special tokens) and every other token gets logit -inf.

Exact either way: the target checks every guess. Greedy drafts never propose a dropped
token; sampled drafts draw from a distribution q that is 0 on them, and speculative
sampling accepts with min(1, p/q) and resamples from max(0, p - q), which covers every
token, so the output distribution is still the target's. Only acceptance can change.

The ranking is a property of the tokenizer: `token_ranks` reads it from the model folder
(`token_ranks.npy`) or from the assets shipped for the catalogue's tokenizers
(assets/token_ranks, keyed by the tokenizer.json's SHA-1; scripts/token_ranks.py builds one).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from draftsman.errors import DraftsmanError

RANKS_FILE = "token_ranks.npy"
_WHITESPACE = re.compile(r"\s*")
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "token_ranks"


def tokenizer_key(folder: Path) -> str:
    """The first 12 hex digits of the folder's tokenizer.json SHA-1: models that share a
    tokenizer share a ranking."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise DraftsmanError(f"{folder} has no tokenizer.json to rank its tokens by")
    return hashlib.sha1(path.read_bytes()).hexdigest()[:12]


def token_ranks(folder: Path) -> np.ndarray:
    """Token ids, most frequent first (a prefix of the vocabulary's ids at least)."""
    own = Path(folder) / RANKS_FILE
    if own.is_file():
        return np.load(own)
    key = tokenizer_key(folder)
    shipped = ASSETS / f"{key}.npy"
    if not shipped.is_file():
        raise DraftsmanError(
            f"no token ranking for {folder.name}'s tokenizer ({key}): run scripts/token_ranks.py "
            f"--model {folder} --out {own}, or leave draft_vocab unset")
    return np.load(shipped)


def special_tokens(folder: Path) -> set[int]:
    """The tokenizer's added tokens (chat markers, end of text): always kept."""
    text = (Path(folder) / "tokenizer.json").read_text()
    return {int(t["id"]) for t in top_level_value(text, "added_tokens") or []}


def top_level_value(text: str, key: str) -> object:
    """json.loads(text).get(key), parsing the top-level values only up to `key`'s: Hugging
    Face writes "added_tokens" before the model, whose vocabulary and merges are most of a
    7 MB tokenizer.json (0.34 s to parse whole)."""
    decoder, pos = json.JSONDecoder(), _WHITESPACE.match(text).end()
    if text[pos:pos + 1] != "{":
        raise DraftsmanError("tokenizer.json is not a JSON object")
    pos += 1
    while True:
        pos = _WHITESPACE.match(text, pos).end()
        if text[pos:pos + 1] == "}":
            return None
        name, pos = decoder.raw_decode(text, pos)
        pos = _WHITESPACE.match(text, pos).end() + 1  # past the colon
        value, pos = decoder.raw_decode(text, _WHITESPACE.match(text, pos).end())
        if name == key:
            return value
        pos = _WHITESPACE.match(text, pos).end()
        pos += text[pos:pos + 1] == ","


def head_tokens(folder: Path, n: int, vocab_size: int, eos_ids: tuple[int, ...] = ()
                ) -> torch.Tensor:
    """The ids a draft head of `n` ranked tokens keeps, ascending: the n most frequent, the
    special tokens and the end-of-sequence ids. n >= vocab_size keeps every id."""
    if n < 1:
        raise DraftsmanError(f"draft_vocab must be >= 1 token, got {n}")
    ranks = token_ranks(folder)
    if n > len(ranks) and n < vocab_size:
        raise DraftsmanError(f"the token ranking of {folder.name} lists {len(ranks)} tokens; "
                             f"draft_vocab={n} asks for more")
    keep = set(ranks[:n].tolist()) | special_tokens(folder) | set(eos_ids)
    ids = sorted(i for i in keep if 0 <= i < vocab_size)
    return torch.tensor(ids if n < vocab_size else range(vocab_size), dtype=torch.long)


def draft_head_rows(folder: Path, n: int) -> torch.Tensor | None:
    """head_tokens for the model in `folder`, its vocabulary size and end ids from its config;
    None where they would be the whole vocabulary (the head stays as it is: no scatter of
    every logit per draft token for nothing)."""
    from draftsman.models.config import ModelConfig

    config = ModelConfig.from_folder(folder)
    rows = head_tokens(folder, n, config.vocab_size, tuple(config.eos_token_ids))
    return None if len(rows) >= config.vocab_size else rows


class VocabSubsetHead(nn.Module):
    """An LM head over the rows `keep` of a vocabulary of `vocab_size`: logits [..., V] with
    the kept ids' scores from `inner` (a head of len(keep) rows, any format) and -inf at
    every other id.

    Invariant: logits[..., keep] equal `inner`'s output for the same input, so a kept token's
    score is the full head's wherever `inner` holds the same rows in the same format."""

    def __init__(self, inner: nn.Module, keep: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("keep", keep.to(torch.long), persistent=False)
        self.vocab_size = vocab_size
        self.out_features = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.inner(x)  # [..., len(keep)]
        out = part.new_full((*part.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.keep, part)


def narrowed_linear(head: nn.Linear, keep: torch.Tensor) -> nn.Linear:
    """A Linear holding rows `keep` of `head`'s [V, H] weight and of its bias, if any
    (copied: no tie to the embedding the weight may come from)."""
    keep = keep.to(head.weight.device)
    rows = head.weight.detach()[keep].clone()
    linear = nn.Linear(rows.shape[1], rows.shape[0], bias=head.bias is not None,
                       device=rows.device, dtype=rows.dtype)
    linear.weight = nn.Parameter(rows, requires_grad=False)
    if head.bias is not None:
        linear.bias = nn.Parameter(head.bias.detach()[keep].clone(), requires_grad=False)
    return linear
