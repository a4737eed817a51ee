"""`--method default`: the fastest exact configuration this machine measured, else a constant.
With `--backend auto` and no --dtype, the backend and dtype too (`fastest_here`).

`draftsman bench` records, at the end of a greedy run, the exact draftsman configuration with
the best overall tokens/s, keyed by (CPU model, target, backend, numerics), in
`$DRAFTSMAN_HOME/default-methods.json`. `default` resolves to that record when one matches
this machine, target, backend and numerics, else to the built-in default of the backend.

A run replaces a record only if it timed at least SAME_RUN_SHARE as many tokens with its
fastest configuration as the run that wrote it, so a quick smoke run never overrides a full
one, while the same preset run again replaces it (after a numerics change its greedy replies
end a few tokens earlier or later).

Invariants: a record only ever names an exact method (the bench writes no other); a missing,
unreadable or corrupt file is ignored with a warning and never stops generation; only
catalogue targets are recorded (a path's contents can change under the same name).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from draftsman.hardware import cpu_model
from draftsman.store.catalogue import CATALOGUE
from draftsman.store.home import draftsman_home

DEFAULT = "default"
# The share of a record's timed tokens a run must time to replace it: the cpu preset run again
# on a build with other roundings timed 1,456 tokens where its record had 1,467.
SAME_RUN_SHARE = 0.9
# The built-in defaults when nothing was measured: on llama.cpp the free suffix drafter
# (prompt, reply so far and the client's history) with the cost-model γ, which verifies no
# guess where none pays; on torch plain decoding, as before backends were chosen
# automatically.
DEFAULT_METHOD = "speculative:draft=suffix,gamma=auto"
TORCH_DEFAULT_METHOD = "autoregressive"
RECORD_FILE = "default-methods.json"
VERSION = 1

Warn = Callable[[str], None]


@dataclass(frozen=True)
class Measured:
    """One record: on `cpu`, for `target` on `backend`/`numerics`, `spec` ran fastest."""

    cpu: str
    target: str
    backend: str
    numerics: str
    spec: str
    tokens_per_second: float
    measured_at: str = ""
    tokens: int = 0  # tokens the recorded configuration generated in that run

    def key(self) -> tuple[str, str, str, str]:
        return (self.cpu, self.target, self.backend, self.numerics)


@dataclass(frozen=True)
class DefaultChoice:
    spec: str  # a method spec: NAME[:KEY=VALUE,...]
    reason: str  # one line for --verbose
    measured: bool  # from this machine's record, not the built-in constant


def _stderr(message: str) -> None:
    print(f"draftsman: warning: {message}", file=sys.stderr)


def record_path() -> Path:
    return draftsman_home() / RECORD_FILE


def builtin_default(backend: str) -> str:
    return DEFAULT_METHOD if backend == "llama.cpp" else TORCH_DEFAULT_METHOD


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'speculative:draft=ngram,gamma=auto' -> ('speculative', {'draft': 'ngram', ...}).
    One configuration only (no sweeps); values stay strings for the options parser."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in (s.strip() for s in rest.split(",")):
        if item:
            key, _, value = item.partition("=")
            options[key.strip().replace("-", "_")] = value.strip()
    return name.strip(), options


def read_records(path: Path | None = None, warn: Warn = _stderr) -> list[Measured]:
    """Every record in the file; [] (with a warning) when it is unreadable or malformed."""
    path = path or record_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
        return [Measured(**entry) for entry in data["records"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        warn(f"ignoring {path} ({exc}); the next greedy `draftsman bench` rewrites it")
        return []


def lookup(target: str, backend: str, numerics: str, *, cpu: str | None = None,
           path: Path | None = None, warn: Warn = _stderr) -> Measured | None:
    key = (cpu or cpu_model(), target, backend, numerics)
    return next((r for r in read_records(path, warn) if r.key() == key), None)


TORCH_NUMBER_FORMATS = ("bf16", "fp32", "q4", "q8")  # a torch record's numerics is its dtype


def fastest_here(target: str, numerics: str = "fast", *, cpu: str | None = None,
                 path: Path | None = None, warn: Warn = _stderr) -> Measured | None:
    """This machine's fastest recorded configuration for `target` across backends and torch
    dtypes (what `--backend auto` without --dtype runs, engine.load): torch records in any
    number format, llama.cpp records in the `numerics` mode asked for. Records from runs over
    other prompts compare roughly; `bench --preset cpu` times the same prompts for each."""
    cpu = cpu or cpu_model()
    mine = [r for r in read_records(path, warn)
            if r.cpu == cpu and r.target == target
            and ((r.backend == "torch" and r.numerics in TORCH_NUMBER_FORMATS)
                 or (r.backend == "llama.cpp" and r.numerics == numerics))]
    return max(mine, key=lambda r: r.tokens_per_second, default=None)


def resolve_default(target: str, backend: str, numerics: str, *, cpu: str | None = None,
                    path: Path | None = None, warn: Warn = _stderr) -> DefaultChoice:
    """What `default` stands for on this machine, target, backend and numerics."""
    record = lookup(target, backend, numerics, cpu=cpu, path=path, warn=warn)
    if record is not None:
        when = f" on {record.measured_at}" if record.measured_at else ""
        return DefaultChoice(record.spec, f"measured fastest here by draftsman bench{when} "
                                          f"({record.tokens_per_second:.1f} tok/s)", True)
    return DefaultChoice(builtin_default(backend),
                         f"built-in default for {backend} (no draftsman bench record for "
                         f"{target} on this machine)", False)


def recordable(target: str) -> bool:
    return target in CATALOGUE


def write_record(record: Measured, path: Path | None = None,
                 warn: Warn = _stderr) -> Measured | None:
    """Add `record`, replacing the one with the same key unless that one was measured over
    clearly more tokens (SAME_RUN_SHARE: then it is returned and nothing is written); atomic
    (write, then rename)."""
    path = path or record_path()
    old = read_records(path, warn)
    larger = next((r for r in old
                   if r.key() == record.key() and record.tokens < SAME_RUN_SHARE * r.tokens), None)
    if larger is not None:
        return larger
    records = [r for r in old if r.key() != record.key()]
    records.append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    payload: dict[str, Any] = {"version": VERSION, "records": [asdict(r) for r in records]}
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return None


def measured_now(target: str, backend: str, numerics: str, spec: str,
                 tokens_per_second: float, tokens: int = 0) -> Measured:
    return Measured(cpu_model(), target, backend, numerics, spec, tokens_per_second,
                    time.strftime("%Y-%m-%d"), tokens)


def measured_configuration(target: str, numerics: str, methods: Sequence[tuple[str, Any]],
                           dtype: Any = None, device: Any = "auto") -> Measured | None:
    """This machine's fastest recorded configuration for `target`, when the backend (the
    caller's to check) and the dtype (`dtype` None) are left to `auto` and only the `default`
    method is to run (a named method is run where the rule puts it), on a CPU (the records
    time CPUs): `device` auto or cpu and no CUDA GPU."""
    if dtype is not None or device not in (None, "auto", "cpu"):
        return None
    if any(name != DEFAULT for name, _ in methods) or torch.cuda.is_available():
        return None
    return fastest_here(target, numerics)


def measured_dtype(record: Measured) -> str:
    return record.numerics if record.backend == "torch" else "bf16"


def measured_reason(record: Measured) -> str:
    what = record.backend + (f" {record.numerics}" if record.backend == "torch" else "")
    when = f" on {record.measured_at}" if record.measured_at else ""
    return (f"{what} with {record.spec} measured fastest here by draftsman bench{when} "
            f"({record.tokens_per_second:.1f} tok/s); pass --backend or --dtype to choose")
