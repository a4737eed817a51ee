"""Static-shape forwards: every step of a given row count has one shape, whatever the length.

The dynamic forward (base.py) attends over slots 0..start+T, so its shapes grow with the
sequence and nothing can be captured once and replayed. Here (the gpt-fast design) a step
attends over the cache's whole capacity through a boolean mask [T, capacity], and its rows
are padded to a bucket (1, 2, 4, ... 64), so the decode step, each verify size and each
padded tree have one shape each; on a CUDA device each (cache, bucket) step is captured
once as a CUDA graph and replayed. Forwards longer than the largest bucket (prefills) run
the model's own dynamic forward on the same cache.

Which slots a new row sees, for a step writing rows at slots start..start+bucket:
  every slot < start (the committed text, as in the dynamic forward), and the new rows its
  `rows` mask allows (causal for a chain, the tree mask for a tree, causal for pad rows),
  and, with a sliding window and no tree mask, only slots > position - window.

Invariants:
- Pad rows (dummy token 0 at the last real position) write at slots start+n..start+bucket,
  at or past the live length start+n after the step. Every later step sees only slots below
  its own start, which truncate/keep never move past the live length, and its own rows,
  written before they are read: a pad write is never seen. Their logits are dropped.
- Caches come with `max(buckets)` spare slots past what the caller asked, so pad writes fit;
  a step that would still spill past the capacity runs dynamically instead.
- Slots a step does not see hold finite values (zeros, or rows computed from finite inputs),
  so masking them adds exactly zero: the real rows' results equal the dynamic forward's up
  to the order of floating-point sums.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import torch

from draftsman.errors import UnsupportedError
from draftsman.models.base import ALL, DecoderLM, Output
from draftsman.models.cache import KVCache
from draftsman.models.protocol import Capabilities

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# capabilities of the model that static steps do not keep: they run whole-model forwards of
# one sequence (no layer ranges, no ragged batches of several) and return logits
STATIC_LACKS = ("layer_ranges", "ragged_batches", "ragged_trees", "greedy_head")
WARMUP_RUNS = 3  # eager runs on a side stream before capture (allocator and kernel caches)


@dataclass(frozen=True)
class StaticConfig:
    buckets: tuple[int, ...] = BUCKETS  # ascending row counts a step is padded to
    graphs: bool | None = None  # capture CUDA graphs; None: on CUDA devices only
    # capacities round up to this, so later requests reuse a cache and its captured graphs:
    # at 256 every new prompt length captured anew inside timed runs (first H200 run: AR
    # 5.98 ms/token over a 2.91 ms step); a step attends over the whole capacity, and 1024
    # slots of a 1.5B's KV are 2% of its weight bytes
    round_to: int = 1024
    # fuse each step's element-wise kernels with torch.compile (inductor) before capture:
    # on an H200 the 1.5B's step was 3.0 ms, 1.2 ms of it matrix products and the rest
    # ~1,000 small kernels (gpu-h200/all-families); compiled 3.1 -> 2.6 ms (compiled-batched).
    # A few compiles in all (one row, then the other buckets at a symbolic row count; on
    # the CPU a third past 16 rows, where attention changes path); `StaticModel.warm_up`
    # pays them, and every bucket's capture, before timing
    compile: bool = False


@dataclass
class StepInputs:
    """What one static step reads besides the weights and the cache (all fixed-shape)."""

    tokens: torch.Tensor  # [1, Tb] long, pad rows token 0
    positions: torch.Tensor  # [1, Tb] long, pad rows at the last real position
    start: torch.Tensor  # [1] long: the slot of row 0
    rows: torch.Tensor  # [Tb, Tb] bool: which new rows each new row sees
    floor: torch.Tensor  # [Tb] long: a row sees only slots > floor (-1: no window)
    embeds: torch.Tensor | None = None  # [1, Tb, H] input embeddings in place of the tokens'

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors a graph copies in, in field order (`embeds` only when given)."""
        values = (getattr(self, f.name) for f in fields(self))
        return tuple(t for t in values if t is not None)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> StepInputs:
        """`fn` applied to every tensor given (`embeds` stays None when it is)."""
        return StepInputs(**{f.name: None if getattr(self, f.name) is None
                             else fn(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device) -> StepInputs:
        return self.map(lambda t: t.to(device))

    def clone(self) -> StepInputs:
        return self.map(torch.Tensor.clone)


def step_inputs(tokens: torch.Tensor, positions: torch.Tensor, start: int,
                mask: torch.Tensor | None, bucket: int, window: int | None,
                embeds: torch.Tensor | None = None) -> StepInputs:
    """Inputs for n = positions.shape[1] real rows padded to `bucket` rows, built where the
    positions are (the host, but for a tree step's); token ids and `embeds` stay where they
    are (a draft's tokens on the device are fed without a sync). `mask` is the new rows'
    [n, n] (or [1, n, n]) visibility among themselves (a tree). `embeds` [1, n, H], when
    given, replaces the rows' token embeddings (parallel prompt decoding's prompt tokens);
    pad rows get zeros."""
    n = positions.shape[1]
    pad = bucket - n
    if embeds is not None:
        embeds = torch.cat([embeds, embeds.new_zeros(1, pad, embeds.shape[-1])], dim=1)
    tokens = torch.cat([tokens, torch.zeros(1, pad, dtype=torch.long, device=tokens.device)],
                       dim=1)
    # built where the positions are: a tree step's positions and mask already on the GPU
    # (parallel prompt decoding) are padded there, without a read back to the host
    where = positions.device
    positions = torch.cat([positions, positions[:, -1:].expand(1, pad)], dim=1)
    rows = torch.ones(bucket, bucket, dtype=torch.bool, device=where).tril()
    if mask is not None:
        rows[:n, :n] = mask.reshape(n, n).to(where)
    if window is not None and mask is None:
        floor = positions[0] - window
    else:
        floor = torch.full((bucket,), -1, dtype=torch.long, device=where)
    return StepInputs(tokens, positions, torch.tensor([start]), rows, floor, embeds)


class SlotWriter:
    """The cache as a layer sees it in a static step (it calls `write`, as on KVCache):
    the new keys/values land at `slots`, and the whole buffer comes back to attend over."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        self.k, self.v, self.slots = k, v, slots  # [L, B, H_kv, S, D] x2, [Tb]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, H_kv, Tb, D] -> the layer's full buffers [B, H_kv, S, D]."""
        self.k[layer].index_copy_(2, self.slots, k)
        self.v[layer].index_copy_(2, self.slots, v)
        return self.k[layer], self.v[layer]


def static_forward(model: DecoderLM, k: torch.Tensor, v: torch.Tensor,
                   inp: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed-shape step over cache buffers k, v -> (logits [1, Tb, V], hidden [1, Tb, H]).
    Only tensor ops on device tensors, no host reads: safe to capture as a CUDA graph."""
    bucket = inp.tokens.shape[1]
    slot = torch.arange(k.shape[3], device=k.device)  # [S]
    rel = slot - inp.start  # [S]: the new row a slot holds, when 0 <= rel < bucket
    new = (rel >= 0) & (rel < bucket)
    sees_new = inp.rows[:, rel.clamp(0, bucket - 1)] & new  # [Tb, S]
    visible = ((rel < 0) | sees_new) & (slot > inp.floor[:, None])  # [Tb, S]
    writer = SlotWriter(k, v, inp.start + torch.arange(bucket, device=k.device))
    x = model.embed(inp.tokens, inp.positions) if inp.embeds is None else inp.embeds
    # x: [1, Tb, H]
    ctx = model.layer_context(inp.positions)
    for i, layer in enumerate(model.layers):
        x = layer(x, ctx, writer, i, 0, visible[None, None])
    return model.head(x), x


class GraphedStep:
    """One bucket's static step over one cache's buffers, captured as a CUDA graph.

    Replaying copies the inputs into the captured ones and returns the graph's own output
    tensors, which the next replay overwrites (callers copy what they keep). Capture runs
    the step itself a few times: harmless, a step is idempotent (it reads slots below start
    and rewrites its own rows before reading them).
    """

    def __init__(self, run: Callable[[StepInputs], tuple[torch.Tensor, torch.Tensor]],
                 first: StepInputs) -> None:
        self.inputs = first.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                run(self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = run(self.inputs)

    def __call__(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        for dst, src in zip(self.inputs.tensors(), inputs.tensors(), strict=True):
            dst.copy_(src, non_blocking=True)
        self.graph.replay()
        return self.outputs


@dataclass
class Arena:
    """KV buffers that outlive one request's cache, so the next request reuses them and the
    graphs captured over them. `user`: the cache now on them (weak: dead once its request
    is done)."""

    k: torch.Tensor  # [L, 1, H_kv, S, D]
    v: torch.Tensor
    user: weakref.ref | None = None
    graphs: dict[int, GraphedStep] = field(default_factory=dict)  # bucket -> graph
    embed_graphs: dict[int, GraphedStep] = field(default_factory=dict)  # fed embeddings

    @property
    def free(self) -> bool:
        return self.user is None or self.user() is None

    @property
    def capacity(self) -> int:
        return self.k.shape[3]


class StaticModel:
    """`model` whose forwards of up to max(buckets) rows run at one shape per bucket (see
    the module docstring), replayed from CUDA graphs on a CUDA device; everything else
    (config, head, device, ...) is the model's. Runs whole-model forwards of one sequence,
    from token ids or input embeddings; layer ranges are not declared in `capabilities`."""

    def __init__(self, model: DecoderLM, options: StaticConfig | None = None) -> None:
        self.model = model
        self.options = options or StaticConfig()
        graphs = self.options.graphs
        self.graphs = model.device.type == "cuda" if graphs is None else graphs
        self._arenas: list[Arena] = []
        # with --compile, the step as run and captured. dynamic=None: the one-row step is
        # compiled for its shape, the first other bucket recompiles with the row count
        # symbolic and serves every later bucket and cache size. dynamic=False compiled each
        # bucket anew (~28 s each on an H200's host), inside timed runs (compiled-batched)
        self._compiled = (torch.compile(static_forward, dynamic=None)
                          if self.options.compile else None)

    def __getattr__(self, name: str):
        if name == "model":  # not set yet (during construction or copying)
            raise AttributeError(name)
        return getattr(self.model, name)

    @property
    def capabilities(self) -> Capabilities:
        backend = "torch --static" + (" --compile" if self.options.compile else "")
        # on CUDA static steps are the default unless load() is told the methods to come
        remedy = ("load the model without static steps (--no-static; draftsman.load(..., "
                  "static=False), or name the method: load(..., methods=[(name, options)]))")
        return replace(self.model.capabilities, backend=backend, input_embeddings=True,
                       remedy=remedy, **dict.fromkeys(STATIC_LACKS, False))

    def warm_up(self, capacity: int | None = None) -> None:
        """Compile (with `compile`) and capture (on CUDA) every bucket's step now, on an arena
        of `capacity` (default: the smallest) that later requests of that size reuse: what a
        server does at start-up and a benchmark before timing. Nothing to do for plain static
        steps on the CPU. Writes only the scratch arena, whose stale contents are never seen."""
        if not (self.graphs or self.options.compile):
            return
        cache = self.new_cache(capacity or self.options.round_to - max(self.options.buckets))
        device = cache.k.device
        # tables a model builds on first use (RoPE's) built first: a compile guards on them
        self.model.layer_context(torch.zeros(1, 1, dtype=torch.long, device=device))
        for bucket in self.options.buckets:
            tokens = torch.zeros(1, bucket, dtype=torch.long, device=device)
            self(tokens, torch.arange(bucket, device=device)[None], cache, start=0,
                 logits_at=None)

    def new_cache(self, capacity: int, batch: int = 1) -> KVCache:
        """A cache of at least `capacity` + max(buckets) slots, on a free arena if one is
        big enough (its stale contents are never seen: see the invariants)."""
        if batch != 1:
            raise UnsupportedError("--static decodes one sequence per cache (batch 1)")
        step = self.options.round_to
        size = -(-(capacity + max(self.options.buckets)) // step) * step
        free = [a for a in self._arenas if a.free and a.capacity >= size]
        if free:
            arena = min(free, key=lambda a: a.capacity)
        else:
            fresh = self.model.new_cache(size)
            arena = Arena(fresh.k, fresh.v)
            self._arenas.append(arena)
        cache = KVCache.from_buffers(arena.k, arena.v)
        arena.user = weakref.ref(cache)
        return cache

    def __call__(self, tokens: torch.Tensor | None, positions: torch.Tensor, cache: KVCache,
                 *, mask: torch.Tensor | None = None, layers: range | None = None,
                 inputs_embeds: torch.Tensor | None = None,
                 hidden_from: torch.Tensor | None = None,
                 logits_at: slice | torch.Tensor | None = ALL, start: int | None = None
                 ) -> Output:
        """The forward contract of base.py, for token ids or input embeddings through every
        layer."""
        whole = layers is None or layers == range(self.model.config.num_layers)
        if hidden_from is not None or not whole:
            raise UnsupportedError("--static runs whole-model forwards only")
        if tokens is None:
            if inputs_embeds is None:
                raise ValueError("a forward needs token ids or input embeddings")
            tokens = torch.zeros(positions.shape, dtype=torch.long, device=inputs_embeds.device)
        start = cache.length if start is None else start
        n = positions.shape[1]
        bucket = next((b for b in self.options.buckets if b >= n), None)
        tree = mask is None or (mask.shape[-1] == n and mask.numel() == n * n)
        if bucket is None or start + bucket > cache.capacity or not tree \
                or positions.shape[0] != 1:
            return self.model(tokens, positions, cache, mask=mask, logits_at=logits_at,
                              inputs_embeds=inputs_embeds, start=start)
        cache.check_room(start + n)
        inputs = step_inputs(tokens, positions, start, mask, bucket,
                             self.model.config.sliding_window, inputs_embeds)
        with torch.inference_mode():
            logits, hidden = self._step(cache, inputs, bucket)
            cache.set_length(start + n)
            hidden = hidden[:, :n]
            logits = None if logits_at is None else logits[:, :n][:, logits_at]
            if self.graphs:  # the graph's buffers: the next replay overwrites them
                hidden = hidden.clone()
                logits = None if logits is None else logits.clone()
        return Output(logits=logits, hidden=hidden)

    def _step(self, cache: KVCache, inputs: StepInputs, bucket: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        arena = next((a for a in self._arenas if a.k is cache.k), None)
        if not self.graphs or arena is None:  # eager (a cache not made here: no graphs)
            forward = self._compiled or static_forward
            return forward(self.model, cache.k, cache.v, inputs.to(cache.k.device))
        graphs = arena.graphs if inputs.embeds is None else arena.embed_graphs
        graph = graphs.get(bucket)
        if graph is None:
            model, k, v = self.model, arena.k, arena.v  # not the cache: it must die freely
            forward = self._compiled or static_forward
            graph = GraphedStep(lambda inp: forward(model, k, v, inp),
                                inputs.to(k.device))
            graphs[bucket] = graph
        return graph(inputs)
