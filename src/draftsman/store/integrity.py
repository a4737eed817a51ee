"""Hashes and the converted folder's manifest.

A converted folder is trusted only through `draftsman-manifest.json`, written last: it names
the SHA-256 of the GGUF it came from, the converter version, and the SHA-256 of every other
file in the folder. No manifest, no trust.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from draftsman.errors import IntegrityError

MANIFEST_NAME = "draftsman-manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 8 << 20


def sha256_file(path: Path, *, progress: bool = False, desc: str | None = None) -> str:
    """Hex SHA-256 of a file, read in chunks (never whole in memory)."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with (
        open(path, "rb") as handle,
        tqdm(
            total=size,
            unit="B",
            unit_scale=True,
            desc=desc or f"hashing {path.name}",
            disable=None if progress else True,
            leave=False,
        ) as bar,
    ):
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    """Flush a written file to disk, so a power cut cannot leave a trusted but empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Manifest:
    """What a converted folder claims about itself (see module docstring)."""

    source_sha256: str
    converter_version: str
    dtype: str
    files: dict[str, str]  # relative path -> sha256, every file but the manifest
    source_name: str = ""
    format: int = MANIFEST_FORMAT
    extra: dict[str, object] = field(default_factory=dict)


def write_manifest(
    folder: Path,
    *,
    source_sha256: str,
    converter_version: str,
    dtype: str,
    source_name: str = "",
    extra: dict[str, object] | None = None,
) -> Manifest:
    """Hash every file of `folder` (fsyncing it) and write the manifest, atomically, last."""
    files: dict[str, str] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel == MANIFEST_NAME:
            continue
        fsync_file(path)
        files[rel] = sha256_file(path)
    manifest = Manifest(
        source_sha256=source_sha256,
        converter_version=converter_version,
        dtype=dtype,
        files=files,
        source_name=source_name,
        extra=dict(extra or {}),
    )
    tmp = folder / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n")
    fsync_file(tmp)
    os.replace(tmp, folder / MANIFEST_NAME)
    return manifest


def read_manifest(folder: Path) -> Manifest | None:
    """The folder's manifest, or None when absent or unreadable (then: not installed)."""
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text())
        if data.get("format") != MANIFEST_FORMAT:
            return None
        return Manifest(**data)
    except (OSError, ValueError, TypeError):
        return None


def verify_folder(folder: Path, manifest: Manifest, *, progress: bool = False) -> list[str]:
    """Re-hash the folder against its manifest; returns one line per problem (empty: OK)."""
    problems: list[str] = []
    for rel, expected in sorted(manifest.files.items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif sha256_file(path, progress=progress) != expected:
            problems.append(f"{path}: corrupted (SHA-256 differs from the manifest)")
    listed = set(manifest.files) | {MANIFEST_NAME}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.relative_to(folder).as_posix() not in listed:
            problems.append(f"{path}: not in the manifest")
    return problems


def check_file(path: Path, *, size: int, sha256: str, progress: bool = False) -> None:
    """Raise IntegrityError unless `path` has exactly this size and SHA-256."""
    actual_size = path.stat().st_size
    if actual_size != size:
        raise IntegrityError(f"{path}: {actual_size} bytes, expected {size}")
    actual = sha256_file(path, progress=progress)
    if actual != sha256:
        raise IntegrityError(f"{path}: SHA-256 {actual}, expected {sha256}")
