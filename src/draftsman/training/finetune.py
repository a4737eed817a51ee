"""Fine-tuning a causal LM on prompt -> reply examples: LoRA adapters, a resumable
training loop and the model folder it saves.

The loss is next-token cross-entropy on the reply tokens only (the prompt is context, not a
target), either on all weights or with LoRA adapters W' = W + (α / r) B A, B = 0 at the
start, so step 0 is the unchanged model. AdamW; learning rate: linear warm-up, then cosine
decay to 10 %. Each optimiser step averages `batch` sequences (gradient accumulation, one
sequence per forward: no padding).

Invariants: a checkpoint holds the trainable tensors, the optimiser, the step and the
history, and the data order is a function of (seed, step), so a resumed run equals an
uninterrupted one. The saved folder has LoRA merged, Hugging Face tensor names, the source's
dtype, and the source's config and tokenizer files.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from draftsman.device import to_host
from draftsman.errors import DraftsmanError, InvalidArgumentError

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
SUMMARY = "alignment.json"
# files of a model folder that are not weights and are carried over to the aligned copy
SKIPPED = ("draftsman-manifest.json", "model.safetensors.index.json")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Example:
    """One calibration pair: the prompt's token ids and the large model's greedy reply."""

    id: str
    prompt_ids: list[int]
    reply_ids: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.reply_ids


# ----------------------------------------------------------------------------- LoRA


class LoRALinear(nn.Module):
    """y = W x + b + (α / r) · B (A x): W, b frozen; A [r, in] random, B [out, r] zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        bound = 1.0 / math.sqrt(base.in_features)  # kaiming-uniform(a=√5), as usual for A
        # drawn on the host (the same adapters on every device), kept beside the base weight
        a = (torch.rand(rank, base.in_features, generator=generator) * 2 - 1) * bound
        w = base.weight
        self.lora_a = nn.Parameter(a.to(w.device, w.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=w.dtype,
                                               device=w.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * ((x @ self.lora_a.T) @ self.lora_b.T)

    def merged(self) -> nn.Linear:
        with torch.no_grad():
            self.base.weight += self.scale * (self.lora_b @ self.lora_a)
        return self.base


def add_lora(model: nn.Module, rank: int, alpha: float, seed: int,
             targets: Iterable[str] = LORA_TARGETS) -> int:
    """Wrap every nn.Linear whose name ends with one of `targets`; freeze everything else.
    Returns the number of wrapped layers."""
    targets = tuple(targets)
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    wrapped = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child_name in targets:
                setattr(module, child_name, LoRALinear(child, rank, alpha, generator))
                wrapped += 1
    if not wrapped:
        raise DraftsmanError(
            f"no {'/'.join(targets)} linear layers to adapt in this model; use --lora-rank 0 "
            "(full fine-tuning)")
    return wrapped


def merge_lora(model: nn.Module) -> None:
    """Fold every adapter into its base weight, restoring the original module tree."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, child_name, child.merged())


# ----------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning hyper-parameters (what a checkpoint must agree with to be resumed)."""

    steps: int = 100
    batch: int = 4  # sequences per optimiser step
    lr: float = 2e-4
    warmup: int = 10
    weight_decay: float = 0.0
    lora_rank: int = 16  # 0: full fine-tuning
    lora_alpha: float = 32.0
    max_length: int = 512  # tokens per sequence (prompt + reply), longer ones are cut
    eval_every: int = 25
    checkpoint_every: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "max_length"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "lora_rank", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise InvalidArgumentError(f"lr must be > 0, got {self.lr}")


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over `warmup` steps, then cosine from lr down to lr / 10."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def example_index(step: int, micro: int, n: int, batch: int, seed: int) -> int:
    """Which training example the micro-batch `micro` of `step` reads: epochs of a seeded
    permutation, so the order depends on (seed, step) only."""
    k = step * batch + micro
    epoch, i = divmod(k, n)
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[i]


def reply_loss(model: nn.Module, example: Example, max_length: int
               ) -> tuple[torch.Tensor, int, int]:
    """(sum of -log p(reply token), reply tokens scored, top-1 matches) for one sequence."""
    ids = example.ids[:max_length]
    first = len(example.prompt_ids)
    n = len(ids) - first  # reply tokens inside the window
    device = next(model.parameters()).device
    if n <= 0:
        return torch.zeros((), device=device), 0, 0
    inputs = torch.tensor([ids[:-1]], device=device)
    # the last n positions of ids[:-1] predict ids[-n:]
    logits = model(input_ids=inputs, logits_to_keep=n, use_cache=False).logits[0].float()
    targets = torch.tensor(ids[-n:], device=device)
    loss = nn.functional.cross_entropy(logits, targets, reduction="sum")
    matches = int((logits.detach().argmax(-1) == targets).sum())
    return loss, n, matches


@torch.no_grad()
def evaluate(model: nn.Module, examples: list[Example], max_length: int) -> dict[str, float]:
    """Mean per-token loss and top-1 agreement with the large model's greedy replies."""
    was_training = model.training
    model.eval()
    total, tokens, matches = 0.0, 0, 0
    for ex in examples:
        loss, n, m = reply_loss(model, ex, max_length)
        total, tokens, matches = total + float(loss), tokens + n, matches + m
    model.train(was_training)
    if not tokens:
        return {"loss": float("nan"), "agreement": float("nan"), "tokens": 0}
    return {"loss": total / tokens, "agreement": matches / tokens, "tokens": tokens}


@dataclass
class TrainResult:
    step: int
    resumed_from: int
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False


class Trainer:
    """Fine-tunes `model` (a Hugging Face causal LM in float32) on calibration examples."""

    def __init__(self, model: nn.Module, train: list[Example], heldout: list[Example],
                 cfg: TrainConfig, work: Path) -> None:
        if not train:
            raise InvalidArgumentError("no training examples")
        self.model, self.train_set, self.heldout, self.cfg = model, train, heldout, cfg
        self.work = Path(work)
        if cfg.lora_rank:
            add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.seed)
        else:
            for p in model.parameters():
                p.requires_grad_(True)
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.step = 0
        self.history: list[dict[str, Any]] = []

    @property
    def trainable(self) -> int:
        return sum(p.numel() for p in self.params.values())

    # ---- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        path = self.work / CHECKPOINT
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        # on the host, so a checkpoint written on a GPU resumes anywhere
        torch.save({"step": self.step, "config": asdict(self.cfg),
                    "trainable": to_host(dict(self.params)),
                    "optimizer": to_host(self.optimizer.state_dict()),
                    "history": self.history}, tmp)
        os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact
        return path

    def load_checkpoint(self) -> bool:
        path = self.work / CHECKPOINT
        if not path.is_file():
            return False
        state = torch.load(path, weights_only=False, map_location="cpu")
        if state["config"] != asdict(self.cfg):
            raise InvalidArgumentError(
                f"{path} was written with other training settings; use another --out or "
                "--no-resume")
        with torch.no_grad():
            for name, tensor in state["trainable"].items():
                self.params[name].copy_(tensor)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history = int(state["step"]), list(state["history"])
        return True

    # ---- the loop --------------------------------------------------------------------
    def _record(self, entry: dict[str, Any]) -> None:
        self.history.append(entry)
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.work / LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def _evaluate(self) -> None:
        if self.heldout:
            ev = evaluate(self.model, self.heldout, self.cfg.max_length)
            self._record({"step": self.step, "heldout_loss": ev["loss"],
                          "heldout_agreement": ev["agreement"]})

    def train(self, resume: bool = True, progress: bool = False,
              stop_after: int | None = None, deadline: float | None = None) -> TrainResult:
        """Run to `cfg.steps`. `stop_after` (steps in this call) and `deadline`
        (time.monotonic() value) stop early after writing a checkpoint, for a later resume."""
        cfg = self.cfg
        resumed = self.load_checkpoint() if resume else False
        start = self.step
        if not resumed and not any(h["step"] == 0 and "heldout_loss" in h
                                   for h in self.history):
            self._evaluate()
        bar = progress_bar(progress, cfg.steps, self.step, "align", "step")
        self.model.train()
        stopped = False
        while self.step < cfg.steps:
            lr = learning_rate(self.step, cfg)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            batch = [self.train_set[example_index(self.step, b, len(self.train_set),
                                                  cfg.batch, cfg.seed)]
                     for b in range(cfg.batch)]
            tokens = sum(max(0, min(len(e.ids), cfg.max_length) - len(e.prompt_ids))
                         for e in batch)
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for ex in batch:
                loss, n, _ = reply_loss(self.model, ex, cfg.max_length)
                if n:
                    (loss / tokens).backward()
                    total += float(loss.detach())
            self.optimizer.step()
            self.step += 1
            entry = {"step": self.step, "loss": total / max(tokens, 1), "lr": lr}
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                self._record(entry)
                self._evaluate()
            else:
                self._record(entry)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{entry['loss']:.3f}", lr=f"{lr:.2e}")
            out_of_time = (stop_after is not None and self.step - start >= stop_after) or (
                deadline is not None and time.monotonic() >= deadline)
            if cfg.checkpoint_every and (self.step % cfg.checkpoint_every == 0
                                         or self.step == cfg.steps) or out_of_time:
                self.save_checkpoint()
            if out_of_time and self.step < cfg.steps:
                stopped = True
                break
        if bar is not None:
            bar.close()
        self.model.eval()
        return TrainResult(self.step, start, self.history, stopped)


# ----------------------------------------------------------------------------- model folders


def load_trainable(folder: Path) -> nn.Module:
    """The small model as a float32 Hugging Face module (weights keep their HF names)."""
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder),
                                                                  dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise DraftsmanError(f"cannot load {folder} for training: {exc}") from exc
    return model


SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def weights_dtype(folder: Path) -> torch.dtype:
    """The dtype of the folder's stored weights, read from the header (the aligned copy
    keeps it)."""
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                return SAFETENSORS_DTYPES.get(st.get_slice(key).get_dtype(), torch.float32)
    return torch.float32


def save_model_folder(model: nn.Module, source: Path, out: Path, dtype: torch.dtype,
                      summary: dict[str, Any]) -> Path:
    """Write `model` (LoRA merged) as a model folder next to copies of `source`'s config
    and tokenizer files. Written to a temporary sibling, then renamed into place."""
    merge_lora(model)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the loader ties it to the embedding again
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()
               if "rotary_emb" not in k}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(source).iterdir():
        if f.is_file() and f.suffix not in (".safetensors", ".bin", ".gguf", ".pt") \
                and f.name not in SKIPPED:
            shutil.copy2(f, out / f.name)
    tmp = out / ".model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return out


def progress_bar(progress: bool, total: int, initial: int, desc: str, unit: str) -> Any:
    if not progress:
        return None

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                file=sys.stderr)
