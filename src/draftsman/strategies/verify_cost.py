"""The target's verify cost curve v(n) = L(n) / L(1), measured once per model, dtype and
thread count and cached under $DRAFTSMAN_HOME/profiles (the same file `draftsman profile`
writes). The cost-model γ policy needs it: on a memory-bound GPU v(n) ≈ 1 for small n, on
CPUs without native bf16 matmuls v(n) grows almost linearly, and the best γ differs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from draftsman.sparse_tree import (
    interpolate,
    load_profile,
    measure_latency,
    profile_path,
    save_profile,
)

if TYPE_CHECKING:
    from draftsman.engine import Engine

PROFILE_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)


def dtype_name(dtype: torch.dtype | str) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(
        dtype, str(dtype))


def engine_kind(engine: Engine) -> str:
    """What a verify-cost profile is keyed by besides model and threads."""
    return "llama.cpp" if getattr(engine, "backend", "torch") == "llama.cpp" \
        else dtype_name(engine.dtype)


def engine_profile_path(engine: Engine) -> Path:
    return profile_path(engine.target.name, engine_kind(engine), torch.get_num_threads())


def latency_profile(engine: Engine, name: str, model: Any) -> dict[int, float]:
    """{n: seconds of one forward over n new tokens} for `model` (the target or a draft)
    on this engine's backend, dtype and thread count, measured once and cached."""
    threads = torch.get_num_threads()
    kind = engine_kind(engine)
    path = profile_path(name, kind, threads)
    latency = load_profile(path)
    if latency is None or 1 not in latency:
        print(f"draftsman: measuring {name}'s forward cost once (saved to {path})",
              file=sys.stderr)
        latency = measure_latency(model, PROFILE_LENGTHS, context=64, repeats=2)
        save_profile(path, latency, {"model": name, "dtype": kind, "threads": threads,
                                     "context": 64, "repeats": 2})
    return latency


def verify_cost_curve(engine: Engine, max_tokens: int) -> dict[int, float]:
    """{n: cost of verifying n tokens / cost of one token} for n = 1..max_tokens."""
    latency = latency_profile(engine, engine.target.name, engine.target.model)
    base = latency[1]
    return {n: interpolate(latency, n) / base for n in range(1, max_tokens + 1)}


def draft_cost_ratio(engine: Engine, draft: str) -> float:
    """c before any step: one forward of the draft model / one forward of the target."""
    loaded = engine.model(draft)
    mine = latency_profile(engine, loaded.name, loaded.model)[1]
    return mine / latency_profile(engine, engine.target.name, engine.target.model)[1]
