"""`draftsman train align`: model prediction alignment (Kim et al., BiLD, section 3.5.1).

Calibration. Prompts X_cal (by default the first user turns of ShareGPT, in the target's
chat template) and the large model's greedy replies Y_cal, y = argmax p_L(y | x), generated
once and cached as JSONL (resumable line by line). They are generated with greedy
speculative decoding, the small model drafting: the same tokens as the large model alone
(identical in fp32; in bf16 up to verify-pass rounding), in fewer large-model forwards.

Fine-tuning. The small model minimises its next-token cross-entropy on the replies only
(the prompt is context, not a target):

    L(θ) = - (1 / Σ|y|) Σ_(x, y) Σ_t log p_S(y_t | x, y_<t; θ)

either on all weights or, by default, with LoRA adapters on every attention and MLP
projection, W' = W + (α / r) B A with B = 0 at the start (step 0 is the unaligned model).
AdamW; learning rate: linear warm-up, then cosine decay to 10 %. Each optimiser step
averages `batch` sequences (gradient accumulation, one sequence per forward: no padding).
Held-out replies give the loss and the top-1 agreement (share of the large model's greedy
tokens the small model would also pick: the greedy acceptance that BiLD's rollback and
speculative decoding's α both depend on).

Checkpoints hold the trainable tensors, the optimiser, the step and the history; the data
order is a function of (seed, step), so a resumed run equals an uninterrupted one.

Output: a normal model folder (config.json and tokenizer files copied from the small
model, model.safetensors with Hugging Face names, LoRA merged, in the small model's dtype)
plus alignment.json (provenance and losses); usable as `--draft`. Working files
(calibration.jsonl, checkpoint.pt, log.jsonl) live in <out>/align/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsman.errors import DraftsmanError, InvalidArgumentError

WORK_DIR = "align"
CALIBRATION = "calibration.jsonl"
CALIBRATION_META = "calibration.meta.json"
CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
SUMMARY = "alignment.json"
# files of a model folder that are not weights and are carried over to the aligned copy
SKIPPED = ("draftsman-manifest.json", "model.safetensors.index.json")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Example:
    """One calibration pair: the prompt's token ids and the large model's greedy reply."""

    id: str
    prompt_ids: list[int]
    reply_ids: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.reply_ids


def read_calibration(path: Path) -> list[Example]:
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out.append(Example(str(rec["id"]), rec["prompt_ids"], rec["reply_ids"]))
    return out


def generate_calibration(
    generate: Callable[[list[int]], list[int]],
    prompts: list[tuple[str, list[int]]],
    path: Path,
    progress: bool = False,
    deadline: float | None = None,
) -> list[Example]:
    """Replies to `prompts` [(id, prompt ids)], appended to `path` one JSON line each.

    Lines already in `path` are kept and their prompts skipped, so an interrupted
    generation resumes where it stopped. `generate(prompt_ids) -> reply ids`. Past
    `deadline` (a time.monotonic() value) it stops and returns the replies made so far.
    """
    done = {e.id: e for e in read_calibration(path)}
    todo = [(i, p) for i, p in prompts if i not in done]
    bar = _bar(progress, len(prompts), len(prompts) - len(todo), "calibration", "prompt")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for pid, ids in todo:
            reply = generate(ids)
            done[pid] = Example(pid, ids, reply)
            f.write(json.dumps({"id": pid, "prompt_ids": ids, "reply_ids": reply}) + "\n")
            f.flush()
            if bar is not None:
                bar.update(1)
            if deadline is not None and time.monotonic() >= deadline:
                break
    if bar is not None:
        bar.close()
    return [done[i] for i, _ in prompts if i in done]


def chat_prompts(tokenizer: Any, dataset: str, count: int, max_prompt_tokens: int,
                 chat: bool = True) -> list[tuple[str, list[int]]]:
    """The first `count` prompts of `dataset` that fit in `max_prompt_tokens`, tokenised
    with the chat template (when the tokenizer has one and `chat`)."""
    from draftsman.bench.datasets import load_dataset

    out: list[tuple[str, list[int]]] = []
    for prompt in load_dataset(dataset):
        if not prompt.text.strip():
            continue
        if chat and tokenizer.chat_template:
            ids = tokenizer.encode_chat([{"role": "user", "content": prompt.text}])
        else:
            ids = tokenizer.encode(prompt.text)
        if 0 < len(ids) <= max_prompt_tokens:
            out.append((prompt.id, ids))
            if len(out) == count:
                break
    if len(out) < count:
        raise InvalidArgumentError(
            f"{dataset} has only {len(out)} prompts of at most {max_prompt_tokens} tokens; "
            f"asked for {count}")
    return out


# ----------------------------------------------------------------------------- LoRA


class LoRALinear(nn.Module):
    """y = W x + b + (α / r) · B (A x): W, b frozen; A [r, in] random, B [out, r] zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        bound = 1.0 / math.sqrt(base.in_features)  # kaiming-uniform(a=√5), as usual for A
        a = (torch.rand(rank, base.in_features, generator=generator) * 2 - 1) * bound
        self.lora_a = nn.Parameter(a.to(base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank,
                                               dtype=base.weight.dtype))

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
    if n <= 0:
        return torch.zeros(()), 0, 0
    inputs = torch.tensor([ids[:-1]])
    # the last n positions of ids[:-1] predict ids[-n:]
    logits = model(input_ids=inputs, logits_to_keep=n, use_cache=False).logits[0].float()
    targets = torch.tensor(ids[-n:])
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
        torch.save({"step": self.step, "config": asdict(self.cfg),
                    "trainable": {n: p.detach() for n, p in self.params.items()},
                    "optimizer": self.optimizer.state_dict(), "history": self.history}, tmp)
        os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact
        return path

    def load_checkpoint(self) -> bool:
        path = self.work / CHECKPOINT
        if not path.is_file():
            return False
        state = torch.load(path, weights_only=False)
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
        bar = _bar(progress, cfg.steps, self.step, "align", "step")
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
    from safetensors import safe_open

    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                return SAFETENSORS_DTYPES.get(st.get_slice(key).get_dtype(), torch.float32)
    return torch.float32


def save_model_folder(model: nn.Module, source: Path, out: Path, dtype: torch.dtype,
                      summary: dict[str, Any]) -> Path:
    """Write `model` (LoRA merged) as a model folder next to copies of `source`'s config
    and tokenizer files. Written to a temporary sibling, then renamed into place."""
    from safetensors.torch import save_file

    merge_lora(model)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the loader ties it to the embedding again
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()
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


# ----------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class AlignConfig:
    target: str
    draft: str
    out: Path
    dataset: str = "sharegpt"
    prompts: int = 64  # calibration prompts, held-out ones included
    heldout: int = 8
    max_prompt_tokens: int = 256
    max_new_tokens: int = 128
    method: str = "speculative"  # how the large model's greedy replies are generated
    gen_dtype: str = "bf16"
    chat: bool = True
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.heldout < self.prompts:
            raise InvalidArgumentError(
                f"heldout must be in [0, prompts), got {self.heldout} of {self.prompts}")


def calibrate(cfg: AlignConfig, work: Path, progress: bool, say: Callable[[str], None],
              deadline: float | None = None) -> list[Example]:
    """Step 1: the large model's greedy replies, cached in <work>/calibration.jsonl (made
    again when the settings changed). The large model is freed on return."""
    import draftsman
    from draftsman.core import GenerationConfig

    meta = calibration_meta(cfg)
    meta_path = work / CALIBRATION_META
    if meta_path.is_file() and json.loads(meta_path.read_text()) != meta:
        say(f"calibration settings changed: generating {work / CALIBRATION} again")
        (work / CALIBRATION).unlink(missing_ok=True)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    engine = draftsman.load(cfg.target, dtype=cfg.gen_dtype)
    tokenizer = engine.target.tokenizer
    prompts = chat_prompts(tokenizer, cfg.dataset, cfg.prompts, cfg.max_prompt_tokens,
                           cfg.chat)
    options = {"draft": cfg.draft} if cfg.method == "speculative" else {}
    strategy = engine.strategy(cfg.method, options)
    gen_config = GenerationConfig(cfg.max_new_tokens, eos_token_ids=tokenizer.eos_token_ids)

    def reply(ids: list[int]) -> list[int]:
        return [t for s in strategy.generate(ids, gen_config) for t in s.tokens]

    say(f"calibration: {cfg.target} greedy replies to {len(prompts)} {cfg.dataset} prompts "
        f"({cfg.method}) -> {work / CALIBRATION}")
    return generate_calibration(reply, prompts, work / CALIBRATION, progress, deadline)


def calibration_meta(cfg: AlignConfig) -> dict[str, Any]:
    return {"target": cfg.target, "draft": cfg.draft, "dataset": cfg.dataset,
            "prompts": cfg.prompts, "max_prompt_tokens": cfg.max_prompt_tokens,
            "max_new_tokens": cfg.max_new_tokens, "chat": cfg.chat}


def align(cfg: AlignConfig, *, resume: bool = True, progress: bool = True,
          time_limit: float | None = None, log: Any = sys.stderr) -> dict[str, Any]:
    """Calibrate, fine-tune, save. Returns the summary written to alignment.json; when
    `time_limit` (seconds) runs out, stops after a checkpoint with summary["finished"] False
    (the same call later resumes).
    """
    from draftsman.store.resolve import resolve_model

    t0 = time.monotonic()
    deadline = t0 + time_limit if time_limit else None
    out = Path(cfg.out)
    work = out / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)

    examples = calibrate(cfg, work, progress, say, deadline)
    gen_seconds = time.monotonic() - t0
    if len(examples) < cfg.prompts:
        say(f"stopped after {len(examples)} of {cfg.prompts} calibration replies (time "
            "limit); run the same command again to resume")
        return {"target": cfg.target, "draft": cfg.draft, "finished": False, "step": 0,
                "calibration_replies": len(examples)}

    source = resolve_model(cfg.draft)
    model = load_trainable(source)
    split = len(examples) - cfg.heldout
    trainer = Trainer(model, examples[:split], examples[split:], cfg.train, work)
    how = f"LoRA rank {cfg.train.lora_rank}" if cfg.train.lora_rank else "all weights"
    say(f"training {cfg.draft} ({how}: {trainer.trainable:,} trainable parameters) on "
        f"{split} replies, {cfg.heldout} held out")
    result = trainer.train(resume=resume, progress=progress, deadline=deadline)
    evals = [h for h in result.history if "heldout_loss" in h]
    summary = {
        "target": cfg.target, "draft": cfg.draft, "finished": not result.stopped_early,
        "step": result.step, "resumed_from": result.resumed_from,
        "train": asdict(cfg.train), "calibration": calibration_meta(cfg),
        "calibration_tokens": sum(len(e.reply_ids) for e in examples),
        "calibration_seconds": round(gen_seconds, 1),
        "seconds": round(time.monotonic() - t0, 1),
        "heldout": evals,
    }
    if evals:
        say(f"held-out loss {evals[0]['heldout_loss']:.4f} -> {evals[-1]['heldout_loss']:.4f}, "
            f"agreement {evals[0]['heldout_agreement']:.3f} -> "
            f"{evals[-1]['heldout_agreement']:.3f}")
    if result.stopped_early:
        say(f"stopped at step {result.step} of {cfg.train.steps} (time limit); run the same "
            "command again to resume")
        (work / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    save_model_folder(model, source, out, weights_dtype(source), summary)
    say(f"saved {out} (use it as --draft {out})")
    return summary


def _bar(progress: bool, total: int, initial: int, desc: str, unit: str) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                file=sys.stderr)


def register(train_subparsers: argparse._SubParsersAction) -> None:
    from draftsman.engine import DEFAULT_DRAFT, DEFAULT_TARGET

    d, t = AlignConfig("", "", Path()), TrainConfig()
    p = train_subparsers.add_parser(
        "align", help="align a small model with a large one (BiLD prediction alignment)",
        description="Generate the large model's greedy replies to calibration prompts, "
                    "fine-tune the small model on them (LoRA or full), and save it as a "
                    "model folder usable as --draft. Resumable: run the same command again.")
    p.add_argument("--target", default=DEFAULT_TARGET, help="the large model")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="the small model to align")
    p.add_argument("--out", required=True, type=Path, help="output model folder")
    p.add_argument("--dataset", default=d.dataset,
                   help="calibration prompts: a dataset name or a .jsonl file (default: "
                        "sharegpt)")
    p.add_argument("--prompts", type=int, default=d.prompts,
                   help="calibration prompts, held-out ones included")
    p.add_argument("--heldout", type=int, default=d.heldout)
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                   help="length of the large model's replies")
    p.add_argument("--method", default=d.method, choices=["speculative", "autoregressive"],
                   help="how the replies are generated (both greedy-exact)")
    p.add_argument("--gen-dtype", default=d.gen_dtype, choices=["bf16", "fp32"])
    p.add_argument("--no-chat", dest="chat", action="store_false",
                   help="feed prompts as raw text, not through the chat template")
    p.add_argument("--steps", type=int, default=t.steps)
    p.add_argument("--batch", type=int, default=t.batch, help="sequences per step")
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--warmup", type=int, default=t.warmup)
    p.add_argument("--weight-decay", type=float, default=t.weight_decay)
    p.add_argument("--lora-rank", type=int, default=t.lora_rank,
                   help="LoRA rank; 0 fine-tunes all weights")
    p.add_argument("--lora-alpha", type=float, default=t.lora_alpha)
    p.add_argument("--max-length", type=int, default=t.max_length,
                   help="tokens per training sequence")
    p.add_argument("--eval-every", type=int, default=t.eval_every)
    p.add_argument("--checkpoint-every", type=int, default=t.checkpoint_every)
    p.add_argument("--seed", type=int, default=t.seed)
    p.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads")
    p.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="stop (after a checkpoint) when this much time has passed")
    p.add_argument("--no-resume", action="store_true",
                   help="train from scratch instead of resuming from <out>/align/ (a "
                        "calibration set made with the same settings is reused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise InvalidArgumentError(f"threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    train = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    cfg = AlignConfig(args.target, args.draft, args.out, args.dataset, args.prompts,
                      args.heldout, args.max_prompt_tokens, args.max_new_tokens, args.method,
                      args.gen_dtype, args.chat, train)
    if args.no_resume:  # training starts over; a matching calibration set is kept
        for name in (CHECKPOINT, LOG):
            (Path(args.out) / WORK_DIR / name).unlink(missing_ok=True)
    summary = align(cfg, resume=not args.no_resume, progress=not args.no_progress,
                    time_limit=args.time_limit * 60 if args.time_limit else None)
    if args.json:
        print(json.dumps(summary))
    else:
        print(str(args.out))
    return 0 if summary["finished"] else 3
