"""Packed weights kept on disk, so that a q4 / q8 model loads in seconds less the next time.

Packing a GGUF's blocks into the kernels' records, and requantising a draft's other matrices
to Q4_K, takes seconds at every load; reading them back is 2.5-3.2x faster (a fresh process
loads the 1.5B q4 in 1.7 s instead of 4.3 on a 2-core AMX Xeon, the forward level:
bench-results/load-packed-cache). A packed model is a pure function of what it was made
from: the GGUF and the folder's files, the format, the draft's head rows, draftsman's sources
and the kernels' build (sources, flags, CPU), and the `DRAFTSMAN_*` switches that pick
kernels. All of these make an entry's key, so an entry is read back only where packing again
would give the same bytes; anything else packs afresh under a new key.

An entry, `$DRAFTSMAN_HOME/packed/<key>/` (or under `$DRAFTSMAN_PACKED_DIR`):
    records.bin   every large byte buffer (the records), read straight into memory on 2 MiB
                  pages (`draftsman::on_huge_pages`), as packing allocates them
    model.pt      the rest of the model (`torch.save`, those buffers left empty); mapped, not
                  read, so the embeddings' untouched rows never leave the disk
    entry.json    where each buffer lies in records.bin, and the GGUF it was packed from
It is written in a dot-prefixed folder and renamed into place, so a crash leaves no entry that
looks complete; an entry that fails to read is removed and packed again. Processes share
entries without locks: two that pack one model at once both write, the first rename wins.
Entries past `DRAFTSMAN_PACKED_CACHE_GB` gigabytes (default 8) go least recently used first.
`DRAFTSMAN_PACKED_CACHE=0` turns the cache off. Models whose large buffers come to less than
`MIN_BYTES` are not kept: they pack in well under a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from draftsman.errors import IntegrityError, InvalidArgumentError
from draftsman.kernels import native
from draftsman.models.base import DecoderLM
from draftsman.store.home import draftsman_home, partial_prefix

LAYOUT = 1  # bump when an entry's files change meaning
MIN_BYTES = 64 << 20
BUFFER_BYTES = 2 << 20  # byte buffers from this size go to records.bin (huge pages on load)
OFF_ENV, BUDGET_ENV = "DRAFTSMAN_PACKED_CACHE", "DRAFTSMAN_PACKED_CACHE_GB"
DIR_ENV = "DRAFTSMAN_PACKED_DIR"
DEFAULT_BUDGET_GB = 8.0
STALE_PARTIAL_S = 3600  # a partial entry this old has lost its writer
# switches that say where files go, not what a packed model holds
_NOT_IN_KEY = frozenset({"DRAFTSMAN_HOME", "DRAFTSMAN_PROFILES", OFF_ENV, BUDGET_ENV, DIR_ENV})


def packed_dir() -> Path:
    """$DRAFTSMAN_PACKED_DIR, else $DRAFTSMAN_HOME/packed (read on every call)."""
    value = os.environ.get(DIR_ENV)
    return Path(value).expanduser() if value else draftsman_home() / "packed"


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "1") != "0" and native.kquant_available()


def load_or_pack(folder: Path, gguf: Path, kind: str, max_positions: int | None,
                 head_rows: torch.Tensor | None, pack: Callable[[], DecoderLM]) -> DecoderLM:
    """The model `pack()` builds from `gguf` and `folder`, read from its entry when one
    exists, else packed and (when large enough) kept. Sets `model.packed_entry` (the entry
    it was read from or written to, None when not kept) and `model.packed_note` (which, in
    words, for --verbose)."""
    if not enabled():
        return _tagged(pack(), None, f"packed at load ({OFF_ENV}=0 or no kernels)")
    budget = budget_bytes()  # a bad setting stops here, before seconds of packing
    key = entry_key(folder, gguf, kind, max_positions, head_rows)
    entry = packed_dir() / key
    if entry.is_dir():
        try:
            model = read_entry(entry)
            with contextlib.suppress(OSError):  # a read-only cache is still read
                os.utime(entry)  # most recently used
            return _tagged(model, entry, f"read from {entry}")
        except Exception as exc:  # damaged, or evicted while read: pack afresh
            print(f"draftsman: packed weights in {entry} unreadable ({exc}); packing again",
                  file=sys.stderr)
            shutil.rmtree(entry, ignore_errors=True)
    model = pack()
    if _large_bytes(model) < MIN_BYTES:
        return _tagged(model, None, f"packed at load (under {MIN_BYTES >> 20} MiB: not kept)")
    if not write_entry(model, entry, gguf):
        return _tagged(model, None, "packed at load (not kept: see the line above)")
    evict(budget, keep=entry)
    return _tagged(model, entry, f"packed at load, kept in {entry}")


def _tagged(model: DecoderLM, entry: Path | None, note: str) -> DecoderLM:
    model.packed_entry, model.packed_note = entry, note
    return model


def entry_key(folder: Path, gguf: Path, kind: str, max_positions: int | None,
              head_rows: torch.Tensor | None) -> str:
    """24 hex digits naming what a packed model was made from (see the module docstring)."""
    files = [Path(gguf), *sorted(folder.glob("*.json")), *sorted(folder.glob("*.safetensors"))]
    facts = {
        "layout": LAYOUT,
        "sources": sources_digest(),
        "kernels": native.build_key(),
        "torch": torch.__version__,
        "kind": kind,
        "max_positions": max_positions,
        "head_rows": None if head_rows is None else hashlib.sha256(
            head_rows.cpu().contiguous().numpy().tobytes()).hexdigest(),
        "files": [_file_facts(f) for f in files],
        "switches": {k: v for k, v in sorted(os.environ.items())
                     if k.startswith("DRAFTSMAN_") and k not in _NOT_IN_KEY},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _file_facts(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


@cache
def sources_digest() -> str:
    """A digest of draftsman's Python sources: a pickled model names their classes, so an
    entry is read back only by the code that wrote it."""
    root = Path(__file__).parents[1]  # the draftsman package
    h = hashlib.sha256()
    for src in sorted(root.rglob("*.py")):
        h.update(str(src.relative_to(root)).encode() + b"\0" + src.read_bytes())
    return h.hexdigest()


def _large_buffers(model: DecoderLM) -> list[tuple[str, str, torch.Tensor]]:
    """(module name, buffer name, tensor) of every contiguous byte buffer of BUFFER_BYTES
    or more: the records, as the packing ops made them."""
    return [(m_name, b_name, t) for m_name, module in model.named_modules()
            for b_name, t in module.named_buffers(recurse=False)
            if t.dtype == torch.uint8 and t.is_contiguous() and t.numel() >= BUFFER_BYTES]


def _large_bytes(model: DecoderLM) -> int:
    return sum(t.numel() for *_, t in _large_buffers(model))


def write_entry(model: DecoderLM, entry: Path, gguf: Path) -> bool:
    """Keep `model` at `entry`; False (with one line on stderr) where it cannot be written:
    the model is still returned to its caller unchanged."""
    tmp = entry.parent / f"{partial_prefix(entry)}{os.getpid()}"
    big = _large_buffers(model)
    try:
        if len({t.data_ptr() for *_, t in big}) < len(big):
            raise ValueError("two modules share a packed buffer")  # would be read back twice
        tmp.mkdir(parents=True, exist_ok=True)
        places, offset = [], 0
        with open(tmp / "records.bin", "wb") as f:
            for m_name, b_name, t in big:
                f.write(memoryview(t.numpy()).cast("B"))
                places.append({"module": m_name, "buffer": b_name, "shape": list(t.shape),
                               "offset": offset, "bytes": t.numel()})
                offset += t.numel()
        for m_name, b_name, _ in big:  # saved empty: their bytes are in records.bin
            model.get_submodule(m_name)._buffers[b_name] = torch.empty(0, dtype=torch.uint8)
        try:
            torch.save(model, tmp / "model.pt")
        finally:
            for m_name, b_name, t in big:
                model.get_submodule(m_name)._buffers[b_name] = t
        (tmp / "entry.json").write_text(json.dumps(
            {"layout": LAYOUT, "gguf": str(gguf.resolve()), "buffers": places}))
        if entry.is_dir():  # another process kept the same bytes first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(entry)
        return True
    except Exception as exc:  # a full disk, a read-only home, a model that will not pickle
        print(f"draftsman: not keeping packed weights in {entry.parent} ({exc})",
              file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def read_entry(entry: Path) -> DecoderLM:
    """The model kept at `entry`, its records read into memory on huge pages."""
    meta = json.loads((entry / "entry.json").read_text())
    if meta.get("layout") != LAYOUT:
        raise IntegrityError(f"layout {meta.get('layout')}, not {LAYOUT}")
    # a full pickle (the modules, not only tensors): written by write_entry under the
    # user's own home, as the kernels' library next to it is built there
    model = torch.load(entry / "model.pt", mmap=True, weights_only=False)
    with open(entry / "records.bin", "rb") as f:
        for place in meta["buffers"]:
            t = torch.ops.draftsman.on_huge_pages(1, place["bytes"], False)
            f.seek(place["offset"])
            if f.readinto(memoryview(t.numpy()).cast("B")) != place["bytes"]:
                raise IntegrityError("records.bin is shorter than entry.json says")
            module = model.get_submodule(place["module"])
            module._buffers[place["buffer"]] = t.view(place["shape"])
    return model


def budget_bytes() -> float:
    """The entries' budget in bytes ($DRAFTSMAN_PACKED_CACHE_GB, default 8)."""
    value = os.environ.get(BUDGET_ENV, str(DEFAULT_BUDGET_GB))
    try:
        return float(value) * 1e9
    except ValueError:
        raise InvalidArgumentError(f"{BUDGET_ENV}={value!r}: not a number of gigabytes") from None


def entries() -> dict[Path, tuple[float, int]]:
    """Each complete entry: (last use, bytes). One removed meanwhile by another process is
    left out."""
    found: dict[Path, tuple[float, int]] = {}
    if packed_dir().is_dir():
        for e in packed_dir().iterdir():
            if not e.name.startswith("."):
                with contextlib.suppress(OSError):
                    found[e] = (e.stat().st_mtime, sum(f.stat().st_size for f in e.iterdir()))
    return found


def evict(budget: float, keep: Path) -> None:
    """Remove entries, least recently used first, until they fit `budget` bytes (`keep`, the
    entry just written, stays), and partial entries a crashed writer left an hour ago.
    Another process may be evicting too: an entry gone meanwhile counts as removed."""
    for e in packed_dir().glob(".*"):
        with contextlib.suppress(OSError):
            if time.time() - e.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(e, ignore_errors=True)
    kept = entries()
    total = sum(size for _, size in kept.values())
    for e, (_, size) in sorted(kept.items(), key=lambda item: item[1][0]):
        if total <= budget:
            break
        if e != keep:
            shutil.rmtree(e, ignore_errors=True)
            total -= size


def remove_entries(gguf: Path) -> int:
    """Delete the entries packed from `gguf` (`draftsman models rm`); how many there were."""
    removed = 0
    if packed_dir().is_dir():
        for e in packed_dir().iterdir():
            try:
                source = json.loads((e / "entry.json").read_text()).get("gguf")
            except (OSError, ValueError):
                continue
            if source == str(Path(gguf).resolve()):
                shutil.rmtree(e, ignore_errors=True)
                removed += 1
    return removed
