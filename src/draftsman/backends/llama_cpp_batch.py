"""Several requests in one llama_decode: sequences of one shared llama.cpp context.

Alone, each request's cache is sequence 0 of a context of its own (llama_cpp.py). To share a
forward, requests must share a context: a `SequencePool` is one context with `n_seq_max`
sequences, each in its own KV stream (`kv_unified = false`, so a sequence's cells are laid
out, and its attention summed, exactly as in a context of its own), and a `SequenceCache`
is one of them behind the cache protocol. A ragged forward (models/ragged.py) over such
caches is one batch whose rows carry their request's sequence id; llama.cpp runs every row's
matrices together and each row attends to its own sequence only.

Numerics follow the model's mode: `fast` feeds the whole batch at once (llama.cpp's batched
kernels, rounding like any k-row verify); `bitwise` feeds pieces of `exact_rows()` rows, which
take the one-row kernels and are identical to decoding each request alone, at the cost of
reading the weights once per piece.

A sequence cache holds a linear sequence: tree speculation, which needs sequences of its
own, keeps running one request per context.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from draftsman.errors import BackendError, ContextOverflowError, UnsupportedError
from draftsman.models.ragged import RaggedCaches


class SequencePool:
    """One llama.cpp context of `sequences` sequences of `capacity` cells each, fed up to
    `batch` rows per llama_decode."""

    def __init__(self, model: Any, sequences: int, capacity: int, batch: int) -> None:
        lib = self.lib = model.lib
        params = lib.llama_context_default_params()
        params.n_ctx = sequences * capacity
        params.n_batch = params.n_ubatch = batch
        params.n_seq_max = sequences
        params.kv_unified = False  # a KV stream per sequence: cells as in a context alone
        params.n_threads = params.n_threads_batch = model.threads
        params.no_perf = True
        if model.numerics == "bitwise":
            model._bitwise_attention(params)
        self.ctx = lib.llama_init_from_model(model.handle, params)
        if not self.ctx:
            raise BackendError(f"llama.cpp could not create a context of {sequences} x "
                               f"{capacity} tokens")
        self.memory = lib.llama_get_memory(self.ctx)
        self.capacity = capacity
        self.sequences = sequences
        self._free = list(range(sequences))
        self._lock = threading.Lock()
        weakref.finalize(self, lib.llama_free, self.ctx)

    def take(self, capacity: int) -> SequenceCache:
        if capacity > self.capacity:
            raise ContextOverflowError(f"a sequence of {capacity} tokens does not fit the "
                                       f"batch context's {self.capacity} per sequence")
        with self._lock:
            if not self._free:
                raise BackendError(f"all {self.sequences} sequences of the batch context "
                                   "are in use")
            seq = self._free.pop(0)
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        return SequenceCache(self, seq)

    def give(self, seq: int) -> None:
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        with self._lock:
            self._free.append(seq)


class SequenceCache:
    """Sequence `seq` of a pool, holding positions 0..length-1 of one request."""

    def __init__(self, pool: SequencePool, seq: int) -> None:
        self.pool, self.seq = pool, seq
        self.capacity = pool.capacity
        self.length = 0
        self._give_back = weakref.finalize(self, pool.give, seq)

    def release(self) -> None:
        """Return the sequence to the pool now (idempotent); garbage collection would do it
        later, and a full pool refuses the next request until then."""
        self._give_back()

    def check_room(self, end: int) -> None:
        if end > self.capacity:
            raise ContextOverflowError(
                f"sequence of {end} tokens does not fit the KV cache of {self.capacity} slots")

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        if length < self.length:
            self.pool.lib.llama_memory_seq_rm(self.pool.memory, self.seq, length, -1)
        self.length = length

    def set_length(self, length: int) -> None:
        self.check_room(length)
        self.length = length

    def keep(self, slots: torch.Tensor | list[int], start: int) -> None:
        slots = torch.as_tensor(slots).tolist()
        if slots != list(range(start, start + len(slots))):
            raise UnsupportedError("a batched llama.cpp sequence holds no trees")
        self.truncate(start + len(slots))

    def reset(self) -> None:
        self.truncate(0)


def ragged_forward(model: Any, tokens: torch.Tensor, positions: torch.Tensor,
                   caches: RaggedCaches, logits_at: Any) -> torch.Tensor | None:
    """One batch over every segment's rows (each with its sequence id) -> logits [R, V]."""
    pools = {id(seg.cache.pool) if isinstance(seg.cache, SequenceCache) else None
             for seg in caches.segments}
    if None in pools or len(pools) != 1:
        raise UnsupportedError("a batched llama.cpp forward needs the sequences of one batch "
                               "context (SequencePool)")
    if any(seg.mask is not None for seg in caches.segments):
        raise UnsupportedError("a batched llama.cpp forward holds no trees")
    caches.check_room()
    for seg in caches.segments:
        if seg.start != seg.cache.length:
            seg.cache.truncate(seg.start)
    ids, pos = tokens[0].tolist(), positions[0].tolist()
    rows = [] if logits_at is None else torch.arange(len(ids))[logits_at].tolist()
    pool = caches.segments[0].cache.pool
    wanted = set(rows)
    logits: dict[int, torch.Tensor] = {}
    with model._decode_lock:
        for group, piece in feeding_groups(model, caches):
            index = [i for k in group for i in range(caches.bounds[k], caches.bounds[k + 1])]
            want = [j for j, i in enumerate(index) if i in wanted]
            out = model._decode(pool.ctx, [ids[i] for i in index], [pos[i] for i in index],
                                [(caches.segments[k].cache.seq,) for k in group
                                 for _ in range(caches.segments[k].rows)],
                                want, tree=False, piece=piece)
            for j, row in zip(want, out if out is not None else [], strict=True):
                logits[index[j]] = row
    caches.commit()
    return torch.stack([logits[r] for r in rows]) if rows else None


def feeding_groups(model: Any, caches: RaggedCaches) -> list[tuple[list[int], int | None]]:
    """Which segments go to llama.cpp together, in pieces of how many rows. Fast: all of
    them, llama.cpp's own piece size. Bitwise: a segment longer than SHORT (a prompt chunk)
    alone, as it would be fed alone; every other row in pieces of the one-row kernels'
    size, which give each row the bits of decoding it alone (`model.piece_rows`)."""
    every = list(range(len(caches.segments)))
    if model.numerics != "bitwise":
        return [(every, None)]
    exact = model.piece_rows(1)
    long = [k for k in every if model.piece_rows(caches.segments[k].rows) != exact]
    short = [k for k in every if k not in long]
    groups: list[tuple[list[int], int | None]] = [([k], None) for k in long]
    if short:
        groups.append((short, exact))
    return groups
