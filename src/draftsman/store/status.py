"""What is installed in the store, and whether it can be trusted.

A converted folder is *installed* when its manifest exists, names the expected source GGUF
hash and was written by the current converter version. Hashes of the folder's files are
not recomputed here (that is `verify`, seconds per GB); the atomic install guarantees they
were right when the manifest was written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftsman.errors import IntegrityError, ModelNotFoundError
from draftsman.store.catalogue import get_entry
from draftsman.store.home import gguf_path, model_dir
from draftsman.store.integrity import Manifest, check_file, read_manifest, verify_folder

# Version of convert.py's output. Bump it when that output changes: folders converted by
# another version are then stale, and a pull converts again from the kept GGUF (no
# download). Lives here, not in convert.py, so that `models list` does not import torch.
CONVERTER_VERSION = "1"


@dataclass(frozen=True)
class FolderState:
    installed: bool
    reason: str  # why not installed ("" when installed)
    manifest: Manifest | None


def folder_state(folder: Path, source_sha256: str) -> FolderState:
    """Is `folder` a complete conversion of the GGUF with this hash, by this converter?"""
    if not folder.is_dir():
        return FolderState(False, "not converted", None)
    manifest = read_manifest(folder)
    if manifest is None:
        return FolderState(False, "incomplete (no manifest)", None)
    if manifest.source_sha256 != source_sha256:
        return FolderState(False, "converted from another GGUF", manifest)
    if manifest.converter_version != CONVERTER_VERSION:
        return FolderState(False, f"stale (converter v{manifest.converter_version})", manifest)
    return FolderState(True, "", manifest)


@dataclass(frozen=True)
class ModelStatus:
    name: str
    gguf: Path
    folder: Path
    has_gguf: bool
    folder_state: FolderState

    @property
    def installed(self) -> bool:
        """The converted folder can be loaded (the GGUF may still be missing)."""
        return self.folder_state.installed

    @property
    def complete(self) -> bool:
        """Both the GGUF and the converted folder are in place: a pull has nothing to do."""
        return self.has_gguf and self.installed

    def describe(self) -> str:
        if self.complete:
            return "pulled"
        if self.installed:
            return "pulled (GGUF missing)"
        if self.has_gguf:
            return f"GGUF only, folder {self.folder_state.reason}"
        return "not pulled"


def model_status(name: str) -> ModelStatus:
    entry = get_entry(name)
    folder = model_dir(name)
    return ModelStatus(
        name=name,
        gguf=gguf_path(name),
        folder=folder,
        has_gguf=gguf_path(name).is_file(),
        folder_state=folder_state(folder, entry.sha256),
    )


def verify_model(name: str, *, progress: bool = False) -> list[str]:
    """Re-hash the GGUF against the catalogue and the folder against its manifest.

    Returns one line per problem (empty: all good). ModelNotFoundError if nothing is pulled.
    """
    entry = get_entry(name)
    status = model_status(name)
    if not status.has_gguf and not status.folder.exists():
        raise ModelNotFoundError(f"{name} is not pulled (run: draftsman models pull {name})")
    problems: list[str] = []
    if status.has_gguf:
        try:
            check_file(status.gguf, size=entry.size, sha256=entry.sha256, progress=progress)
        except IntegrityError as exc:
            problems.append(f"{exc} (corrupted)")
    else:
        problems.append(f"{status.gguf}: missing")
    state = status.folder_state
    if state.manifest is None:
        problems.append(f"{status.folder}: {state.reason}")
    else:
        if not state.installed:
            problems.append(f"{status.folder}: {state.reason}")
        problems.extend(verify_folder(status.folder, state.manifest, progress=progress))
    return problems
