"""scripts/records_cycles.py: the records kernel's cycles a record-row, called directly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from draftsman.kernels.native import records_isa

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "records_cycles.py"


@pytest.mark.slow
@pytest.mark.skipif(records_isa() != "avx512vnni",
                    reason="needs the K-quant records on AVX-512 VNNI")
def test_it_builds_and_counts_every_row_count_from_l2_and_memory():
    run = subprocess.run([sys.executable, str(SCRIPT), "--qtypes", "q4_k,i8_row", "--rows", "1,3",
                          "--threads", "1", "--repeats", "1"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {(m[1], m[2]): (float(m[3]), float(m[4]), float(m[5]), float(m[6]))
            for m in re.finditer(r"\| (Q4_K|I8_ROW) \| (L2|memory) \| ([\d.]+) / ([\d.]+) \| "
                                 r"([\d.]+) / ([\d.]+) \|", run.stdout)}
    assert set(rows) == {(q, p) for q in ("Q4_K", "I8_ROW") for p in ("L2", "memory")}, run.stdout
    for one, one_row, three, three_rows in rows.values():
        # a record's cycles over its rows: the per-row figure is the record's share
        assert one > 0 and one_row == pytest.approx(one, rel=0.01)
        assert three_rows == pytest.approx(three / 3, rel=0.01)
    assert re.search(r"TSC \d+\.\d+ GHz", run.stdout)


def test_bad_options_are_refused_in_one_line():
    for args, message in ((["--qtypes", "q5_k"], "unknown --qtypes q5_k"),
                          (["--rows", "0,17"], "--rows must be 1..16"),
                          (["--k", "1000"], "--k must be a positive multiple of 256")):
        run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                             text=True, timeout=120)
        if run.returncode == 2 and "no K-quant records" in run.stderr:
            pytest.skip("needs the K-quant records (AVX-512 VNNI)")
        assert run.returncode == 2 and message in run.stderr, run.stderr
