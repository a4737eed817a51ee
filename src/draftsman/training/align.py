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
projection, W' = W + (α / r) B A with B = 0 at the start (step 0 is the unaligned model);
the training loop, LoRA and the saved folder are in `finetune`.
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
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from draftsman.bench.datasets import load_dataset
from draftsman.core import GenerationConfig
from draftsman.device import DEVICE_HELP, resolve_device
from draftsman.engine import DEFAULT_DRAFT, DEFAULT_TARGET, load
from draftsman.errors import InvalidArgumentError
from draftsman.store.resolve import resolve_model
from draftsman.training.finetune import (
    CHECKPOINT,
    LOG,
    SUMMARY,
    Example,
    TrainConfig,
    Trainer,
    load_trainable,
    progress_bar,
    save_model_folder,
    weights_dtype,
)

WORK_DIR = "align"
CALIBRATION = "calibration.jsonl"
CALIBRATION_META = "calibration.meta.json"


# ----------------------------------------------------------------------------- calibration


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
    bar = progress_bar(progress, len(prompts), len(prompts) - len(todo), "calibration", "prompt")
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
    device: str = "cpu"  # where both models run: calibration replies and training

    def __post_init__(self) -> None:
        if not 0 <= self.heldout < self.prompts:
            raise InvalidArgumentError(
                f"heldout must be in [0, prompts), got {self.heldout} of {self.prompts}")


def calibrate(cfg: AlignConfig, work: Path, progress: bool, say: Callable[[str], None],
              deadline: float | None = None) -> list[Example]:
    """Step 1: the large model's greedy replies, cached in <work>/calibration.jsonl (made
    again when the settings changed). The large model is freed on return."""
    meta = calibration_meta(cfg)
    meta_path = work / CALIBRATION_META
    if meta_path.is_file() and json.loads(meta_path.read_text()) != meta:
        say(f"calibration settings changed: generating {work / CALIBRATION} again")
        (work / CALIBRATION).unlink(missing_ok=True)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    engine = load(cfg.target, dtype=cfg.gen_dtype, device=cfg.device)
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
    model = load_trainable(source).to(resolve_device(cfg.device))
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


def register(train_subparsers: argparse._SubParsersAction) -> None:
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
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help=DEVICE_HELP + "; the aligned model serves any device")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.threads is not None:
        if args.threads < 1:
            raise InvalidArgumentError(f"threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    train = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    cfg = AlignConfig(args.target, args.draft, args.out, args.dataset, args.prompts,
                      args.heldout, args.max_prompt_tokens, args.max_new_tokens, args.method,
                      args.gen_dtype, args.chat, train, str(device))
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
