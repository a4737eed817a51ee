"""The append-only `results.jsonl` of a benchmark folder, and the environment each row carries.

Invariants:
- One JSON object per line, one line per prompt x turn x method x repeat; rows are only ever
  appended, each flushed and fsynced as soon as it is measured, so a crash loses at most the
  row being written.
- A line cut short by a crash is skipped when reading (and never glued to the next row: an
  append first terminates an unterminated last line).
- `row_key` identifies a measurement; `--resume` skips keys already present, and refuses a
  folder whose rows were measured with different `settings` or on another `machine`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

import draftsman
from draftsman.errors import InvalidArgumentError
from draftsman.hardware import cpu_flags, cpu_model

RESULTS = "results.jsonl"

Row = dict[str, Any]


def row_key(row: Row) -> tuple[str, str, int]:
    return (row["prompt_key"], row["label"], int(row["repeat"]))


class ResultsFile:
    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / RESULTS
        self.skipped_lines = 0

    def exists(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def rows(self) -> list[Row]:
        if not self.path.is_file():
            return []
        out: list[Row] = []
        self.skipped_lines = 0
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    self.skipped_lines += 1  # a row cut short by a crash
                    continue
                if isinstance(row, dict) and "label" in row:
                    out.append(row)
        return out

    def append(self, row: Row) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(_finite(row), ensure_ascii=False, allow_nan=False,
                          default=_jsonable)
        with open(self.path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(line.encode("utf-8") + b"\n")
            f.flush()
            os.fsync(f.fileno())


RUN_LOG = "run.json"


def record_invocation(folder: Path, config: dict[str, Any]) -> None:
    """Keep every invocation's configuration (first run and resumes) in run.json."""
    path = Path(folder) / RUN_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        runs = json.loads(path.read_text()) if path.is_file() else []
    except json.JSONDecodeError:
        runs = []
    runs.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **_finite(config)})
    path.write_text(json.dumps(runs, indent=1, default=_jsonable), encoding="utf-8")


def invocations(folder: Path) -> list[dict[str, Any]]:
    path = Path(folder) / RUN_LOG
    try:
        return json.loads(path.read_text()) if path.is_file() else []
    except json.JSONDecodeError:
        return []


def _finite(value: Any) -> Any:
    """NaN and infinities become null: JSON has no spelling for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: object) -> object:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in results.jsonl")


def check_settings(rows: Iterable[Row], settings: dict[str, Any], folder: Path) -> None:
    """Refuse to mix rows measured under different settings in one folder."""
    for row in rows:
        old = row.get("settings")
        if old != settings:
            diff = sorted(k for k in set(old or {}) | set(settings)
                          if (old or {}).get(k) != settings.get(k))
            raise InvalidArgumentError(
                f"{folder} holds rows measured with other settings ({', '.join(diff)}); "
                "resume with the same options or choose another --out")


MACHINE = ("cpu", "isa", "cores", "gpu", "torch")  # what sets a row's timings beyond its settings


def check_machine(rows: Iterable[Row], machine: dict[str, Any], folder: Path) -> None:
    """Refuse to resume on another machine: times (and the ratios a table averages over
    prompts) from two CPUs do not compare. Keys a row lacks (older rows) are not compared."""
    for row in rows:
        old = row.get("env") or {}
        diff = [k for k in MACHINE if k in old and k in machine and old[k] != machine[k]]
        if diff:
            said = "; ".join(f"{k} {old[k]!r} there, {machine[k]!r} here" for k in diff)
            raise InvalidArgumentError(
                f"{folder} holds rows timed on another machine ({said}); times from two "
                "machines do not compare: measure into another --out")


# ----------------------------------------------------------------------------- environment


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_isa() -> str:
    """The vector extensions that set decode speed here (bf16 and int8 matmul kernels)."""
    flags = cpu_flags()
    if not flags:
        return "unknown"
    return " ".join(x for x in ISA_FLAGS if x in flags) or "none"


def machine() -> dict[str, Any]:
    """Where a row was timed, and how the llama.cpp its llama.cpp contestants ran was built
    (flags, AMX kernels, repacked weights: llama_cpp.describe_build)."""
    from draftsman.backends.llama_cpp import describe_build

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "isa": cpu_isa(), "cores": os.cpu_count(), "gpu": gpu,
            "torch": torch.__version__, "llama_cpp": describe_build()}


COMMIT_VARIABLE = "DRAFTSMAN_COMMIT"


def git_commit() -> str | None:
    """The draftsman checkout's commit (with '+dirty' when it has local changes), if any.

    `DRAFTSMAN_COMMIT` in the environment names it instead, for a copy of a tree whose git
    does not hold its commit: a lent GPU machine gets the session's first commit with the
    tree on top, which git there calls that commit `+dirty`."""
    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment(dtype: str, numerics: str = "fast") -> dict[str, Any]:
    import transformers

    return {
        **machine(),
        "threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "dtype": dtype,
        "numerics": numerics,
        "draftsman": getattr(draftsman, "__version__", None),
        "git_commit": git_commit(),
    }


# ----------------------------------------------------------------------------- memory


def reset_peak_rss() -> None:
    """Reset the kernel's resident-set high-water mark (Linux >= 4.0); no-op elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float | None:
    """Peak resident memory since the last reset (VmHWM), else the process-lifetime peak."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except (ImportError, OSError):
        return None
