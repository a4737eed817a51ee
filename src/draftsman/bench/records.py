"""What a greedy `draftsman bench` run leaves behind for `--method default` and
`--backend auto`: per engine of the run (its own and each `engine=` tag), the exact
configuration with the best overall tokens/s, recorded per CPU, target, backend and number
format (strategies/default_method.py keeps the records and reads them back)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftsman.bench.results import Row
from draftsman.bench.spec import MethodConfig, parse_engine
from draftsman.strategies.default_method import (
    measured_now,
    record_path,
    recordable,
    write_record,
)


def fastest_exact(rows: list[Row], engine: str = "") -> tuple[str, float, int] | None:
    """(spec, tokens/s, tokens timed) of the exact draftsman configuration (autoregressive
    decoding included) on `engine` (an `engine=` tag; "": the run's own) with the best
    overall tokens/s (all its tokens over all its seconds), or None when no row qualifies.
    The spec leaves out the tag."""
    totals: dict[str, list[float]] = {}
    for row in rows:
        if (row.get("kind") not in ("baseline", "draftsman")
                or row.get("exactness") not in ("exact", "reference")):
            continue
        config = MethodConfig(row["method"], tuple((row.get("options") or {}).items()))
        if config.engine != engine:
            continue
        spec = config.without_engine().label
        tokens_seconds = totals.setdefault(spec, [0.0, 0.0])
        tokens_seconds[0] += row["new_tokens"]
        tokens_seconds[1] += row["seconds"]
    speeds = {spec: t / s for spec, (t, s) in totals.items() if s > 0}
    if not speeds:
        return None
    best = max(speeds, key=lambda spec: speeds[spec])
    return best, speeds[best], int(totals[best][0])


def record_fastest(target: str, temperature: float, numerics: str, engine: Any,
                   rows: list[Row], log: Callable[[str], None]) -> None:
    """After a greedy run on a catalogue target: remember its fastest exact configuration as
    this machine's `default` method for the target, backend and numerics, and the same for
    each `engine=` tag's configurations (timed in the same run, so `--backend auto` compares
    them on equal terms)."""
    if temperature != 0 or not recordable(target):
        return
    tags = sorted({MethodConfig(r["method"], tuple((r.get("options") or {}).items())).engine
                   for r in rows if r.get("kind") in ("baseline", "draftsman")})
    for tag in tags or [""]:
        if tag:
            backend, dtype = parse_engine(tag)
            key = numerics if backend == "llama.cpp" else str(dtype)
        else:
            backend, key = engine.backend, engine.numerics_key
        record_one(target, backend, key, fastest_exact(rows, tag), log)


def record_one(target: str, backend: str, numerics: str,
               best: tuple[str, float, int] | None, log: Callable[[str], None]) -> None:
    if best is None:
        return
    spec, speed, tokens = best
    record = measured_now(target, backend, numerics, spec, speed, tokens)
    kept = write_record(record)
    if kept is not None:
        log(f"bench: kept the default method {kept.spec} from a larger run ({kept.tokens} "
            f"tokens timed, this one {tokens}); delete {record_path()} to start over")
        return
    log(f"bench: default method for {target} on {backend} {numerics} here is now "
        f"{spec} ({speed:.1f} tok/s over {tokens} tokens)")
