"""`make gpu-check`: the dry run end to end on the CPU, and its parts against hand-computed
values (the random-weight folder, the bandwidth floor, the predicted speedups)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

import draftsman
from draftsman.bench.device_ceilings import bytes_per_token, measure
from draftsman.bench.gpu_report import predicted_speedup
from draftsman.bench.peers import parse_peers
from draftsman.errors import InvalidArgumentError
from draftsman.store.random_weights import weights_label, write_random_folder
from draftsman.testing.tiny_models import tiny_config_folder

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_dry_run_runs_every_stage_and_packs_its_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run",
                          "--carry", str(tmp_path / "carry"), "--out", str(out), "--work",
                          str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    status = json.loads((tmp_path / "work" / "status.json").read_text())
    assert status == {s: "ok" for s in ("env", "test-gpu", "host-cpu", "random", "batched",
                                        "breakdown",
                                        "real", "report")}
    summary = (out / "summary.md").read_text()
    for part in ("Forward cost, 1.5b bf16", "weights: random", "| hf:compiled |",
                 "Bandwidth floor", "Predicted: the real Qwen2.5-Coder", "One static step",
                 "Many requests at once"):
        assert part in summary, part
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"bench-random/results.jsonl", "bench-smollm2/results.jsonl", "summary.md",
            "ceilings.json", "host-kernels.jsonl",
            "host-curves-qwen2.5-coder-1.5b-instruct.json"} <= names
    # no weights, wheels or store travel back
    assert not {n.split("/")[0] for n in names} & {"models", "home", "site", "like", "gguf"}
    rows = [json.loads(line) for line in
            (tmp_path / "work" / "bench-random" / "results.jsonl").read_text().splitlines()]
    assert {r["env"]["weights"] for r in rows} == {"random"}
    labels = {r["label"] for r in rows}
    assert {"autoregressive", "autoregressive:engine=torch-bf16", "hf", "hf:compiled"} <= labels


def test_random_folder_is_labelled_and_loads(tmp_path: Path) -> None:
    like = tiny_config_folder(tmp_path / "like")
    folder = write_random_folder(like, tmp_path / "random", dtype="float32", seed=3)
    assert weights_label(folder) == "random" and weights_label(like) == "real"
    assert not (tmp_path / ".random.partial").exists()
    engine = draftsman.load(str(folder), dtype="fp32")
    assert len(engine.generate([5, 6, 7], max_new_tokens=4).token_ids) > 0
    with pytest.raises(InvalidArgumentError, match="already exists"):
        write_random_folder(like, folder)
    with pytest.raises(InvalidArgumentError, match="no config.json"):
        write_random_folder(tmp_path, tmp_path / "other")


def _safetensors(path: Path, tensors: dict[str, int]) -> None:
    """A header-only safetensors file naming tensors of the given byte sizes."""
    header, offset = {}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [size // 2], "data_offsets": [offset,
                                                                                offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


@pytest.mark.parametrize("tied", [False, True])
def test_bytes_per_token_by_hand(tmp_path: Path, tied: bool) -> None:
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
              "num_hidden_layers": 3, "tie_word_embeddings": tied}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": 1000, "model.layers.0.mlp.up_proj.weight": 300}
    if not tied:
        tensors["lm_head.weight"] = 1000
    _safetensors(tmp_path / "model.safetensors", tensors)
    # KV: 2 (k, v) x 3 layers x 2 heads x 16 dims x 10 tokens x 2 bytes = 3840
    # weights: 300 + the 1000-byte head (tied: the embedding is the head, read whole;
    # untied: the embedding is a row lookup, left out)
    assert bytes_per_token(tmp_path, context=10) == 1300 + 3840


def test_predicted_speedup_by_hand() -> None:
    target = {1: 1.0, 2: 1.2, 4: 1.5}
    draft = {1: 0.2}
    # one step of 3 guesses (verify 4 rows + 3 draft forwards), one step with none: 5 tokens
    row = {"gammas": [3, 0], "new_tokens": 5, "draft_forwards": 3}
    assert predicted_speedup(row, target, draft) == pytest.approx(5 / (1.5 + 0.6 + 1.0))
    free = {**row, "draft_forwards": 0}  # a model-free drafter costs nothing on the device
    assert predicted_speedup(free, target, draft) == pytest.approx(5 / 2.5)
    assert predicted_speedup({"new_tokens": 5}, target, draft) is None
    # 3 rows between the measured 2 and 4: interpolated, 1.35
    assert predicted_speedup({"gammas": [2], "new_tokens": 3}, target, {}) \
        == pytest.approx(3 / 1.35)


def test_compiled_transformers_is_asked_for_by_name() -> None:
    assert parse_peers(["hf"]) == [("hf", "plain"), ("hf", "assisted"),
                                   ("hf", "prompt-lookup")]
    assert parse_peers(["hf:plain,compiled"]) == [("hf", "plain"), ("hf", "compiled")]


def test_ceilings_measure_on_the_cpu() -> None:
    c = measure(torch.device("cpu"), copy_bytes=1 << 20, matmul_n=64, repeats=2)
    assert c.copy_gbps > 0 and c.bf16_tflops > 0 and c.copy_bytes == 1 << 20


def _gpu_check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_never_writes_over_a_real_carry(tmp_path: Path) -> None:
    """On the H200 (2026-11-26) a dry run had written tiny configs into .gpu-carry, and the
    GPU timed 3-layer models as the 1.5B: the dry run now keeps to WORK/dry-carry."""
    gpu_check = _gpu_check_module()
    real = tmp_path / "carry"
    (real / "base" / "wheels").mkdir(parents=True)
    with pytest.raises(SystemExit, match="holds a real carry"):
        gpu_check.dry_carry(real)
    assert not (real / "base" / "like").exists()
    with pytest.raises(SystemExit, match="STAGE=SECONDS"):
        gpu_check.parse_limits("random=3,bogus=4")
    assert gpu_check.parse_limits("random=300,test-gpu=90") == {"random": 300, "test-gpu": 90}


def test_a_random_folder_of_other_shapes_is_drawn_again(tmp_path: Path) -> None:
    """A warm machine keeps WORK: a folder left by a run over another config is redrawn."""
    gpu_check = _gpu_check_module()
    args = gpu_check.main.__globals__["argparse"].Namespace(
        dry_run=True, work=tmp_path / "work", out=tmp_path / "out", carry=tmp_path / "carry",
        limits="", quick=False)
    check = gpu_check.Check(args)
    check.env["PYTHONPATH"] = str(ROOT / "src")
    small = tiny_config_folder(tmp_path / "small", layers=2)
    large = tiny_config_folder(tmp_path / "large", layers=3)
    assert gpu_check.same_config(small, small) and not gpu_check.same_config(small, large)
    folder = check.random_folder("m", small, 0)
    assert gpu_check.same_config(folder, small)
    assert gpu_check.same_config(check.random_folder("m", large, 0), large)


def test_results_of_another_commit_are_set_aside_not_packed(tmp_path: Path) -> None:
    """WORK outlives a lease on some hosts: results left there at another commit stay out of
    the pack (moved to WORK/earlier); a later call at the same commit keeps its earlier ones."""
    gpu_check = _gpu_check_module()
    args = gpu_check.main.__globals__["argparse"].Namespace(
        dry_run=True, work=tmp_path / "work", out=tmp_path / "out", carry=tmp_path / "carry",
        limits="", quick=False)
    check = gpu_check.Check(args)
    (check.work / "breakdown-1.5b-1.md").write_text("a 2-layer model's step\n")
    (check.work / "models").mkdir()
    check.set_aside_other_results("abc")
    check.pack()
    with tarfile.open(check.out / "gpu-check.tar.gz") as tar:
        assert "breakdown-1.5b-1.md" not in tar.getnames()
    assert (check.work / "earlier" / "breakdown-1.5b-1.md").is_file()
    assert (check.work / "models").is_dir()  # drawn models stay: same_config checks them
    (check.work / "bench-random").mkdir()
    check.set_aside_other_results("abc")  # the next call of the same session
    check.pack()
    with tarfile.open(check.out / "gpu-check.tar.gz") as tar:
        assert "bench-random" in tar.getnames()
