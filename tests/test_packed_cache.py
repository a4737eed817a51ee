"""Packed weights kept on disk (models/packed_cache.py): a second load reads the entry and
gives the same model, bit for bit; anything the packing depends on changes the key; a damaged
entry, an unwritable home or the off switch never stop a load; the budget evicts the least
recently used entries.

Tiny random models (the GGUF fixture of test_quant_loader) are far under MIN_BYTES, so these
tests lower it, and BUFFER_BYTES, to keep them and to send their records through records.bin.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from test_quant_loader import saved  # noqa: F401  (the fixture)

import draftsman.models.loader as loader
import draftsman.models.packed_cache as packed_cache
from draftsman.errors import InvalidArgumentError
from draftsman.kernels.native import kquant_available
from draftsman.models.loader import load_model
from draftsman.models.packed_cache import entry_key, evict

pytestmark = pytest.mark.skipif(not kquant_available(), reason="the K-quant kernels do not build")

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The entries' folder under tmp_path (not the home: the kernels' library lives there)."""
    monkeypatch.setenv(packed_cache.DIR_ENV, str(tmp_path / "home" / "packed"))
    monkeypatch.delenv(packed_cache.OFF_ENV, raising=False)
    monkeypatch.setattr(packed_cache, "MIN_BYTES", 0)
    monkeypatch.setattr(packed_cache, "BUFFER_BYTES", 64)
    return tmp_path / "home"


def logits(model) -> torch.Tensor:
    return model(IDS, torch.arange(IDS.shape[1])[None], model.new_cache(8)).logits


def packs(monkeypatch) -> list[int]:
    """Counts the packings `load_model` runs (the entry's reads are not packings)."""
    calls: list[int] = []
    real = loader._quantized_from_blocks

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "_quantized_from_blocks", spy)
    return calls


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_a_second_load_reads_the_entry_bit_for_bit(saved, home, kind, monkeypatch):  # noqa: F811
    _, _, folder, path = saved
    calls = packs(monkeypatch)
    first = load_model(folder, kind, gguf=path)
    entry = first.packed_entry
    assert entry is not None and entry.parent == packed_cache.packed_dir() and calls == [1]
    assert {f.name for f in entry.iterdir()} == {"records.bin", "model.pt", "entry.json"}
    assert (entry / "records.bin").stat().st_size > 0  # the records went through it
    again = load_model(folder, kind, gguf=path)
    assert calls == [1] and again.packed_entry == entry
    assert again.packed_note == f"read from {entry}"
    assert again.quant_summary == first.quant_summary
    a, b = first.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert torch.equal(logits(first), logits(again))


def test_what_the_packing_depends_on_changes_the_key(saved, home, monkeypatch):  # noqa: F811
    _, _, folder, path = saved
    key = entry_key(folder, path, "q4", None, None)
    assert entry_key(folder, path, "q8", None, None) != key
    assert entry_key(folder, path, "q4", 64, None) != key
    assert entry_key(folder, path, "q4", None, torch.arange(5)) != key
    monkeypatch.setenv("DRAFTSMAN_KQUANT_AMX", "0")  # a kernel switch
    assert entry_key(folder, path, "q4", None, None) != key
    monkeypatch.delenv("DRAFTSMAN_KQUANT_AMX")
    monkeypatch.setenv("DRAFTSMAN_PROFILES", "/elsewhere")  # where files go: not in the key
    assert entry_key(folder, path, "q4", None, None) == key
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new GGUF
    assert entry_key(folder, path, "q4", None, None) != key


def test_a_rewritten_gguf_is_packed_again(saved, home, monkeypatch):  # noqa: F811
    _, _, folder, path = saved
    calls = packs(monkeypatch)
    first = load_model(folder, "q4", gguf=path).packed_entry
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = load_model(folder, "q4", gguf=path).packed_entry
    assert calls == [1, 1] and second != first and second.is_dir()


def test_a_damaged_entry_is_packed_again(saved, home, monkeypatch, capsys):  # noqa: F811
    _, _, folder, path = saved
    want = load_model(folder, "q4", gguf=path)
    records = want.packed_entry / "records.bin"
    size = records.stat().st_size
    with open(records, "r+b") as f:
        f.truncate(size // 2)
    calls = packs(monkeypatch)
    got = load_model(folder, "q4", gguf=path)
    assert calls == [1] and "unreadable" in capsys.readouterr().err
    assert records.stat().st_size == size  # kept whole again
    assert torch.equal(logits(got), logits(want))


def test_the_off_switch_and_small_models_keep_nothing(saved, home, monkeypatch):  # noqa: F811
    _, _, folder, path = saved
    monkeypatch.setenv(packed_cache.OFF_ENV, "0")
    model = load_model(folder, "q4", gguf=path)
    assert model.packed_entry is None and not packed_cache.packed_dir().exists()
    monkeypatch.delenv(packed_cache.OFF_ENV)
    monkeypatch.setattr(packed_cache, "MIN_BYTES", 1 << 40)
    model = load_model(folder, "q4", gguf=path)
    assert model.packed_entry is None and "not kept" in model.packed_note
    assert not packed_cache.packed_dir().exists()


def test_an_unwritable_home_still_loads(saved, home, capsys):  # noqa: F811
    _, _, folder, path = saved
    home.mkdir(parents=True)
    (home / "packed").write_text("a file where the folder should be")
    model = load_model(folder, "q4", gguf=path)
    assert model.packed_entry is None
    assert "not keeping packed weights" in capsys.readouterr().err
    assert torch.isfinite(logits(model)).all()


def test_eviction_keeps_the_most_recently_used_within_the_budget(home, monkeypatch):
    root = packed_cache.packed_dir()
    now = time.time()
    for age, name in enumerate(["newest", "middle", "oldest"]):
        (root / name).mkdir(parents=True)
        (root / name / "records.bin").write_bytes(b"x" * 1000)
        os.utime(root / name, (now - 100 * age, now - 100 * age))
    stale, fresh = root / ".x.partial-1", root / ".y.partial-2"
    for partial, age in [(stale, 2 * packed_cache.STALE_PARTIAL_S), (fresh, 1)]:
        partial.mkdir()
        os.utime(partial, (now - age, now - age))
    monkeypatch.setenv(packed_cache.BUDGET_ENV, str(2500 / 1e9))
    evict(packed_cache.budget_bytes(), keep=root / "oldest")  # just written: stays
    assert sorted(p.name for p in root.iterdir()) == [".y.partial-2", "newest", "oldest"]


def test_a_bad_budget_stops_before_packing(saved, home, monkeypatch):  # noqa: F811
    _, _, folder, path = saved
    calls = packs(monkeypatch)
    monkeypatch.setenv(packed_cache.BUDGET_ENV, "lots")
    with pytest.raises(InvalidArgumentError, match="not a number of gigabytes"):
        load_model(folder, "q4", gguf=path)
    assert calls == []


def test_shared_buffers_are_not_kept(saved, home, capsys):  # noqa: F811
    _, _, folder, path = saved
    model = load_model(folder, "q4", gguf=path, max_positions=64)
    (*_, t), (m_name, b_name, _), *_ = packed_cache._large_buffers(model)
    model.get_submodule(m_name)._buffers[b_name] = t  # two modules, one buffer
    assert not packed_cache.write_entry(model, packed_cache.packed_dir() / "x", path)
    assert "share a packed buffer" in capsys.readouterr().err


def test_records_are_read_into_fresh_pages():
    zeroed = torch.ops.draftsman.on_huge_pages(2, 3 << 20, True)
    assert zeroed.shape == (2, 3 << 20) and zeroed.dtype == torch.uint8
    assert not zeroed.any()
    small = torch.ops.draftsman.on_huge_pages(3, 5, False)  # under 2 MiB: plain pages
    assert small.shape == (3, 5)


def test_models_rm_removes_the_entries_of_its_gguf(saved, home, tmp_path):  # noqa: F811
    _, _, folder, path = saved
    mine = load_model(folder, "q4", gguf=path).packed_entry
    from draftsman.cli.models_cmd import packed_usage

    assert packed_usage().startswith("packed weights: 1 entry, 0.0 of 8 GB in ")
    other = packed_cache.packed_dir() / "other"
    other.mkdir()
    (other / "entry.json").write_text('{"gguf": "/somewhere/else.gguf"}')
    assert packed_cache.remove_entries(tmp_path / "missing.gguf") == 0
    assert packed_cache.remove_entries(path) == 1
    assert not mine.exists() and other.is_dir()
