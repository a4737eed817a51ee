"""Offline install: `models pull --from-gguf FILE NAME` and the split/join scripts.

A test-only catalogue entry pins a small random file, so the checks run without a real
model; the conversion is stubbed where only the install path is under test (the real
conversion of a pulled GGUF is the `real` test at the end).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftsman.cli.main import main
from draftsman.store import convert as convert_module
from draftsman.store.catalogue import CATALOGUE, CatalogueEntry, Package
from draftsman.store.home import HOME_ENV
from draftsman.store.integrity import MANIFEST_NAME
from draftsman.store.status import model_status

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
FAKE = "fake-offline-model"


def _listing(home: Path) -> list[str]:
    return sorted(p.relative_to(home).as_posix() for sub in ("gguf", "models", "tmp")
                  for p in (home / sub).rglob("*") if p.is_file())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[Path]]:
    """(home, a GGUF-like file pinned by a test-only catalogue entry, conversion calls)."""
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    blob = b"GGUF" + os.urandom(300_000)
    source = tmp_path / "offline copy.gguf"
    source.write_bytes(blob)
    monkeypatch.setitem(CATALOGUE, FAKE, CatalogueEntry(
        name=FAKE, description="test only", packages=(Package("no-such-wheel", "0"),),
        member_pattern=r"x", size=len(blob), sha256=hashlib.sha256(blob).hexdigest(),
        n_layers=1, role="small"))
    calls: list[Path] = []

    def fake_convert(gguf_path, out_dir, dtype=None, **kwargs):
        calls.append(Path(gguf_path))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "config.json").write_text('{"converted": true}')

    monkeypatch.setattr(convert_module, "convert_gguf", fake_convert)
    return home, source, calls


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_from_gguf_installs_after_the_hash_check(fake, capsys) -> None:
    home, source, calls = fake
    assert main(["models", "pull", "--from-gguf", str(source), FAKE]) == 0
    gguf = home / "gguf" / f"{FAKE}.gguf"
    assert gguf.read_bytes() == source.read_bytes()
    assert calls == [gguf]  # converted from the verified copy in the store
    assert _listing(home) == [f"gguf/{FAKE}.gguf", f"models/{FAKE}/config.json",
                              f"models/{FAKE}/{MANIFEST_NAME}"]
    status = model_status(FAKE)
    assert status.complete and status.describe() == "pulled"
    assert "pulled (import" in capsys.readouterr().err
    # Again: the file is checked again, nothing is converted again.
    assert main(["models", "pull", "--from-gguf", str(source), FAKE]) == 0
    assert len(calls) == 1


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_from_gguf_refuses_a_wrong_file(fake, capsys, damage: str) -> None:
    home, source, calls = fake
    expected = CATALOGUE[FAKE].sha256
    if damage == "flip":
        _flip_byte(source, 1000)
    else:
        source.write_bytes(source.read_bytes()[:-1])
    assert main(["models", "pull", "--from-gguf", str(source), FAKE]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith("draftsman: error: ")
    assert "nothing installed" in err[0]
    if damage == "flip":
        got = hashlib.sha256(source.read_bytes()).hexdigest()
        assert f"expected {expected}, got {got}" in err[0]
    else:
        assert f"expected {CATALOGUE[FAKE].size}" in err[0]
    assert _listing(home) == [] and calls == []  # no partial file either
    assert not model_status(FAKE).has_gguf


def test_from_gguf_wrong_file_keeps_an_installed_model(fake) -> None:
    home, source, calls = fake
    assert main(["models", "pull", "--from-gguf", str(source), FAKE]) == 0
    before = _listing(home)
    bad = source.with_name("bad.gguf")
    shutil.copy(source, bad)
    _flip_byte(bad, 5)
    assert main(["models", "pull", "--from-gguf", str(bad), FAKE, "--force"]) == 2
    assert _listing(home) == before
    assert (home / "gguf" / f"{FAKE}.gguf").read_bytes() == source.read_bytes()


def test_from_gguf_bad_arguments(fake, capsys) -> None:
    home, source, _ = fake
    assert main(["models", "pull", "--from-gguf", str(source), "no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0]
    assert all(name in err[0] for name in CATALOGUE)  # lists what exists
    assert main(["models", "pull", "--from-gguf", str(source), FAKE, FAKE]) == 2
    assert "exactly one NAME" in capsys.readouterr().err
    assert main(["models", "pull", "--from-gguf", str(source.with_name("none.gguf")),
                 FAKE]) == 2
    assert "no such file" in capsys.readouterr().err
    assert _listing(home) == []


# ------------------------------------------------------------------ split / join scripts


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True,
                          text=True)


@pytest.mark.parametrize("size", [250_000, 300_000, 1])
def test_split_join_round_trip(tmp_path: Path, size: int) -> None:
    blob = os.urandom(size)
    original = tmp_path / "model.gguf"
    original.write_bytes(blob)
    done = _script("split_gguf.py", str(original), "100000", "--out-dir", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "p" / "model.gguf.parts.json").read_text())
    parts = sorted((tmp_path / "p").glob("model.gguf.part*[0-9]"))
    assert [p.name for p in parts] == [p["name"] for p in manifest["parts"]]
    assert [p.stat().st_size for p in parts] == [min(100_000, size - i * 100_000)
                                                 for i in range(len(parts))]
    assert manifest["sha256"] == hashlib.sha256(blob).hexdigest()
    assert all(p["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
               for p, path in zip(manifest["parts"], parts, strict=True))
    # `cat` works too; the script checks as it joins
    assert b"".join(p.read_bytes() for p in parts) == blob
    done = _script("join_gguf.py", str(tmp_path / "p" / "model.gguf.parts.json"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "p" / "model.gguf").read_bytes() == blob


def test_join_detects_a_corrupted_or_missing_part(tmp_path: Path) -> None:
    original = tmp_path / "model.gguf"
    original.write_bytes(os.urandom(250_000))
    assert _script("split_gguf.py", str(original), "100K", "--out-dir",
                   str(tmp_path / "p")).returncode == 0
    manifest = tmp_path / "p" / "model.gguf.parts.json"
    part = tmp_path / "p" / "model.gguf.part001"
    _flip_byte(part, 77)
    done = _script("join_gguf.py", str(manifest))
    assert done.returncode == 2
    assert "model.gguf.part001: corrupted part" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "model.gguf.part000", "model.gguf.part001", "model.gguf.part002",
        "model.gguf.parts.json"]  # no output, no partial
    _flip_byte(part, 77)
    (tmp_path / "p" / "model.gguf.part002").unlink()
    done = _script("join_gguf.py", str(manifest))
    assert done.returncode == 2 and "part002: missing part" in done.stderr
    assert not (tmp_path / "p" / "model.gguf").exists()


def test_split_refuses_bad_sizes_and_old_splits(tmp_path: Path) -> None:
    original = tmp_path / "model.gguf"
    original.write_bytes(b"x" * 10)
    for size in ("0", "-5", "12Q", "M"):
        done = _script("split_gguf.py", str(original), size)
        assert done.returncode == 2 and "PART_SIZE" in done.stderr
    assert _script("split_gguf.py", str(original), "4").returncode == 0
    done = _script("split_gguf.py", str(original), "4")
    assert done.returncode == 2 and "already exists" in done.stderr


# --------------------------------------------------------------------- a real GGUF, offline


@pytest.mark.real
@pytest.mark.slow
def test_from_gguf_real_smollm2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pulled SmolLM2 GGUF, split, joined and installed into an empty home: the same
    converted folder a download gives (the manifest names the pinned hash)."""
    from draftsman.store.resolve import resolve_gguf

    name = "smollm2-135m-instruct"
    pulled = resolve_gguf(name)  # the shared home: read only
    assert _script("split_gguf.py", str(pulled), "40M", "--out-dir",
                   str(tmp_path / "p")).returncode == 0
    done = _script("join_gguf.py", str(tmp_path / "p" / f"{name}.gguf.parts.json"))
    assert done.returncode == 0, done.stderr
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    assert main(["models", "pull", "--from-gguf", str(tmp_path / "p" / f"{name}.gguf"),
                 name]) == 0
    status = model_status(name)
    assert status.complete
    manifest = json.loads((home / "models" / name / MANIFEST_NAME).read_text())
    assert manifest["source_sha256"] == CATALOGUE[name].sha256
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
