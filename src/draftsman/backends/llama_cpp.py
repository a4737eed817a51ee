"""llama.cpp as a model backend: GGUF weights on llama.cpp's quantised CPU kernels.

`LlamaCppLM` speaks the forward contract of models/base.py for everything llama.cpp can
express, so every strategy built on `ModelState` / `model(tokens, positions, cache, ...)` runs
unchanged on it:

- token batches with explicit positions and logits only at the rows asked for;
- rollback: the cache is sequence 0 of one llama.cpp context, and `truncate(n)` removes the
  cells at positions >= n (llama_memory_seq_rm), so rolling back costs nothing;
- trees: a tree mask becomes one llama.cpp sequence per leaf; a node belongs to every
  sequence whose leaf descends from it, the committed prefix is shared by all of them
  (llama_memory_seq_cp), and `keep(path)` turns the accepted path's sequence back into
  sequence 0.

Layer ranges, hidden states and input embeddings have no counterpart in llama.cpp's API; a
call that needs them fails with `UnsupportedError` naming the torch backend.

The shared libraries are built once by scripts/build_llama_cpp.sh into `<venv>/llama.cpp`
(or $DRAFTSMAN_LLAMA_CPP) and loaded through the ctypes bindings of llama-cpp-python.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftsman.backends.llama_cpp_batch import SequenceCache, SequencePool, ragged_forward
from draftsman.errors import (
    BackendError,
    ContextOverflowError,
    InvalidArgumentError,
    UnsupportedError,
)
from draftsman.hardware import cpu_flags
from draftsman.models.base import ALL, Output
from draftsman.models.config import ModelConfig
from draftsman.models.protocol import Capabilities
from draftsman.models.ragged import RaggedCaches, Segment

LIBRARY_ENV = "DRAFTSMAN_LLAMA_CPP"
MAX_SEQUENCES = 16  # tree leaves one verify may hold
BATCH = 512  # tokens per llama_decode call for long inputs (prompts)
# Numerics modes. "fast" (default): verify and catch-up inputs go to llama.cpp in one
# llama_decode on llama.cpp's default KV cache and attention settings, so a k-token verify
# costs what llama.cpp's batched kernels cost and plain decoding runs at llama.cpp's own
# speed; greedy outputs may part from one-token decoding at numerical near-ties.
# "bitwise": the feeding below, bit-identical to one-token decoding, at a measured cost.
NUMERICS = ("fast", "bitwise")
DEFAULT_NUMERICS = "fast"
# llama.cpp's CPU kernels are not batch-invariant: a ubatch of 4+ rows goes through the
# repacked GEMM kernels, whose logits differ from the one-row GEMV path by up to ~0.6 (1.5B,
# Q4_K). Up to 3 rows every row takes the GEMV path and is bit-identical to decoding it alone,
# so in bitwise mode short inputs (verify, catch-up) are fed in pieces of `exact_rows()`:
# greedy speculation then reproduces this backend's own token-by-token output exactly (with
# the attention settings of `_bitwise_attention`). The verify cost then grows linearly in the
# rows (README, "Numerics modes"). ggml's AMX kernels take every matmul of 2+ rows onto their
# tiles: with them, one row a piece.
EXACT_ROWS = 3
SHORT = 64  # bitwise: inputs up to this many tokens are split into exact_rows() pieces
CONTEXT_STEP = 4096
BATCH_CONTEXT = 4096  # tokens per sequence of the batch context

_lock = threading.RLock()  # re-entrant: a cache finalizer may run while it is held
_lib: Any = None
_log_callback: Any = None


def build_info() -> dict[str, Any]:
    """How scripts/build_llama_cpp.sh built llama.cpp here (its build-info.json): version,
    extra compiler flags, whether ggml's AMX kernels are in. Builds that predate the file:
    native, AMX kernels in wherever the CPU has AMX."""
    try:
        return json.loads((install_dir() / "build-info.json").read_text())
    except (OSError, ValueError):
        return {"native": True, "extra_flags": "", "amx_kernels": "amx_int8" in cpu_flags()}


def amx_kernels_built() -> bool:
    """Whether this llama.cpp has ggml's AMX kernels. They place weights in an AMX "extra
    buffer type", repacked for the tiles."""
    return bool(build_info().get("amx_kernels"))


def amx_mended() -> bool:
    """Whether the build's AMX matmul has its tile configuration mended
    (scripts/patch_llama_cpp.py). Unmended, GCC drops the configuration's stores and the
    first multi-row matmul segfaults (ggml-org/llama.cpp#20824), and once our own AMX kernels
    have run in the process its tiles are unconfigured (SIGILL); such a build loads models
    without extra buffer types (`use_extra_bufts`, `--no-repack`), losing the repacked
    AVX-512 weights too."""
    return bool(build_info().get("amx_tile_config_mended"))


def repack() -> bool:
    """Whether models load with llama.cpp's repacked (extra buffer type) weights: wherever
    the build has no AMX kernels, or has them mended."""
    return not amx_kernels_built() or amx_mended()


def exact_rows() -> int:
    """Rows a bitwise piece takes (EXACT_ROWS; one where the AMX tiles take 2+ rows)."""
    return 1 if amx_kernels_built() and amx_mended() else EXACT_ROWS


def describe_build() -> dict[str, Any]:
    """What a results row records about the llama.cpp it ran."""
    info = build_info()
    return {"version": info.get("version"), "native": info.get("native"),
            "extra_flags": info.get("extra_flags", ""), "amx_kernels": amx_kernels_built(),
            "amx_mended": amx_mended(), "repack": repack()}


def model_params(lib: Any) -> Any:
    """llama.cpp model parameters for the CPU: no GPU layers; repacked weights unless the
    build has unmended AMX kernels (see amx_mended)."""
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 0
    if not repack():
        params.use_extra_bufts = False
    return params


def install_dir() -> Path:
    """Where scripts/build_llama_cpp.sh put llama.cpp: $DRAFTSMAN_LLAMA_CPP or <venv>/llama.cpp."""
    env = os.environ.get(LIBRARY_ENV)
    return Path(env) if env else Path(sys.prefix) / "llama.cpp"


def binary(name: str) -> Path:
    path = install_dir() / "bin" / name
    if not path.is_file():
        raise BackendError(f"{path} is missing; build llama.cpp with `make setup`")
    return path


def llama() -> Any:
    """The llama_cpp ctypes module, bound to our build and initialised once."""
    global _lib
    with _lock:
        if _lib is None:
            lib_dir = install_dir() / "lib"
            if not (lib_dir / "libllama.so").exists():
                raise BackendError(
                    f"llama.cpp is not built ({lib_dir}/libllama.so missing); run `make setup` "
                    "(scripts/build_llama_cpp.sh) or use --backend torch")
            os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
            try:
                import llama_cpp
            except ImportError as exc:
                raise BackendError(
                    f"the llama-cpp-python bindings are not installed ({exc}); run `make setup`"
                ) from None
            global _log_callback
            _log_callback = llama_cpp.llama_log_callback(_log)  # kept alive: C holds it
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _lib = llama_cpp
        return _lib


def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == 4 or os.environ.get("DRAFTSMAN_LLAMA_CPP_VERBOSE"):  # GGML_LOG_LEVEL_ERROR
        sys.stderr.write(text.decode("utf-8", "replace"))


def check_numerics(numerics: str) -> None:
    if numerics not in NUMERICS:
        raise InvalidArgumentError(
            f"unknown --numerics {numerics!r}; choose from {', '.join(NUMERICS)}")


def numerics_key(numerics: str) -> str:
    """What forward-cost profiles are keyed by: each mode has its own verify cost curve, and so
    does each set of kernels a build runs: matmuls of 2+ rows on ggml's AMX tiles (prompts of
    8+ rows 1.2-1.75x cheaper than repacked AVX-512), or on weights loaded without repacking.
    A curve measured on other kernels would mislead the cost model."""
    if not repack():
        return f"llama.cpp-{numerics}-norepack"
    return f"llama.cpp-{numerics}" + ("-amx" if amx_kernels_built() else "")


class LlamaCppCache:
    """Sequence 0 of a llama.cpp context. `length` mirrors the positions llama.cpp holds.

    Invariant between calls: the context holds exactly positions 0..length-1 of sequence 0
    and nothing else, except right after a tree forward, when `tree` describes the extra
    sequences until `keep` or `truncate` folds them away. Only this class changes that
    state: the model announces a tree with `begin_tree` and a finished forward with
    `set_length`.
    """

    def __init__(self, owner: LlamaCppLM, ctx: Any, capacity: int) -> None:
        self.owner, self.ctx, self.capacity = owner, ctx, capacity
        self.lib = llama()
        self.memory = self.lib.llama_get_memory(ctx)
        self.lib.llama_memory_clear(self.memory, True)
        self.length = 0
        self.tree: list[set[int]] | None = None  # node -> sequences holding it
        self.tree_start = 0
        weakref.finalize(self, owner.release, ctx, capacity)

    def check_room(self, end: int) -> None:
        if end > self.capacity:
            raise ContextOverflowError(
                f"sequence of {end} tokens does not fit the KV cache of {self.capacity} slots")

    def _drop_tree(self) -> None:
        if self.tree is not None:
            for seq in range(1, 1 + max(max(s) for s in self.tree if s)):
                self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
            self.tree = None

    def begin_tree(self, seqs: list[set[int]], start: int) -> None:
        """Before a tree forward from `start`: node i will belong to the sequences seqs[i],
        and every leaf sequence shares the committed prefix of sequence 0."""
        self._drop_tree()
        for s in range(1, 1 + max(max(x) for x in seqs)):
            self.lib.llama_memory_seq_cp(self.memory, 0, s, -1, start)
        self.tree, self.tree_start = seqs, start

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self._drop_tree()
        if length < self.length:
            self.lib.llama_memory_seq_rm(self.memory, 0, length, -1)
        self.length = length

    def set_length(self, length: int) -> None:
        self.check_room(length)
        self.length = length

    def keep(self, slots: torch.Tensor | list[int], start: int) -> None:
        """Keep the tree nodes at `slots` (a root path, ascending) as positions start..."""
        slots = torch.as_tensor(slots).tolist()
        if self.tree is None:  # a linear forward: the path is a prefix of it
            if slots != list(range(start, start + len(slots))):
                raise ValueError("keep() on a linear forward needs consecutive slots")
            self.truncate(start + len(slots))
            return
        nodes = [int(s) - self.tree_start for s in slots]
        if start != self.tree_start:
            raise ValueError("keep() must start where the tree forward started")
        seqs = set.intersection(*(self.tree[n] for n in nodes)) if nodes else {0}
        seq = min(seqs)
        lib = self.lib
        lib.llama_memory_seq_keep(self.memory, seq)  # only the prefix and seq's branch remain
        lib.llama_memory_seq_rm(self.memory, seq, start + len(nodes), -1)
        if seq != 0:
            lib.llama_memory_seq_cp(self.memory, seq, 0, -1, -1)
            lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.tree = None
        self.length = start + len(nodes)

    def reset(self) -> None:
        self.truncate(0)


class LlamaCppLM:
    """A GGUF model on llama.cpp behind the DecoderLM forward contract (see module doc)."""

    # keep() of a tree path leaves its cells where the tree put them, and llama.cpp sums
    # attention in cell order: later logits can differ from a linear decode's (tree
    # speculation therefore keeps only a path's leading in-order nodes, see
    # strategies/tree_speculative.py). Trees hold up to SHORT rows.
    capabilities = Capabilities(
        backend="llama.cpp", layer_ranges=False, input_embeddings=False, hidden_states=False,
        exact_tree_keep=False, max_tree_rows=SHORT, device="cpu",
        numerics=numerics_key(DEFAULT_NUMERICS), ragged_batches=True)

    def __init__(self, gguf: str | Path, config: ModelConfig, threads: int | None = None,
                 numerics: str = DEFAULT_NUMERICS) -> None:
        check_numerics(numerics)
        self.numerics = numerics
        # per instance: the mode keys this model's forward-cost profile
        self.capabilities = replace(LlamaCppLM.capabilities, numerics=numerics_key(numerics))
        self.exact_rows = exact_rows()  # read from the build's info once, not every forward
        lib = llama()
        self.lib = lib
        self.path = Path(gguf)
        self.config = config
        self.threads = threads or torch.get_num_threads()
        self.handle = lib.llama_model_load_from_file(str(self.path).encode(),
                                                     model_params(lib))
        if not self.handle:
            raise BackendError(f"llama.cpp could not load {self.path} (corrupt or unsupported"
                                 " GGUF?)")
        self.vocab = lib.llama_model_get_vocab(self.handle)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        if self.n_vocab != config.vocab_size:
            raise BackendError(f"{self.path}: llama.cpp sees {self.n_vocab} tokens, the model "
                                 f"config says {config.vocab_size}")
        self._idle: list[tuple[Any, int]] = []  # contexts free for the next cache
        self._batch = lib.llama_batch_init(BATCH, 0, MAX_SEQUENCES)
        # one batch buffer per model: concurrent requests (the server) take turns filling it;
        # each decode uses every core anyway
        self._decode_lock = threading.Lock()
        self.dtype = torch.float32  # logits dtype
        weakref.finalize(self, _free_model, lib, self.handle, self._batch, self._idle)

    # ---- contexts ------------------------------------------------------------------
    def new_cache(self, capacity: int, batch: int = 1) -> LlamaCppCache:
        if batch != 1:
            raise UnsupportedError("the llama.cpp backend runs one sequence per cache")
        if capacity > self.config.max_position_embeddings + MAX_SEQUENCES:
            raise ContextOverflowError(
                f"{capacity} tokens exceed the model's context of "
                f"{self.config.max_position_embeddings}")
        with _lock:
            fits = [i for i, (_, n) in enumerate(self._idle) if n >= capacity]
            reuse = self._idle.pop(min(fits, key=lambda i: self._idle[i][1])) if fits else None
        if reuse is not None:
            return LlamaCppCache(self, *reuse)
        n_ctx = -(-capacity // CONTEXT_STEP) * CONTEXT_STEP
        params = self.lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = BATCH
        params.n_seq_max = MAX_SEQUENCES
        params.kv_unified = True  # sequences share cells: a tree's branches share the prefix
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        if self.numerics == "bitwise":
            self._bitwise_attention(params)
        ctx = self.lib.llama_init_from_model(self.handle, params)
        if not ctx:
            raise BackendError(f"llama.cpp could not create a context of {n_ctx} tokens")
        return LlamaCppCache(self, ctx, n_ctx)

    def _bitwise_attention(self, params: Any) -> None:
        """Flash attention over a Q8_0 KV cache: with an f16/f32 cache, llama.cpp switches a
        one-row decode to a split-KV kernel once 512+ cells are in use, and its sums differ
        from the multi-row kernel's; a quantised cache keeps every row on the same kernel."""
        params.flash_attn_type = self.lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = params.type_v = self.lib.GGML_TYPE_Q8_0

    def sequence_caches(self, sequences: int) -> Callable[[int], SequenceCache]:
        """Caches that can share forwards (a ragged forward): the sequences of a new batch
        context of `sequences` sequences, each up to the model's context (at most
        BATCH_CONTEXT tokens). A batch scheduler holds one (llama_cpp_batch.py)."""
        per = min(self.config.max_position_embeddings, BATCH_CONTEXT)
        return SequencePool(self, sequences, per, BATCH).take

    def release(self, ctx: Any, n_ctx: int) -> None:
        with _lock:
            self._idle.append((ctx, n_ctx))

    # ---- forward -------------------------------------------------------------------
    def __call__(self, tokens: torch.Tensor | None, positions: torch.Tensor,
                 cache: LlamaCppCache, **kwargs: Any) -> Output:
        return self.forward(tokens, positions, cache, **kwargs)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor | None,
        positions: torch.Tensor,
        cache: LlamaCppCache,
        *,
        mask: torch.Tensor | None = None,
        layers: range | None = None,
        inputs_embeds: torch.Tensor | None = None,
        hidden_from: torch.Tensor | None = None,
        logits_at: slice | torch.Tensor | None = ALL,
        start: int | None = None,
    ) -> Output:
        """tokens/positions [1, T] -> logits [1, R, V] float32 at rows arange(T)[logits_at]."""
        if layers not in (None, range(self.config.num_layers)) or hidden_from is not None:
            raise UnsupportedError("layer ranges and hidden states need --backend torch")
        if inputs_embeds is not None or tokens is None:
            raise UnsupportedError("input embeddings need --backend torch")
        if isinstance(cache, SequenceCache):  # one sequence of a batch context, alone
            if mask is not None:
                raise UnsupportedError("a batched llama.cpp forward holds no trees")
            start = cache.length if start is None else start
            cache = RaggedCaches([Segment(cache, start, tokens.shape[1])])
        if isinstance(cache, RaggedCaches):
            if mask is not None:
                raise UnsupportedError("tree masks go in a ragged forward's segments")
            out = ragged_forward(self, tokens, positions, cache, logits_at)
            return Output(logits=out[None] if out is not None else None, hidden=None)
        if tokens.shape[0] != 1:
            raise UnsupportedError("the llama.cpp backend runs one sequence per forward")
        start = cache.length if start is None else start
        if start != cache.length:
            cache.truncate(start)
        ids = tokens[0].tolist()
        pos = positions[0].tolist()
        n = len(ids)
        cache.check_room(start + n)
        rows = [] if logits_at is None else torch.arange(n)[logits_at].tolist()
        seqs = self._sequences(mask, n)
        if seqs is not None:
            cache.begin_tree(seqs, start)
        with self._decode_lock:
            out = self._decode(cache.ctx, ids, pos, seqs, rows)
        cache.set_length(start + n)
        return Output(logits=out[None] if out is not None else None, hidden=None)

    def _sequences(self, mask: torch.Tensor | None, n: int) -> list[set[int]] | None:
        """None for a causal (linear) mask; else node -> the leaf sequences containing it."""
        if mask is None:
            return None
        m = mask.to(torch.bool)
        m = m.reshape(m.shape[-2], m.shape[-1])[:, -n:]  # the new-token part [T, T]
        if torch.equal(m, torch.ones(n, n, dtype=torch.bool).tril()):
            return None
        is_leaf = ~(m.clone().fill_diagonal_(False).any(0))  # nobody descends from it
        leaves = torch.nonzero(is_leaf).flatten().tolist()
        if len(leaves) > MAX_SEQUENCES:
            raise UnsupportedError(
                f"a tree of {len(leaves)} leaves exceeds the backend's {MAX_SEQUENCES}")
        return [{s for s, leaf in enumerate(leaves) if bool(m[leaf, i])} for i in range(n)]

    def _decode(self, ctx: Any, ids: list[int], pos: list[int],
                seqs: list[set[int]] | list[tuple[int, ...]] | None, rows: list[int], *,
                tree: bool = True, piece: int | None = None) -> torch.Tensor | None:
        """Feed the tokens in pieces (see piece_rows); return the logits of `rows` [R, V].
        `seqs[i]`: the sequences row i belongs to (None: sequence 0), a tree's or, with
        `tree=False`, several requests' (llama_cpp_batch.py).

        Tree nodes come parents first, so a piece never needs a node of a later piece."""
        want = set(rows)
        if tree and seqs is not None and len(ids) > SHORT:
            raise UnsupportedError(f"a tree over {SHORT} nodes")
        piece = piece or self.piece_rows(len(ids))
        logits = torch.empty(len(want), self.n_vocab) if want else None  # batch order
        filled = 0
        b = self._batch
        for lo in range(0, len(ids), piece):
            hi = min(lo + piece, len(ids))
            outputs = 0
            for j, i in enumerate(range(lo, hi)):
                b.token[j] = ids[i]
                b.pos[j] = pos[i]
                node_seqs = (0,) if seqs is None else sorted(seqs[i])
                b.n_seq_id[j] = len(node_seqs)
                for k, s in enumerate(node_seqs):
                    b.seq_id[j][k] = s
                b.logits[j] = i in want
                outputs += i in want
            b.n_tokens = hi - lo
            code = self.lib.llama_decode(ctx, b)
            if code != 0:
                raise BackendError(f"llama_decode failed with code {code}")
            if outputs:  # one copy, straight out of llama.cpp's buffer
                ptr = self.lib.llama_get_logits(ctx)
                arr = np.ctypeslib.as_array(ptr, shape=(outputs, self.n_vocab))
                logits[filled:filled + outputs] = torch.from_numpy(arr)
                filled += outputs
        order = sorted(want)
        if logits is not None and order != rows:
            where = {r: k for k, r in enumerate(order)}
            logits = logits[[where[r] for r in rows]]
        return logits

    def piece_rows(self, n: int) -> int:
        """Rows per llama_decode for an input of n tokens: bitwise mode feeds short inputs
        in exact_rows() pieces, fast mode everything in BATCH pieces."""
        return self.exact_rows if self.numerics == "bitwise" and n <= SHORT else BATCH

    def head(self, hidden: torch.Tensor, exit_head: Any = None) -> torch.Tensor:
        raise UnsupportedError("hidden states are not exposed by llama.cpp; use --backend torch")


def _free_model(lib: Any, handle: Any, batch: Any, idle: list) -> None:
    for ctx, _ in idle:
        lib.llama_free(ctx)
    lib.llama_batch_free(batch)
    lib.llama_model_free(handle)
