"""Training on a device: prompt tokens, exit heads and BiLD alignment train where the model
lives, and every checkpoint and saved file holds host tensors (so it serves the CPU too).

Each case runs on the CPU and, marked `gpu`, on CUDA where torch sees a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from devices import devices
from test_align import save_folder, student_and_teacher
from test_parallel_prompt import greedy_texts, sharp_model
from tiny import hf_model, ours_from_hf

from draftsman.cli.main import main
from draftsman.models.exit_heads import load_translator, save_exit_head
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.training import exit_head as eh
from draftsman.training.finetune import CHECKPOINT, Example, TrainConfig, Trainer, load_trainable


def _host_tensors(obj) -> list[torch.Tensor]:
    """Every tensor inside a nested checkpoint."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _host_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _host_tensors(v)]
    return []


def _all_on_cpu(path: Path) -> None:
    tensors = _host_tensors(torch.load(path, weights_only=False))
    assert tensors and all(t.device.type == "cpu" for t in tensors)


@pytest.mark.parametrize("device", devices())
def test_prompt_tokens_train_on_the_device(device: str, tmp_path: Path) -> None:
    from draftsman.training.prompt_tokens import CHECKPOINT as PT_CHECKPOINT
    from draftsman.training.prompt_tokens import TrainConfig as PTConfig
    from draftsman.training.prompt_tokens import train

    model = sharp_model()
    seqs = greedy_texts(model, 6, n=24)
    model = model.to(device)
    cfg = PTConfig(steps=4, insertions=6, eval_every=4, checkpoint_every=2)
    prompts, history = train(model, seqs[:4], seqs[4:], cfg, tmp_path, progress=False)
    assert prompts.embeddings.device.type == "cpu"
    assert [h["step"] for h in history] == [0, 4]
    _all_on_cpu(tmp_path / PT_CHECKPOINT)
    loaded = PromptTokens.load(tmp_path)
    torch.testing.assert_close(loaded.embeddings, prompts.embeddings)
    # a CPU run of the same steps learns the same embeddings (float32, up to device numerics)
    if device != "cpu":
        ref, _ = train(model.to("cpu"), seqs[:4], seqs[4:], cfg, tmp_path / "cpu",
                       progress=False)
        torch.testing.assert_close(prompts.embeddings, ref.embeddings, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", devices())
def test_exit_head_trains_on_the_device(device: str, tmp_path: Path) -> None:
    model = ours_from_hf(hf_model("llama", seed=2, num_hidden_layers=4)).to(device)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 97, (32,), generator=g).tolist() for _ in range(6)]
    states = eh.collect_states(model, seqs, [2], teacher_topk=8, train_count=5)
    assert states.hidden[2].device.type == "cpu" and states.top_idx.device.type == "cpu"
    cfg = eh.TrainConfig(kind="lowrank", rank=4, steps=4, batch=16, eval_every=4,
                         checkpoint_every=2)
    translator, history, finished = eh.train_head(model, states, 2, cfg, tmp_path)
    assert finished and next(translator.parameters()).device.type == device
    _all_on_cpu(tmp_path / f"layer2-{cfg.kind}-checkpoint.pt")
    path = save_exit_head(translator, tmp_path / "head.safetensors", {"model": "tiny"})
    loaded = load_translator(path)
    assert all(t.device.type == "cpu" for t in loaded.state_dict().values())


@pytest.mark.parametrize("device", devices())
def test_alignment_trains_on_the_device(device: str, tmp_path: Path) -> None:
    student, _ = student_and_teacher()
    folder = save_folder(student, tmp_path / "small")
    model = load_trainable(folder).to(device)
    examples = [Example(str(i), [i, i + 1, 3], [5, 7, i % 9, 2]) for i in range(6)]
    cfg = TrainConfig(steps=3, batch=2, lr=1e-2, warmup=1, lora_rank=4, eval_every=3,
                      checkpoint_every=1)
    result = Trainer(model, examples[:4], examples[4:], cfg, tmp_path / "work").train()
    assert result.step == 3 and not result.stopped_early
    assert all(p.device.type == device for p in model.parameters())
    _all_on_cpu(tmp_path / "work" / CHECKPOINT)
    # a checkpoint written on the device resumes on the CPU
    again = Trainer(load_trainable(folder), examples[:4], examples[4:], cfg, tmp_path / "work")
    assert again.load_checkpoint() and again.step == 3


@pytest.mark.parametrize("device", devices())
def test_train_align_command_takes_the_device(device: str, tmp_path: Path, capsys) -> None:
    student, teacher = student_and_teacher()
    large = save_folder(teacher, tmp_path / "large")
    small = save_folder(student, tmp_path / "small")
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"t{i} t{i + 3} t7"}) + "\n"
                               for i in range(4)))
    out = tmp_path / "aligned"
    assert main(["train", "align", "--target", str(large), "--draft", str(small),
                 "--out", str(out), "--dataset", str(dataset), "--prompts", "4",
                 "--heldout", "1", "--max-new-tokens", "6", "--steps", "2", "--batch", "2",
                 "--warmup", "1", "--lora-rank", "4", "--eval-every", "2",
                 "--checkpoint-every", "1", "--gen-dtype", "fp32", "--threads", "1",
                 "--no-progress", "--json", "--device", device]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["finished"] and summary["step"] == 2
    assert (out / "model.safetensors").is_file()
