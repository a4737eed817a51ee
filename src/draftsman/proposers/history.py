"""Earlier token sequences (prompts and replies) a drafter may copy from, per client scope.

`HistoryStore` maps a scope (an API key, or one anonymous scope) to the recent sequences of
that client, bounded by a total token budget over all scopes: adding a sequence evicts the
oldest sequences of the least recently used scope first (the scope being added to is the
most recently used, so it loses its own oldest sequences only when it alone is over budget).
A drafter reads exactly one `Scope`, never the store, so one client's text never shapes
another's guesses.

Each scope keeps its live sequences end to end in one token list (a separator between them,
so no match or continuation crosses a boundary) and an anchor index: for each anchor length
n, hash of the n tokens before position f -> the positions f, ascending. Evicted sequences
stay in the index as dead positions (below `base`) until they outnumber the live ones, then
the scope compacts; `bytes` counts them until then.

Invariants: `store.tokens` (live tokens, separators excluded) never exceeds the budget after
`add` returns; a scope's positions are global and only grow, so a position seen once names
the same token until it is evicted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from draftsman.errors import InvalidArgumentError

ANCHORS = (8, 2)  # n-gram lengths indexed, longest first (see proposers/suffix.py)
SEPARATOR = -1
# CPython object sizes behind the byte estimate: a list slot (8) plus an int object (28) per
# token or position; per distinct key a dict slot with its share of spare room (~50), the key
# int (32) and the position list's header (56)
SLOT_BYTES = 36
KEY_BYTES = 140
SCOPE_BYTES = 2048


def anchor_key(tokens: list[int], end: int, n: int) -> int:
    """The index key of tokens[end - n : end]."""
    return hash(tuple(tokens[end - n : end]))


class Scope:
    """The sequences of one client. Read by a drafter through `followers` and `token`."""

    def __init__(self, name: str, lock: threading.Lock) -> None:
        self.name = name
        self.lock = lock  # the store's: adds and reads never interleave
        self.offset = 0  # global position of tokens[0]
        self.base = 0  # positions below are evicted
        self.end = 0  # global position after the last token
        self.tokens: list[int] = []
        self.sequences: list[tuple[int, int]] = []  # live (start, length), oldest first
        self.index: list[dict[int, list[int]]] = [{} for _ in ANCHORS]
        self.entries = 0
        self.keys = 0
        self.live = 0

    # ---- reading (a drafter) -----------------------------------------------------------
    def followers(self, level: int, key: int, limit: int) -> list[int]:
        """Up to `limit` live positions that followed the anchor `key` of ANCHORS[level],
        newest first."""
        with self.lock:
            positions = self.index[level].get(key)
            if not positions:
                return []
            out = []
            for f in reversed(positions):
                if f < self.base or len(out) == limit:
                    break
                out.append(f)
            return out

    def window(self, start: int, stop: int) -> list[int]:
        """The tokens at global positions start..stop-1 (clipped to what is live)."""
        with self.lock:
            start = max(start, self.base)
            return self.tokens[start - self.offset : max(stop, start) - self.offset]

    # ---- writing (the store) -----------------------------------------------------------
    def _append(self, seq: list[int]) -> None:
        start = self.end
        self.tokens.extend(seq)
        self.tokens.append(SEPARATOR)
        local = start - self.offset
        for level, n in enumerate(ANCHORS):
            table = self.index[level]
            for f in range(n, len(seq)):
                key = anchor_key(self.tokens, local + f, n)
                bucket = table.get(key)
                if bucket is None:
                    table[key] = [start + f]
                    self.keys += 1
                else:
                    bucket.append(start + f)
                self.entries += 1
        self.sequences.append((start, len(seq)))
        self.end = start + len(seq) + 1
        self.live += len(seq)

    def _evict_oldest(self) -> None:
        start, length = self.sequences.pop(0)
        self.base = start + length + 1
        self.live -= length
        if self.end - self.base < self.base - self.offset:  # more dead than live: compact
            self._compact()

    def _compact(self) -> None:
        self.tokens = self.tokens[self.base - self.offset :]
        self.offset = self.base
        self.entries = self.keys = 0
        for level, table in enumerate(self.index):
            kept: dict[int, list[int]] = {}
            for key, positions in table.items():
                alive = [f for f in positions if f >= self.base]
                if alive:
                    kept[key] = alive
                    self.entries += len(alive)
            self.index[level] = kept
            self.keys += len(kept)

    @property
    def bytes(self) -> int:
        return SCOPE_BYTES + SLOT_BYTES * (len(self.tokens) + self.entries) \
            + KEY_BYTES * self.keys


class HistoryStore:
    """Scopes of recent sequences under one total token budget (see the module doc)."""

    def __init__(self, budget_tokens: int = 1_000_000) -> None:
        if budget_tokens < 0:
            raise InvalidArgumentError(f"history tokens must be >= 0, got {budget_tokens}")
        self.budget = budget_tokens
        self._lock = threading.Lock()
        self._scopes: OrderedDict[str, Scope] = OrderedDict()  # least recently used first

    def scope(self, name: str) -> Scope:
        """The scope `name` (created empty), marked most recently used."""
        with self._lock:
            scope = self._scopes.get(name)
            if scope is None:
                scope = self._scopes[name] = Scope(name, self._lock)
            self._scopes.move_to_end(name)
            return scope

    def add(self, name: str, seq: list[int]) -> None:
        """Remember `seq` (its last `budget` tokens) in scope `name`, then evict to budget."""
        seq = [int(t) for t in seq[-self.budget :]] if self.budget else []
        if len(seq) < 2:
            return
        scope = self.scope(name)
        with self._lock:
            scope._append(seq)
            self._evict()

    def _evict(self) -> None:
        total = sum(s.live for s in self._scopes.values())
        while total > self.budget:
            name, oldest = next(iter(self._scopes.items()))
            if not oldest.sequences:
                del self._scopes[name]
                continue
            before = oldest.live
            oldest._evict_oldest()
            total -= before - oldest.live
            if not oldest.sequences:
                del self._scopes[name]

    # ---- what /metrics shows -------------------------------------------------------------
    @property
    def tokens(self) -> int:
        with self._lock:
            return sum(s.live for s in self._scopes.values())

    @property
    def bytes(self) -> int:
        """An estimate of the memory held: tokens, index entries and keys, dead ones too."""
        with self._lock:
            return sum(s.bytes for s in self._scopes.values())

    @property
    def scopes(self) -> int:
        with self._lock:
            return len(self._scopes)
