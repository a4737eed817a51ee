"""Where the K-quant records switch from vectors to AMX tiles: chosen from measurements
(kernels/tile_rows.py). The bits do not depend on it (test_kquant_kernel.py)."""

import json

import pytest

from draftsman.errors import InvalidArgumentError
from draftsman.kernels import tile_rows as tr
from draftsman.kernels.block_types import GGMLType
from draftsman.kernels.native import kquant_amx


def crossing(tiles_faster_at: set[int]) -> tr.Crossing:
    vectors = {r: 1e-3 * r for r in tr.ROWS}
    tiles = {r: vectors[r] * (0.9 if r in tiles_faster_at else 1.1) for r in tr.ROWS}
    return tr.Crossing(GGMLType.Q4_K, vectors, tiles)


def test_the_tiles_start_where_they_stay_no_slower():
    assert crossing(set(tr.ROWS)).tile_rows == 4
    assert crossing({10, 12, 14, 16}).tile_rows == 10
    # a lucky dip below the crossing does not pull it down
    assert crossing({6, 12, 14, 16}).tile_rows == 12
    # never faster: tiles only past one whole tile (prefill)
    assert crossing(set()).tile_rows == 17
    assert crossing({4, 6, 8}).tile_rows == 17


def test_a_hand_set_row_count_is_checked(monkeypatch):
    monkeypatch.setenv(tr.ENV, "9")
    assert tr._from_env() == 9
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(tr.ENV, bad)
        with pytest.raises(InvalidArgumentError, match=tr.ENV):
            tr._from_env()


def test_every_records_type_takes_tiles_where_amx_runs_and_no_other(monkeypatch):
    monkeypatch.setenv(tr.ENV, "4")
    for qtype in (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, tr.I8_ROW):
        assert tr.tile_rows(qtype) == (4 if kquant_amx() else 0)
    assert tr.tile_rows(GGMLType.Q4_0) == 0  # no records: the packed int4 fallback


@pytest.mark.skipif(not kquant_amx(), reason="no AMX-INT8 tiles on this CPU (or not granted)")
def test_the_crossing_is_measured_once_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    monkeypatch.delenv(tr.ENV, raising=False)
    tr._measured.cache_clear()
    try:
        got = tr.tile_rows(GGMLType.Q4_K)
        saved = json.loads(tr.cache_path(tr.torch.get_num_threads()).read_text())
        assert got == saved[str(GGMLType.Q4_K)]["tile_rows"] and 4 <= got <= 17
        for qtype in tr.TILED:
            assert set(saved[str(qtype)]["tiles_s"]) == {str(r) for r in tr.ROWS}
            assert 4 <= saved[str(qtype)]["tile_rows"] <= 17
        tr._measured.cache_clear()  # a new process: read back, not measured again
        monkeypatch.setattr(tr, "measure", lambda *a, **k: pytest.fail("measured twice"))
        assert tr.tile_rows(GGMLType.Q4_K) == got
        monkeypatch.setenv(tr.ENV, "5")
        assert tr.tile_rows(GGMLType.Q6_K) == 5 and "DRAFTSMAN_KQUANT_TILE_ROWS" in tr.describe()
    finally:
        tr._measured.cache_clear()


def test_no_amx_means_no_tiles(monkeypatch):
    monkeypatch.setattr(tr, "kquant_amx", lambda: False)
    assert tr.tile_rows(GGMLType.Q4_K) == 0 and tr.describe() == "no AMX tiles"


def test_the_kernels_block_type_numbers_are_ggmls():
    from gguf.constants import GGMLQuantizationType

    for t in GGMLType:
        assert GGMLQuantizationType[t.name] == t.value
    assert tr.I8_ROW not in {q.value for q in GGMLQuantizationType}
