"""bench/quant_curves.py: random quantised models of a config's shapes and a GGUF's block
types, and their interleaved forward curves (what a lent machine's host CPU is timed with)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize

from draftsman.bench import quant_curves
from draftsman.kernels.native import kquant_available
from draftsman.testing.tiny_models import tiny_config_folder


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K,
                                   Q.Q6_K, Q.F16, Q.F32])
def test_random_blocks_are_valid_blocks_of_small_weights(qtype):
    rows = quant_curves.random_block_rows(int(qtype), 3, 512, np.random.default_rng(0))
    w = dequantize(rows, qtype).reshape(3, 512)
    assert np.isfinite(w).all() and 0 < np.abs(w).max() < 1


def test_an_unknown_block_type_is_refused():
    with pytest.raises(ValueError, match="GGML type 99"):
        quant_curves.random_block_rows(99, 1, 256, np.random.default_rng(0))


@pytest.mark.skipif(not kquant_available(), reason="the kernels do not build here")
def test_models_take_the_gguf_types_given_and_the_curves_are_written(tmp_path: Path):
    like = tiny_config_folder(tmp_path / "like")  # hidden 64: Q8_0 blocks (32 wide)
    shapes = quant_curves.hf_shapes(like)
    types = {name: int(Q.Q8_0) for name, s in shapes.items() if len(s) == 2}
    types["model.layers.0.mlp.down_proj.weight"] = int(Q.Q5_0)
    (like / quant_curves.TYPES_FILE).write_text(json.dumps(types))
    model = quant_curves.random_model(like, "q4")
    summary = " ".join(model.quant_summary)
    assert "Q5_0" in summary and "Q8_0" in summary
    out = tmp_path / "curves.json"
    assert quant_curves.main(["--like", str(like), "--contestants", "q4,q8", "--rounds", "2",
                              "--lengths", "1,3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["weights"] == "random" and len(result["rounds"]) == 2
    assert set(result["rounds"][0]) == {f"like {d}|{n}" for d in ("q4", "q8") for n in (1, 3)}
    assert "| like q8 |" in result["table"]
