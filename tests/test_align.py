"""`draftsman train align` on tiny random models: calibration, LoRA / full fine-tuning,
checkpoint resume, and the saved folder working as a draft."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from tiny import hf_model, ours_from_hf
from tokenizers import Tokenizer, models, pre_tokenizers

import draftsman
from draftsman.cli.main import main
from draftsman.core import GenerationConfig
from draftsman.errors import InvalidArgumentError
from draftsman.models.loader import load_model
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.training.align import CALIBRATION, WORK_DIR, generate_calibration, read_calibration
from draftsman.training.finetune import (
    CHECKPOINT,
    SUMMARY,
    Example,
    TrainConfig,
    Trainer,
    add_lora,
    evaluate,
    load_trainable,
    merge_lora,
    save_model_folder,
    weights_dtype,
)

EOS = 96


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary: 't0' .. 't95' and '<eos>'."""
    vocab = {f"t{i}": i for i in range(96)} | {"<eos>": EOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))


def save_folder(hf, path: Path, dtype=torch.float32) -> Path:
    hf.to(dtype).save_pretrained(str(path))
    write_tokenizer(path)
    return path


def sharp_pair_folders(root: Path) -> tuple[Path, Path]:
    """A confident tiny llama target and a noisy copy as its draft, saved as model folders:
    the draft agrees often but not always, so both acceptance and rejection paths run."""
    target = hf_model("llama", seed=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(4)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return save_folder(target, root / "target"), save_folder(draft, root / "draft")


def student_and_teacher(seed: int = 1) -> tuple:
    """A 2-layer student and a teacher that differs from it by a rank-2 change of every
    attention output projection: a difference LoRA can represent, so alignment is
    learnable from a few dozen replies and generalises to held-out prompts."""
    student = hf_model("llama", seed=seed, num_hidden_layers=2)
    with torch.no_grad():
        student.lm_head.weight.mul_(6)  # confident enough for greedy replies to matter
    teacher = copy.deepcopy(student)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in teacher.model.layers:
            w = layer.self_attn.o_proj.weight
            u, v = torch.randn(w.shape[0], 2, generator=g), torch.randn(2, w.shape[1], generator=g)
            w += 0.15 * (u @ v)
    return student, teacher


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("align")
    student, teacher = student_and_teacher()
    return {"large": save_folder(teacher, root / "large"),
            "small": save_folder(student, root / "small")}


@pytest.fixture(scope="module")
def examples(folders):
    """The teacher's greedy replies to 28 random prompts (24 train, 4 held out)."""
    large = load_model(folders["large"], "fp32")
    strategy = Autoregressive(large)
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(28):
        prompt = torch.randint(0, 96, (6,), generator=g).tolist()
        steps = strategy.generate(prompt, GenerationConfig(20))
        out.append(Example(str(i), prompt, [t for s in steps for t in s.tokens]))
    return out[:24], out[24:]


def trainer(folders, examples, work, **cfg) -> Trainer:
    train, held = examples
    return Trainer(load_trainable(folders["small"]), train, held,
                   TrainConfig(**{"steps": 6, "batch": 2, "lr": 5e-3, "warmup": 1,
                                  "eval_every": 0, "checkpoint_every": 2, **cfg}), work)


# ---- calibration --------------------------------------------------------------------------

def test_calibration_is_cached_and_resumed(tmp_path):
    calls = []

    def fake(ids):
        calls.append(ids)
        return [t + 1 for t in ids]

    prompts = [(str(i), [i, i + 1]) for i in range(5)]
    path = tmp_path / "cal.jsonl"
    first = generate_calibration(fake, prompts, path, deadline=0.0)  # stops after one reply
    assert [e.id for e in first] == ["0"] and len(calls) == 1
    got = generate_calibration(fake, prompts, path)
    assert len(calls) == 5  # the first reply was not generated again
    assert [e.id for e in got] == [p[0] for p in prompts]
    assert got == read_calibration(path)
    assert got[3].ids == [3, 4, 4, 5]


# ---- training -----------------------------------------------------------------------------

@pytest.mark.parametrize("rank,lr", [(8, 2e-2), (0, 3e-3)])
def test_training_lowers_heldout_loss(folders, examples, tmp_path, rank, lr):
    t = trainer(folders, examples, tmp_path, steps=30, batch=4, lr=lr, lora_rank=rank,
                eval_every=10, checkpoint_every=0)
    result = t.train(resume=False)
    evals = [h for h in result.history if "heldout_loss" in h]
    assert [h["step"] for h in evals] == [0, 10, 20, 30]
    assert evals[-1]["heldout_loss"] < 0.8 * evals[0]["heldout_loss"]
    assert evals[-1]["heldout_agreement"] > evals[0]["heldout_agreement"]
    if rank:  # only the adapters learn
        assert t.trainable < sum(p.numel() for p in load_trainable(folders["small"])
                                 .parameters()) / 4


def test_lora_starts_as_the_base_model_and_merges_exactly(folders, examples):
    base = load_trainable(folders["small"])
    model = load_trainable(folders["small"])
    assert add_lora(model, 4, 8.0, seed=0) == 2 * 7  # 2 layers x (q k v o gate up down)
    ids = torch.tensor([examples[0][0].ids])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, base(ids).logits)
        for name, p in model.named_parameters():
            if "lora_b" in name:
                p.normal_(0, 0.05)
        adapted = model(ids).logits
        merge_lora(model)
        assert not any("lora" in n for n, _ in model.named_parameters())
        torch.testing.assert_close(model(ids).logits, adapted, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rank", [4, 0])
def test_resume_continues_from_the_checkpoint(folders, examples, tmp_path, rank):
    straight = trainer(folders, examples, tmp_path / "straight", lora_rank=rank)
    straight.train(resume=False)

    first = trainer(folders, examples, tmp_path / "split", lora_rank=rank)
    stopped = first.train(stop_after=3)
    assert stopped.stopped_early and stopped.step == 3
    assert (tmp_path / "split" / CHECKPOINT).is_file()
    second = trainer(folders, examples, tmp_path / "split", lora_rank=rank)
    result = second.train()
    assert result.resumed_from == 3 and result.step == 6 and not result.stopped_early
    for name, p in straight.params.items():
        torch.testing.assert_close(second.params[name], p, rtol=1e-5, atol=1e-6)
    assert [h["step"] for h in result.history if "loss" in h] == list(range(1, 7))
    with pytest.raises(InvalidArgumentError, match="other training settings"):
        trainer(folders, examples, tmp_path / "split", lora_rank=rank, lr=1e-3).train()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_folder_loads_and_matches(folders, examples, tmp_path, dtype):
    source = save_folder(student_and_teacher()[0], tmp_path / "src", dtype)
    assert weights_dtype(source) == dtype
    t = Trainer(load_trainable(source), *examples,
                TrainConfig(steps=3, batch=2, lr=1e-2, lora_rank=4, eval_every=0,
                            checkpoint_every=0), tmp_path / "work")
    t.train(resume=False)
    out = save_model_folder(t.model, source, tmp_path / "out", weights_dtype(source),
                            {"note": "test"})
    names = {f.name for f in out.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
            SUMMARY} <= names
    ours = load_model(out, "fp32")
    ids = examples[1][0].ids
    cache = ours.new_cache(len(ids))
    logits = ours(torch.tensor([ids]), torch.arange(len(ids))[None], cache).logits
    with torch.no_grad():
        hf = t.model.to(dtype).float()(torch.tensor([ids])).logits
    torch.testing.assert_close(logits, hf, rtol=1e-4, atol=1e-4)
    moved = ours.state_dict()["layers.0.self_attn.qkv_proj.weight"]
    original = load_model(source, "fp32").state_dict()["layers.0.self_attn.qkv_proj.weight"]
    assert not torch.equal(moved, original), "the adapters were not merged"


def test_evaluate_counts_reply_tokens_only(folders, examples):
    model = load_trainable(folders["small"])
    ev = evaluate(model, examples[1], max_length=512)
    assert ev["tokens"] == sum(len(e.reply_ids) for e in examples[1])
    short = evaluate(model, examples[1], max_length=10)  # 6 prompt + 4 reply tokens each
    assert short["tokens"] == 4 * len(examples[1])


# ---- the command --------------------------------------------------------------------------

def test_train_align_command_end_to_end(folders, tmp_path, capsys):
    dataset = tmp_path / "prompts.jsonl"
    g = torch.Generator().manual_seed(1)
    with open(dataset, "w") as f:
        for i in range(10):
            words = " ".join(f"t{t}" for t in torch.randint(0, 96, (5,), generator=g).tolist())
            f.write(json.dumps({"id": f"p{i}", "prompt": words}) + "\n")
    out = tmp_path / "aligned"
    argv = ["train", "align", "--target", str(folders["large"]), "--draft",
            str(folders["small"]), "--out", str(out), "--dataset", str(dataset),
            "--prompts", "10", "--heldout", "2", "--max-new-tokens", "12", "--steps", "8",
            "--batch", "2", "--lr", "1e-2", "--warmup", "1", "--lora-rank", "4",
            "--eval-every", "4", "--checkpoint-every", "4", "--gen-dtype", "fp32",
            "--threads", "1", "--no-progress", "--json"]
    # a time limit that runs out at once: one calibration reply, then a clean stop
    assert main(argv + ["--time-limit", "1e-9"]) == 3
    assert len(read_calibration(out / WORK_DIR / CALIBRATION)) < 10
    capsys.readouterr()
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["finished"] and summary["step"] == 8
    assert summary["heldout"][-1]["heldout_loss"] < summary["heldout"][0]["heldout_loss"]

    # the calibration replies are the large model's greedy outputs
    engine = draftsman.load(str(folders["large"]), dtype="fp32")
    config = GenerationConfig(12, eos_token_ids=engine.target.tokenizer.eos_token_ids)
    calibration = read_calibration(out / WORK_DIR / CALIBRATION)
    assert len(calibration) == 10
    for ex in calibration:
        steps = Autoregressive(engine.target.model).generate(ex.prompt_ids, config)
        assert ex.reply_ids == [t for s in steps for t in s.tokens]

    # and the folder works as a draft
    reference = engine.generate("t1 t2 t3", max_new_tokens=10)
    spec = engine.generate("t1 t2 t3", method="speculative", draft=str(out),
                           max_new_tokens=10)
    assert spec.token_ids == reference.token_ids
    bild = engine.generate("t1 t2 t3", method="big-little", draft=str(out),
                           max_new_tokens=10, fallback=1.0)
    assert bild.token_ids == reference.token_ids
    ours = ours_from_hf(load_trainable(out))  # the saved weights round-trip through HF too
    assert ours.config.num_layers == 2
