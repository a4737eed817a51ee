"""A model's KV cache (or a range of its layers) kept in step with a text.

`fed` mirrors the cache: fed[i] is the token whose keys/values sit at slot i of this state's
layers. Keeping a model in step with a text is then one rule: roll the cache back to the
longest common prefix of `fed` and the text, and feed what is missing.

Cost. The texts a state follows grow by appending (the committed tokens of a request) and are
cut back only when a strategy rolls back, so the state remembers `agreed`, how many leading
fed tokens are known to equal the text, and a sync compares only past it: O(tokens fed or
appended since the last final sync), never a rescan of the whole sequence.

Invariants:
- fed[:agreed] == text[:agreed] for the text of the last final `sync`. The caller keeps that
  prefix: it only appends to the text, or says where it cut it with `rollback(n)`. A
  provisional text (guesses that may still be dropped) is synced with `final=False`, which
  rolls the cache back but leaves `agreed` where it was.
- Slots at and past len(fed) hold nothing the state vouches for. A forward may write extra
  rows there (a tree of candidates, prompt tokens): they join the text only through `keep`
  (or `record`, when the forward compacted its path itself).
- States over layer ranges of one model may share one cache (an early exit: the shallow
  layers run ahead of the deep ones). They follow the same text, and the widest one (the
  first layers) is synced first, so a cut never drops slots another state still lists.
"""

from __future__ import annotations

import torch

from draftsman.models.base import ALL, DecoderLM, Output
from draftsman.models.cache import KVCache


def greedy_option(greedy: bool) -> dict[str, bool]:
    """The forward's `greedy` argument, passed only where asked: a model is asked only where
    it declares `greedy_head`, and other backends' forwards need not know the word."""
    return {"greedy": True} if greedy else {}


def reads_greedy_tokens(model: DecoderLM, greedy_sampling: bool) -> bool:
    """Whether a verify of `model` under this sampling reads greedy tokens only, which the
    model then gives instead of logits (declared: `Capabilities.greedy_head`)."""
    return greedy_sampling and model.capabilities.has("greedy_head")


class ModelState:
    """A model (or its `layers`), its cache and the tokens that cache holds.

    `capacity` counts the text's tokens, `extra_rows` the scratch rows a forward may write
    after them (tree nodes, prompt tokens). Pass `cache` to share another state's cache.
    """

    def __init__(self, model: DecoderLM, capacity: int = 0, *, extra_rows: int = 0,
                 layers: range | None = None, cache: KVCache | None = None) -> None:
        self.model = model
        self.layers = layers
        self.cache = cache if cache is not None else model.new_cache(capacity + extra_rows)
        self.fed: list[int] = []
        self.agreed = 0  # fed[:agreed] is known to equal the followed text
        self.forwards = 0
        self.unread = 0  # tokens fed from the device and not yet named by `settle`

    # ------------------------------------------------------------------ writing the cache

    def feed(self, tokens: list[int], logits_at: slice | torch.Tensor | None = ALL, *,
             hidden: torch.Tensor | None = None, greedy: bool = False) -> Output:
        """Run the model (this state's layers) on `tokens` appended after the fed ones.

        A layer range that starts past layer 0 takes `hidden` [1, T, H], the residual stream
        entering its first layer, instead of embedding the tokens; they are recorded all the
        same, since they name what its slots hold. `greedy`: Output.tokens instead of logits
        (a model that declares `greedy_head`).
        """
        self._check_settled()
        start = len(self.fed)
        ids = None if hidden is not None else torch.tensor([tokens], dtype=torch.long)
        pos = torch.arange(start, start + len(tokens), dtype=torch.long)[None]
        out = self.model(ids, pos, self.cache, layers=self.layers, hidden_from=hidden,
                         logits_at=logits_at, start=start, **greedy_option(greedy))
        self.fed.extend(tokens)
        self.forwards += 1
        return out

    def feed_unread(self, ids: torch.Tensor, logits_at: slice | torch.Tensor | None = ALL
                    ) -> Output:
        """Feed token ids [T] still on the model's device (drafts the host has not read, so
        drafting needs no sync per token); `settle` must name them before anything else."""
        start = len(self.fed) + self.unread
        pos = torch.arange(start, start + ids.numel(), dtype=torch.long)[None]
        out = self.model(ids.view(1, -1), pos, self.cache, layers=self.layers,
                         logits_at=logits_at, start=start)
        self.unread += ids.numel()
        self.forwards += 1
        return out

    def settle(self, tokens: list[int]) -> None:
        """The host read the tokens `feed_unread` fed: record them."""
        if len(tokens) != self.unread:
            raise RuntimeError(f"{self.unread} unread tokens fed, {len(tokens)} named")
        self.fed.extend(tokens)
        self.unread = 0

    def _check_settled(self) -> None:
        if self.unread:
            raise RuntimeError(f"{self.unread} tokens fed from the device are not settled")

    def forward_rows(self, tokens: list[int], offsets: torch.Tensor, *,
                     mask: torch.Tensor | None = None,
                     logits_at: slice | torch.Tensor | None = ALL,
                     greedy: bool = False) -> Output:
        """Write rows for `tokens` after the fed ones at positions len(fed) + offsets [T]
        (a tree shares positions between siblings), attending through `mask`. The rows are
        scratch until `keep` says which of them the text continues with. `greedy` as feed."""
        self._check_settled()
        start = len(self.fed)
        ids = torch.tensor([tokens], dtype=torch.long)
        pos = (offsets + start)[None]
        out = self.model(ids, pos, self.cache, mask=mask, logits_at=logits_at, start=start,
                         **greedy_option(greedy))
        self.forwards += 1
        return out

    def keep(self, rows: list[int], tokens: list[int]) -> None:
        """The last `forward_rows` wrote rows; keep `rows` (ascending row indices), which
        hold `tokens`, compacted right after the fed ones, and forget the others."""
        start = len(self.fed)
        self.cache.keep([start + r for r in rows], start)
        self.fed.extend(tokens)

    def record(self, tokens: list[int]) -> None:
        """A forward run outside this state wrote `tokens` after the fed ones and compacted
        them itself (a prompt-token tree step): note that the cache holds them."""
        self.fed.extend(tokens)
        if len(self.fed) != self.cache.length:
            raise RuntimeError(f"the cache holds {self.cache.length} slots, "
                               f"the state {len(self.fed)} tokens")

    # ------------------------------------------------------------------ following a text

    def sync(self, text: list[int], *, final: bool = True) -> list[int]:
        """Roll back to the common prefix with `text`; return the tokens still to feed.

        Compares only past `agreed`. With `final`, the common prefix becomes the new
        agreement: the caller will only append to `text` from here (or call `rollback`).
        """
        self._check_settled()
        if len(text) < self.agreed:
            raise ValueError(f"the text ({len(text)} tokens) is shorter than the "
                             f"{self.agreed} agreed on: call rollback() when cutting it")
        fed = self.fed
        i, n = self.agreed, min(len(fed), len(text))
        while i < n and fed[i] == text[i]:
            i += 1
        if i < len(fed):
            self._truncate(i)
        if final:
            self.agreed = i
        return text[i:]

    def missing(self, text: list[int]) -> list[int]:
        """The tokens of `text` past the fed ones, when the caller knows `fed` is a prefix of
        it (nothing but the text was fed since the last sync). O(new tokens)."""
        return text[len(self.fed):]

    def rollback(self, length: int) -> None:
        """The text was cut back to its first `length` tokens: forget everything after."""
        if length < len(self.fed):
            self._truncate(length)
        self.agreed = min(self.agreed, length)

    def _truncate(self, length: int) -> None:
        del self.fed[length:]
        self.agreed = min(self.agreed, length)
        if length < self.cache.length:
            self.cache.truncate(length)
