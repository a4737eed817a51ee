"""What a strategy may call on a model and its cache, and what a backend declares it can do.

Strategies talk to any backend through `LanguageModel` and `Cache` only, and check a
feature by the name of its capability (`require(caps, "hidden_states", ...)`), never by the
name of the backend. A backend that lacks a capability is refused with a message naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from draftsman.errors import UnsupportedError
from draftsman.models.config import ModelConfig


@dataclass(frozen=True)
class Capabilities:
    """What a backend's forward can do beyond plain token batches with explicit positions.

    Invariant: a strategy that needs a capability checks it here before the first forward;
    the backend's forward raises UnsupportedError if asked for one it does not declare.
    """

    backend: str  # the backend's name, for messages only
    layer_ranges: bool  # forward(layers=range(i, j), hidden_from=...)
    input_embeddings: bool  # forward(inputs_embeds=...)
    hidden_states: bool  # Output.hidden and head(hidden) on any residual-stream state
    exact_tree_keep: bool  # after keep(path), later forwards equal a linear decode's
    max_tree_rows: int | None  # the most rows one tree forward may hold; None: unbounded
    device: str  # "cpu", "cuda", ...
    numerics: str | None  # the backend's own number format when it fixes one (keys cost
    #                       profiles); None: the engine's dtype decides
    ragged_batches: bool = False  # forward(cache=RaggedCaches): several sequences' rows in
    #                               one forward, each with its own cache (models/ragged.py)
    ragged_trees: bool = False  # ... and each segment may carry its own tree mask
    greedy_head: bool = False  # forward(greedy=True): Output.tokens [B, T'], each row's greedy
    #                            token (argmax's rule), instead of logits the head then never
    #                            has to store (a greedy verify reads nothing else)
    remedy: str = "use --backend torch"  # what a refused method's message tells the user

    def has(self, name: str) -> bool:
        return bool(getattr(self, name))


def require(caps: Capabilities, name: str, method: str, why: str) -> None:
    """Refuse `method` on a backend that does not declare capability `name`."""
    if not caps.has(name):
        raise UnsupportedError(
            f"{method} needs {why} ({name}), which the {caps.backend} backend does not "
            f"expose; {caps.remedy}")


class Cache(Protocol):
    """A model's KV cache. Only the cache changes its own state."""

    length: int  # positions 0..length-1 hold the committed sequence
    capacity: int

    def check_room(self, end: int) -> None: ...

    def truncate(self, length: int) -> None: ...

    def keep(self, slots: torch.Tensor | list[int], start: int) -> None: ...


class LanguageModel(Protocol):
    """The forward contract of models/base.py, as strategies see it."""

    config: ModelConfig

    @property
    def capabilities(self) -> Capabilities: ...

    def __call__(self, tokens: torch.Tensor | None, positions: torch.Tensor, cache: Any,
                 **kwargs: Any) -> Any: ...

    def new_cache(self, capacity: int, batch: int = 1) -> Cache: ...

    def head(self, hidden: torch.Tensor, exit_head: Any = None) -> torch.Tensor: ...
