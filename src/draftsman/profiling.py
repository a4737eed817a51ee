"""Forward-cost profiles: L(n), the seconds of one forward over n new tokens, measured
once per model, backend, dtype and thread count and cached under $DRAFTSMAN_HOME/profiles
($DRAFTSMAN_PROFILES where set: the test suite keeps its own, so that curves it measures
under its own load never replace a machine's); and from it the target's verify cost curve
v(n) = L(n) / L(1) (the same file `draftsman profile` writes). The cost-model γ policy
needs it: on a memory-bound GPU v(n) ≈ 1 for small n, on CPUs without native bf16 matmuls
v(n) grows almost linearly, and the best γ differs."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from draftsman.kernels.native import build_key, kquant_available
from draftsman.models.draft_vocab import VocabSubsetHead
from draftsman.store.home import draftsman_home, locked

if TYPE_CHECKING:
    from draftsman.engine import Engine

# up to 16 rows: one request's verify; beyond, the batch scheduler's steps (many requests'
# rows in one forward, prompt chunks beside them). 17 and 33: kernels that work in tiles of
# 16 rows (AMX) pay a whole tile for the first row past one, a step the curve must see
# (1.5B q4 on AMX: 16 / 24 / 32 rows 108 / 142 / 150 ms; linear from 16 to 24 would put 17
# rows at 112)
PROFILE_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 17, 24, 32, 33, 48, 64)


def dtype_name(dtype: torch.dtype | str) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(
        dtype, str(dtype))


def model_kind(model: Any, dtype: torch.dtype | str) -> str:
    """What a verify-cost profile is keyed by besides model and threads: the backend's own
    numerics when it declares them (llama.cpp's kernels and feeding mode), else the dtype;
    plus the device when it is not the CPU (a GPU's curve is another machine's), and
    "static" for fixed-shape steps (their curve steps at the buckets)."""
    caps = model.capabilities
    kind = caps.numerics or dtype_name(dtype)
    device = getattr(model, "device", None)
    if isinstance(device, torch.device) and device.type != "cpu":
        kind += "-" + str(device).replace(":", "")
    if "--static" in caps.backend:
        kind += "-static" + ("-compiled" if caps.backend.endswith("--compile") else "")
    head = getattr(model, "lm_head", None)
    if isinstance(head, VocabSubsetHead):  # a draft's narrowed head: its own, cheaper curve
        kind += f"-vocab{len(head.keep)}"
    return kind


def engine_kind(engine: Engine) -> str:
    return model_kind(engine.target.model, engine.dtype)


def engine_profile_path(engine: Engine) -> Path:
    return profile_path(engine.target.name, engine_kind(engine), torch.get_num_threads())


def wanted_lengths(rows: int) -> tuple[int, ...]:
    """The profile lengths a curve up to `rows` rows reads: every one up to 16, then up to
    the first at or past `rows` (interpolation needs the point beyond)."""
    beyond = [n for n in PROFILE_LENGTHS if n >= rows]
    top = max(16, beyond[0] if beyond else PROFILE_LENGTHS[-1])
    return tuple(n for n in PROFILE_LENGTHS if n <= top)


def latency_profile(engine: Engine, name: str, model: Any, rows: int = 16,
                    kind: str | None = None) -> dict[int, float]:
    """{n: seconds of one forward over n new tokens} for `model` (the target or a draft)
    on this engine's backend and thread count, in the target's numbers or `kind` (a
    draft's own format), measured once and cached. Only the
    lengths a curve up to `rows` needs are measured (a batch scheduler's 64 rows cost four
    times a single request's 16 to measure); a later, longer need measures the rest."""
    threads = torch.get_num_threads()
    kind = kind or engine_kind(engine)
    path = profile_path(name, kind, threads)
    wanted = wanted_lengths(rows)

    def covered(latency: dict[int, float]) -> bool:  # a profile that covers them is kept
        return 1 in latency and max(latency) >= wanted[-1]

    latency = load_profile(path) or {}
    if covered(latency):
        return latency
    # one process measures at a time, then the others read what it saved: two servers
    # started together timed each other's forwards into their saved curves (a 1.5B q4
    # one-row forward at 168 ms instead of ~50, verifying 2 rows "3.9 times" one)
    with locked("profiles", log=lambda _: None):
        latency = load_profile(path) or {}
        if covered(latency):
            return latency
        known = max(latency, default=0)
        todo = [n for n in wanted if n not in latency and (n == 1 or n > known)]
        print(f"draftsman: measuring {name}'s forward cost once (saved to {path})",
              file=sys.stderr)
        latency |= measure_latency(model, todo, context=64, repeats=2)
        save_profile(path, latency,
                     {"model": name, "dtype": kind, "threads": threads, "context": 64,
                      "repeats": 2})
    return latency


def verify_cost_curve(engine: Engine, max_tokens: int) -> dict[int, float]:
    """{n: cost of verifying n tokens / cost of one token} for n = 1..max_tokens."""
    latency = latency_profile(engine, engine.target.name, engine.target.model, max_tokens)
    base = latency[1]
    return {n: interpolate(latency, n) / base for n in range(1, max_tokens + 1)}


def draft_cost_ratio(engine: Engine, draft: str, dtype: str | None = None,
                     vocab: int | None = None) -> float:
    """c before any step: one forward of the draft model (in its format and head, Engine.model)
    / one forward of the target."""
    loaded = engine.model(draft, dtype, vocab)
    kind = model_kind(loaded.model, engine.companion_dtype(dtype))
    mine = latency_profile(engine, loaded.name, loaded.model, kind=kind)[1]
    return mine / latency_profile(engine, engine.target.name, engine.target.model)[1]


def measure_latency(model, lengths: Sequence[int], context: int = 256, repeats: int = 3,
                    warmup: int = 1) -> dict[int, float]:
    """Median seconds of one forward over n new rows after `context` cached tokens, for each
    n in `lengths`: L_fp(n) on this machine (`measure_rounds`, medians)."""
    return medians(measure_rounds(model, lengths, context, repeats, warmup))


def medians(rounds: dict[int, list[float]]) -> dict[int, float]:
    """n -> the median of its rounds' seconds (measure_rounds)."""
    return {n: statistics.median(t) for n, t in rounds.items()}


def round_ratios(rounds: dict[int, list[float]], base: int) -> dict[int, list[float]]:
    """n -> L(n) / L(base) within each round, in round order. The forwards of one round run
    back to back, so a slow spell tends to move both of a pair; the pairs' range says how
    far this host's noise reaches a ratio such as v(16)."""
    return {n: [t / b for t, b in zip(times, rounds[base], strict=True)]
            for n, times in rounds.items()}


def measure_rounds(model, lengths: Sequence[int], context: int = 256, repeats: int = 3,
                   warmup: int = 1, greedy: bool = False) -> dict[int, list[float]]:
    """Seconds of one forward over n new rows (tree-style bool mask, logits on every row)
    after `context` cached tokens, for each n in `lengths`, one per round in round order.
    `greedy`: each forward gives its rows' greedy tokens instead (a model that declares
    `greedy_head`), read to the host as a greedy verify reads them.

    Every length is warmed up before any is timed (a static model captures a CUDA graph per
    bucket on its first call), then timed in rounds, one forward of each length per round:
    a slow spell of the machine (a GPU's clocks ramping after a capture, another process)
    spreads over all lengths instead of inflating one. Timing lengths one after another
    gave an H200 a 4-row forward of 6.0 ms between 3.6 ms ones (gpu-h200/all-families)."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = model.new_cache(context + max(lengths) + 1)
    ids = torch.randint(0, vocab, (1, context), generator=gen)
    model(ids, torch.arange(context)[None], cache)
    # a GPU forward returns before it has run: wait for it, or only the launch is timed
    device = getattr(model, "device", torch.device("cpu"))
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    inputs = {int(n): (torch.randint(0, vocab, (1, n), generator=gen),
                       torch.arange(context, context + n)[None],
                       torch.ones(n, n, dtype=torch.bool).tril()) for n in lengths}

    def forward(n: int) -> float:
        tokens, pos, mask = inputs[n]
        cache.truncate(context)
        t0 = time.perf_counter()
        if greedy:
            model(tokens, pos, cache, mask=mask, greedy=True).tokens.tolist()
        else:
            model(tokens, pos, cache, mask=mask)
        sync()
        return time.perf_counter() - t0

    for _ in range(warmup):
        for n in inputs:
            forward(n)
    times: dict[int, list[float]] = {n: [] for n in inputs}
    for _ in range(repeats):
        for n in inputs:
            times[n].append(forward(n))
    return times


# MiB the memory probe reads: 8x the largest last-level cache seen here (32 MiB)
STREAM_PROBE_MIB = 256


def memory_stream_gbs(mib: int | None = None, repeats: int = 4) -> float | None:
    """GB/s at which this machine streams memory now, on the threads torch uses: the best of
    `repeats` reads of a buffer of `mib` MiB (STREAM_PROBE_MIB; kernels/stream_probe.cpp),
    apart from any model. A one-row CPU forward streams its weights at about this speed, so
    a shared host whose stream changes state between runs moves L(1), and with it every
    v(n) = L(n) / L(1): `draftsman profile` records it beside the curve. None where the
    native kernels do not load."""
    if not kquant_available():
        return None
    buf = torch.ones((mib or STREAM_PROBE_MIB) << 20, dtype=torch.uint8)  # touched: no faults
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.ops.draftsman.stream_read(buf)
        best = min(best, time.perf_counter() - t0)
    return buf.numel() / best / 1e9


DOT_PROBE_ROUNDS = 2_000_000  # ~4 ms a thread at ~8.7 G vpdpbusd a second


def dot_rate(rounds: int = DOT_PROBE_ROUNDS, repeats: int = 3) -> float | None:
    """`vpdpbusd` (zmm) a second on the threads torch uses, the best of `repeats` runs of
    independent chains (kernels/dot_probe.cpp): the pipes every records product runs on, read
    beside the stream for records_floor's floor. None where the kernels do not load or the
    build has no AVX-512 VNNI."""
    if not kquant_available():
        return None
    best = float("inf")
    done = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = int(torch.ops.draftsman.dot_products(rounds)[0])
        best = min(best, time.perf_counter() - t0)
    return done / best if done else None


def interpolate(latency: dict[int, float], n: int) -> float:
    """Piecewise-linear L_fp(n) between measured lengths (clamped at the ends)."""
    xs = sorted(latency)
    if n <= xs[0]:
        return latency[xs[0]]
    if n >= xs[-1]:
        return latency[xs[-1]] * n / xs[-1]
    for a, b in zip(xs, xs[1:], strict=False):
        if a <= n <= b:
            w = (n - a) / (b - a)
            return latency[a] * (1 - w) + latency[b] * w
    return latency[xs[-1]]


def profiles_dir() -> Path:
    """$DRAFTSMAN_PROFILES, else $DRAFTSMAN_HOME/profiles (read on every call)."""
    own = os.environ.get("DRAFTSMAN_PROFILES")
    return Path(own).expanduser() if own else draftsman_home() / "profiles"


def profile_path(model_name: str, dtype: str, threads: int) -> Path:
    safe = Path(str(model_name)).name
    return profiles_dir() / f"{safe}-{dtype}-t{threads}.json"


def save_profile(path: Path, latency: dict[int, float], meta: dict) -> None:
    """Writes the profile with the kernels' build key beside `meta`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**meta, "kernels": build_key(),
            "latency": {str(k): v for k, v in sorted(latency.items())}}
    path.write_text(json.dumps(data, indent=1) + "\n")


def load_profile(path: Path, any_build: bool = False) -> dict[int, float] | None:
    """The saved L(n), or None where there is none or it was measured on other kernels
    (a changed kernel changes the curve; `any_build` reads it anyway)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not any_build and data.get("kernels") != build_key():
        return None
    return {int(k): float(v) for k, v in data["latency"].items()}

