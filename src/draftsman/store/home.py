"""Where the store keeps files: `$DRAFTSMAN_HOME` (default `~/.cache/draftsman`).

Layout:
    gguf/<name>.gguf        assembled, hash-checked GGUF (kept: the llama.cpp backend loads it)
    models/<name>/          converted Hugging Face-style folder, with draftsman-manifest.json
    tmp/                    downloads in progress (removed after each pull)
    locks/<name>.lock       one pull of a given model at a time, across processes
    packed/<key>/           q4 / q8 weights as the kernels take them, kept after the first
                            load (models/packed_cache.py; least recently used go past 8 GB)

Files appear under gguf/ and models/ only by atomic rename of a completed, verified file or
folder, so a crash leaves at most litter in tmp/ or a dot-prefixed partial, never a file
that looks installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

HOME_ENV = "DRAFTSMAN_HOME"


def draftsman_home() -> Path:
    """The store's root; read from the environment on every call (tests switch it)."""
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "draftsman"


def gguf_dir() -> Path:
    return draftsman_home() / "gguf"


def models_dir() -> Path:
    return draftsman_home() / "models"


def tmp_dir() -> Path:
    return draftsman_home() / "tmp"


def gguf_path(name: str) -> Path:
    return gguf_dir() / f"{name}.gguf"


def model_dir(name: str) -> Path:
    return models_dir() / name


def partial_prefix(dest: Path) -> str:
    """Name prefix of work-in-progress siblings of `dest` (dot-prefixed: never listed)."""
    return f".{dest.name}.partial-"


def clean_partials(dest: Path) -> None:
    """Remove partial siblings of `dest` left by an interrupted run (call under the lock)."""
    if not dest.parent.is_dir():
        return
    for stale in dest.parent.glob(partial_prefix(dest) + "*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(key: str, *, log=None) -> Iterator[None]:
    """Hold an exclusive advisory lock named `key` under the home (blocks until free).

    Several test processes and CLI runs share one home; without this two concurrent pulls
    of one model would race on the same temporary and final paths.
    """
    lock_dir = draftsman_home() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{key}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            (log or _stderr)(f"waiting for another draftsman process working on {key} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
