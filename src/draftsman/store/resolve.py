"""Turn a model spec into a Hugging Face-style folder (or the GGUF file behind it).

Accepted specs, tried in this order:
- a catalogue name (`smollm2-135m-instruct`): pulled on first use when `pull=True`;
- `hf:owner/name[@revision]`: downloaded with huggingface_hub (needs the Hub);
- a folder containing config.json: used as-is;
- a `.gguf` file: converted once into `$DRAFTSMAN_HOME/models/gguf-<sha256 prefix>/`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from draftsman.errors import (
    DraftsmanError,
    InvalidArgumentError,
    ModelNotFoundError,
    OfflineError,
)
from draftsman.store.catalogue import CATALOGUE, get_entry
from draftsman.store.home import locked, models_dir
from draftsman.store.integrity import sha256_file
from draftsman.store.pull import install_converted, pull_model, require_pulled
from draftsman.store.status import folder_state, model_status

HF_PREFIX = "hf:"
HUB_TIMEOUT_SECONDS = 5.0
# What a causal LM folder needs; skips duplicate weight formats (.bin, .pth, onnx, ...).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


def resolve_model(spec: str, *, pull: bool = True) -> Path:
    """A Hugging Face-style folder (config.json, tokenizer, weights) for `spec`.

    Raises ModelNotFoundError for unknown names, missing paths and catalogue models not
    yet pulled when `pull=False`; OfflineError when an `hf:` spec needs an unreachable Hub.
    """
    spec = spec.strip()
    if spec in CATALOGUE:
        if pull and not model_status(spec).installed:
            pull_model(spec)
        return require_pulled(spec)
    if spec.startswith(HF_PREFIX):
        return _from_hub(spec[len(HF_PREFIX):])
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path}: folder has no config.json (not a model folder)")
        return path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(f"{path}: expected a model folder or a .gguf file")
        return _from_gguf_file(path.resolve())
    raise ModelNotFoundError(_unknown(spec))


def resolve_gguf(spec: str, *, pull: bool = True) -> Path:
    """The GGUF file for `spec`: a catalogue name (pulled if needed) or a `.gguf` path."""
    spec = spec.strip()
    if spec in CATALOGUE:
        status = model_status(spec)
        if not status.has_gguf and pull:
            pull_model(spec)
            status = model_status(spec)
        if not status.has_gguf:
            raise ModelNotFoundError(
                f"the GGUF of {spec} is not pulled; run: draftsman models pull {spec}"
            )
        return status.gguf
    if spec.startswith(HF_PREFIX):
        raise InvalidArgumentError(
            f"{spec}: Hub folders have no GGUF here; pass a catalogue name or a .gguf file"
        )
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve()
    if path.exists():
        raise ModelNotFoundError(f"{path}: not a .gguf file")
    raise ModelNotFoundError(_unknown(spec))


def ensure_model(name: str) -> Path:
    """Installed folder of catalogue model `name`, pulling it first if needed.

    For tests and benchmarks: uses the default store ($DRAFTSMAN_HOME or
    ~/.cache/draftsman), so every test run after the first finds the model in place.
    """
    get_entry(name)  # catalogue names only: a typo must not be read as a path
    return resolve_model(name, pull=True)


def _unknown(spec: str) -> str:
    return (
        f"unknown model {spec!r}: not a catalogue name, an existing folder or .gguf file, "
        f"or hf:owner/name; catalogue models: {', '.join(CATALOGUE)}"
    )


def _from_gguf_file(path: Path) -> Path:
    """Convert a user's GGUF file once; later calls find the folder by the file's hash."""
    sha = sha256_file(path, progress=True, desc=f"hashing {path.name}")
    dest = models_dir() / f"gguf-{sha[:16]}"
    with locked(dest.name):
        if not folder_state(dest, sha).installed:
            print(f"converting {path} into {dest} (once) ...", file=sys.stderr, flush=True)
            install_converted(path, dest, source_sha256=sha, extra={"gguf": str(path)})
    return dest


def _from_hub(repo: str) -> Path:
    """snapshot_download of `owner/name[@revision]`; OfflineError if the Hub is unreachable."""
    repo_id, _, revision = repo.partition("@")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise InvalidArgumentError(f"hf:{repo}: expected hf:owner/name or hf:owner/name@revision")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise DraftsmanError("hf: models need the huggingface_hub package") from None
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                revision=revision or None,
                allow_patterns=_HUB_PATTERNS,
                etag_timeout=HUB_TIMEOUT_SECONDS,
            )
        )
    # Order matters: every huggingface_hub error subclasses OSError.
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as exc:
        raise ModelNotFoundError(f"hf:{repo}: {_first_line(exc)}") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        # Raised when the Hub is unreachable (or offline mode is on) and nothing is cached.
        raise OfflineError(_offline_message(repo_id, exc)) from None
    except HfHubHTTPError as exc:
        raise DraftsmanError(f"hf:{repo}: {_first_line(exc)}") from None
    except Exception as exc:
        if _is_network_error(exc):  # lost the connection halfway through a download
            raise OfflineError(_offline_message(repo_id, exc)) from None
        raise
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"hf:{repo}: the repository has no config.json")
    return folder


def _offline_message(repo_id: str, exc: BaseException) -> str:
    return (
        f"cannot reach the Hugging Face Hub for {repo_id} and it is not cached; copy the "
        f"model folder to this machine and pass its path ({_first_line(exc)})"
    )


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    # huggingface_hub's HTTP client (httpx or its fork) raises TransportError subclasses.
    return any(cls.__name__ == "TransportError" for cls in type(exc).__mro__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def model_has_gguf(spec: str) -> bool:
    """Whether `spec` names a model with a GGUF file (a catalogue model, pulled here if it
    is not yet, or a .gguf path)."""
    if spec in CATALOGUE:
        resolve_model(spec)
        return model_status(spec).has_gguf
    return Path(spec).expanduser().suffix.lower() == ".gguf" and Path(spec).expanduser().is_file()
