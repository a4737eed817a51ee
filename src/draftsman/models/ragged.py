"""Several sequences in one forward: their rows end to end, each attending to its own cache.

A step of the batch scheduler runs one forward over the rows of every active request: each
request's pending token(s) plus its guesses, or a chunk of its prompt. The rows are laid end
to end as one sequence of N = sum(rows) tokens ([1, N], positions per row), so every matrix
multiply reads each weight once for all requests and no row is padding. Only attention is
per sequence: the rows of segment i attend to their own `KVCache` (slots before `start`)
and to each other through their own mask, exactly the call a forward of that sequence alone
makes (same rows, same start, same mask, same kernel choice). A row's output therefore
differs from the sequence alone only where a matrix kernel rounds a row differently in a
bigger batch: never on the batch-invariant integer kernels (q4, q8), measured elsewhere.

Invariant: segments do not share a cache; each cache's `length` becomes start + rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from draftsman.models.cache import KVCache


@dataclass
class Segment:
    cache: KVCache  # this sequence's own cache
    start: int  # slot of its first new row (= cache length before the forward)
    rows: int  # new rows of this sequence in the forward
    mask: torch.Tensor | None = None  # its own tree mask [T, T] / [1, T, T]; None: causal


class RaggedCaches:
    """The caches of a ragged forward, in row order (see the module docstring)."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        if not segments:
            raise ValueError("a ragged forward needs at least one segment")
        self.segments = list(segments)
        bounds = [0]
        for seg in self.segments:
            if seg.rows < 1:
                raise ValueError(f"a segment needs at least one row, got {seg.rows}")
            bounds.append(bounds[-1] + seg.rows)
        self.bounds = bounds  # segment i holds rows bounds[i]..bounds[i+1]
        self._tables: tuple[object, list] | None = None  # (ctx, its cut per segment)

    @property
    def rows(self) -> int:
        return self.bounds[-1]

    def check_room(self) -> None:
        for seg in self.segments:
            seg.cache.check_room(seg.start + seg.rows)

    def split(self, x: torch.Tensor, dim: int = 1) -> list[torch.Tensor]:
        """x with the N rows along `dim` -> one view per segment."""
        return list(x.split([seg.rows for seg in self.segments], dim=dim))

    def attend_each(self, qkv: torch.Tensor, ctx: object, masks: Sequence[torch.Tensor | None],
                    attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        """qkv [1, N, F] -> [1, N, Hq D]: `attend(qkv_i, ctx_i, cache_i, start_i, mask_i)` per
        segment, with `ctx` (a family's per-row tables: RoPE's (cos, sin) [1, N, 1, D], or
        None) cut to the segment's rows."""
        parts = self.split(qkv)
        if ctx is None:
            tables = [None] * len(parts)
        else:  # every layer gets the same tables: cut them once per forward
            if self._tables is None or self._tables[0] is not ctx:
                self._tables = (ctx, list(zip(*(self.split(t) for t in ctx), strict=True)))
            tables = self._tables[1]
        out = [attend(part, table, seg.cache, seg.start, mask)
               for part, table, seg, mask in zip(parts, tables, self.segments, masks,
                                                 strict=True)]
        return torch.cat(out, dim=1)

    def commit(self) -> None:
        for seg in self.segments:
            seg.cache.set_length(seg.start + seg.rows)
