"""`draftsman train exit-head`: an LM classifier for an intermediate layer, model frozen.

The paper ("Predictive Pipelined Decoding", section 4.3 and Appendix A) trains a separate
LM head per intermediate layer on ShareGPT with the model frozen, which raises p̂_correct
(its Table 2, rows "Y"). Here the head is distilled towards the final layer's distribution
on ShareGPT text (first user turn in the chat template + the assistant's reply), in three
steps:

1. Cache. One forward per sequence stores, for every position, the residual stream after
   each requested layer L (h_L [N, H]) and the final layer's distribution p as its top-K
   log-probabilities (indices + values, normalised with the full log-sum-exp; the rest is
   one "tail" bucket of mass 1 - Σ top-K). The model never runs again.
2. Train. The exit head (see `draftsman.proposers.early_exit`: lowrank / affine translator
   before the shared LM head, or a full LM head) minimises the KL divergence from p to the
   student q = softmax(head(norm(h_L))) over the top-K tokens and the tail bucket:

       KL = Σ_{i ∈ top-K} p_i (log p_i - log q_i) + p_tail (log p_tail - log q_tail)

   (the full KL coarsened to K + 1 outcomes: exact on the tokens that decide the top-k),
   with AdamW, linear warm-up then cosine decay, mini-batches of positions drawn by a
   seeded permutation (the order is a function of (seed, step)).
3. Measure. Held-out conversations give the top-1/3/5 agreement with the final layer's
   greedy token (p̂_correct on teacher-forced text) before training (the shared head: an
   untrained translator is the identity) and after.

Checkpoints (translator, optimiser, step, history) go to the work folder every
`checkpoint_every` steps; running the same command again resumes. The result is saved as
`layer<L>.safetensors` where `find_exit_head` looks (beside the model, or under
$DRAFTSMAN_HOME/exit_heads/<model>/ for store-managed folders), and is picked up
automatically by `pipelined` and `analyze match-rate`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from draftsman.bench.dataset_loaders import sharegpt_conversations
from draftsman.device import DEVICE_HELP, resolve_device, to_host
from draftsman.engine import DEFAULT_TARGET, load_bundle
from draftsman.errors import InvalidArgumentError
from draftsman.models.base import DecoderLM
from draftsman.models.exit_heads import (
    KINDS,
    ExitHeadConfig,
    ExitTranslator,
    exit_head_filename,
    exit_head_save_dir,
    head_fingerprint,
    layer_from_fraction,
    save_exit_head,
)

WORK_DIR = ".work"  # inside the output folder: cached states and checkpoints


@dataclass(frozen=True)
class DataConfig:
    """Which text is cached (a cache made with other settings is rebuilt)."""

    conversations: int = 96
    heldout: int = 8
    seq_len: int = 256
    teacher_topk: int = 64
    chat: bool = True


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "affine"  # an H x H map before the shared head: H^2 weights, not H x V
    rank: int = 256
    steps: int = 300
    batch: int = 128  # positions per step
    lr: float = 1e-3
    warmup: float = 0.04  # share of steps (the paper's warm-up ratio)
    weight_decay: float = 0.0
    eval_every: int = 100
    checkpoint_every: int = 25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"kind must be one of {', '.join(KINDS)}")
        for name in ("steps", "batch", "rank"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 <= self.warmup < 1:
            raise InvalidArgumentError("need lr > 0 and 0 <= warmup < 1")


# ----------------------------------------------------------------------------- data


def sharegpt_sequences(tokenizer: Any, count: int, seq_len: int, chat: bool = True
                       ) -> list[list[int]]:
    """First user turn (chat template) + the assistant's reply, cut to `seq_len` tokens;
    conversations whose prompt alone fills half the window are skipped."""
    out: list[list[int]] = []
    for conv in sharegpt_conversations():
        if len(conv) < 2 or conv[0]["role"] != "user" or conv[1]["role"] != "assistant":
            continue
        user, reply = conv[0]["content"], conv[1]["content"]
        if not user.strip() or not reply.strip():
            continue
        if chat and getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.encode_chat([{"role": "user", "content": user}])
        else:
            prompt = tokenizer.encode(user)
        if len(prompt) > seq_len // 2:
            continue
        ids = (prompt + tokenizer.encode(reply, special=False))[:seq_len]
        if len(ids) < seq_len // 2:
            continue
        out.append(ids)
        if len(out) >= count:
            break
    return out


@dataclass
class States:
    """Cached training data: hidden [L][N, H] per layer, teacher top-K [N, K]."""

    layers: list[int]
    hidden: dict[int, torch.Tensor]
    top_idx: torch.Tensor  # [N, K] int32
    top_logp: torch.Tensor  # [N, K] float32, log p of the final layer (full normaliser)
    train_rows: int  # rows [0, train_rows) train, the rest are held out

    @property
    def rows(self) -> int:
        return int(self.top_idx.shape[0])


def _teacher_top(model: DecoderLM, final_hidden: torch.Tensor, k: int, chunk: int = 32768
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """final hidden [T, H] -> top-K indices and log-probs of the final distribution."""
    normed = model.norm(final_hidden).float()
    w = model.lm_head.weight
    logits = torch.cat([F.linear(normed, w[a:a + chunk].float())
                        for a in range(0, w.shape[0], chunk)], dim=1)  # [T, V]
    logp = logits.log_softmax(-1)
    top = logp.topk(k, dim=-1)
    return top.indices.to(torch.int32), top.values


@torch.inference_mode()
def collect_states(model: DecoderLM, sequences: list[list[int]], layers: list[int],
                   teacher_topk: int, train_count: int,
                   progress: Callable[[int, int], None] | None = None) -> States:
    """Run the frozen model once per sequence; keep h_L after each layer and the teacher."""
    d = model.config.num_layers
    bounds = [0, *sorted(layers), d]
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    idx, logp = [], []
    train_rows = 0
    for n, ids in enumerate(sequences):
        cache = model.new_cache(len(ids))
        tokens = torch.tensor([ids], dtype=torch.long, device=model.device)
        pos = torch.arange(len(ids), dtype=torch.long, device=model.device)[None]
        x = None
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            x = model(tokens if a == 0 else None, pos, cache, layers=range(a, b),
                      hidden_from=x, start=0, logits_at=None).hidden
            if b in hidden:
                hidden[b].append(x[0].float().cpu().clone())  # the data set stays on the host
        i, lp = _teacher_top(model, x[0], teacher_topk)
        idx.append(i.cpu())
        logp.append(lp.cpu())
        if n < train_count:
            train_rows += len(ids)
        if progress:
            progress(n + 1, len(sequences))
    return States(sorted(layers), {k: torch.cat(v) for k, v in hidden.items()},
                  torch.cat(idx), torch.cat(logp), train_rows)


def save_states(states: States, path: Path, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"meta": meta, "layers": states.layers, "hidden": states.hidden,
                "top_idx": states.top_idx, "top_logp": states.top_logp,
                "train_rows": states.train_rows}, tmp)
    tmp.replace(path)


def load_states(path: Path, meta: dict[str, Any]) -> States | None:
    """The cached states if they were made with exactly `meta` (and hold `meta`'s layers)."""
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, ValueError):
        return None
    if blob.get("meta") != meta:
        return None
    return States(blob["layers"], blob["hidden"], blob["top_idx"], blob["top_logp"],
                  blob["train_rows"])


# ----------------------------------------------------------------------------- training


def kl_to_teacher(student_logits: torch.Tensor, top_idx: torch.Tensor,
                  top_logp: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) over the top-K tokens and one tail bucket (see module docstring).

    student_logits [B, V], top_idx [B, K], top_logp [B, K] -> scalar."""
    logq = student_logits.float().log_softmax(-1)
    idx = top_idx.long()
    q_top = logq.gather(1, idx)  # [B, K]
    # [B]; floored so an empty tail (K = V) gives a vanishing term, not inf
    q_tail = logq.scatter(1, idx, float("-inf")).logsumexp(-1).clamp_min(-50.0)
    p_top = top_logp.exp()
    p_tail = (1.0 - p_top.sum(-1)).clamp_min(1e-8)
    kl = (p_top * (top_logp - q_top)).sum(-1) + p_tail * (p_tail.log() - q_tail)
    return kl.mean()


def student_logits(model: DecoderLM, translator: ExitTranslator, hidden: torch.Tensor,
                   lm_head_fp32: torch.Tensor) -> torch.Tensor:
    """hidden [B, H] (float32) -> logits [B, V] with gradients into the translator only."""
    with torch.no_grad():
        normed = model.norm(hidden.to(model.dtype)).float()
    y = translator(normed)
    return y if translator.gives_logits else F.linear(y, lm_head_fp32)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    warm = max(1, round(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, cfg.steps - warm))
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


def batch_rows(step: int, batch: int, n: int, seed: int) -> torch.Tensor:
    """Rows of mini-batch `step`: consecutive slices of seeded permutations (one per epoch)."""
    out = []
    k = step * batch
    while len(out) < batch:
        epoch, i = divmod(k, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        take = perm[i:i + batch - len(out)]
        out.extend(take.tolist())
        k += len(take)
    return torch.tensor(out, dtype=torch.long)


@torch.no_grad()
def evaluate(model: DecoderLM, translator: ExitTranslator | None, hidden: torch.Tensor,
             top_idx: torch.Tensor, top_logp: torch.Tensor, lm_head_fp32: torch.Tensor,
             chunk: int = 256) -> dict[str, float]:
    """Held-out agreement with the final layer's greedy token (top-1/3/5) and the KL.

    The states may live on the host: each chunk goes to the model's device."""
    hits = {1: 0, 3: 0, 5: 0}
    kl = 0.0
    n = hidden.shape[0]
    dev = lm_head_fp32.device
    for a in range(0, n, chunk):
        h = hidden[a:a + chunk].to(dev)
        normed = model.norm(h.to(model.dtype)).float()
        if translator is None:
            logits = F.linear(normed, lm_head_fp32)
        else:
            y = translator(normed)
            logits = y if translator.gives_logits else F.linear(y, lm_head_fp32)
        idx, logp = top_idx[a:a + chunk].to(dev), top_logp[a:a + chunk].to(dev)
        target = idx[:, 0].long()
        top5 = logits.topk(5, dim=-1).indices
        for k in hits:
            hits[k] += int((top5[:, :k] == target[:, None]).any(-1).sum())
        kl += float(kl_to_teacher(logits, idx, logp)) * len(h)
    return {"top1": hits[1] / n, "top3": hits[3] / n, "top5": hits[5] / n, "kl": kl / n,
            "rows": n}


def train_head(model: DecoderLM, states: States, layer: int, cfg: TrainConfig,
               work: Path | None = None, *, resume: bool = True,
               say: Callable[[str], None] = lambda _: None,
               time_limit: float | None = None) -> tuple[ExitTranslator, list[dict], bool]:
    """Train one exit head on cached states; returns (translator, history, finished).

    The translator and the optimiser live on the model's device; the cached states stay on
    the host and each mini-batch is copied over. Checkpoints are written from the host."""
    torch.manual_seed(cfg.seed)
    c = model.config
    head_cfg = ExitHeadConfig(layer, cfg.kind, cfg.rank, c.hidden_size, c.vocab_size)
    lm_head_fp32 = model.lm_head.weight.detach().float()
    dev = lm_head_fp32.device
    # initialised on the host (the same seeded draw on every device), then moved
    translator = ExitTranslator(head_cfg, lm_head_fp32.cpu(), seed=cfg.seed).to(dev)
    params = [p for p in translator.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    hidden = states.hidden[layer]
    n_train = states.train_rows
    held = (hidden[n_train:], states.top_idx[n_train:], states.top_logp[n_train:])
    ckpt = work / f"layer{layer}-{cfg.kind}-checkpoint.pt" if work else None
    step, history = 0, []
    if resume and ckpt is not None and ckpt.is_file():
        blob = torch.load(ckpt, weights_only=False, map_location="cpu")
        if blob["config"] == asdict(cfg):
            translator.load_state_dict(blob["translator"])
            opt.load_state_dict(blob["optimizer"])
            step, history = blob["step"], blob["history"]
            say(f"resumed layer {layer} at step {step}")
    if step == 0:
        base = evaluate(model, None, *held, lm_head_fp32)
        history.append({"step": 0, "heldout": base, "head": "shared"})
        say(f"layer {layer} shared head: held-out top-1 {base['top1']:.3f} "
            f"top-3 {base['top3']:.3f} KL {base['kl']:.3f}")
    t_start = time.monotonic()
    finished = True
    while step < cfg.steps:
        rows = batch_rows(step, cfg.batch, n_train, cfg.seed)
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, cfg)
        logits = student_logits(model, translator, hidden[rows].to(dev), lm_head_fp32)
        loss = kl_to_teacher(logits, states.top_idx[rows].to(dev),
                             states.top_logp[rows].to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        history.append({"step": step, "loss": float(loss.detach())})
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            ev = evaluate(model, translator, *held, lm_head_fp32)
            history.append({"step": step, "heldout": ev})
            say(f"layer {layer} step {step}: loss {float(loss.detach()):.4f}, held-out top-1 "
                f"{ev['top1']:.3f} top-3 {ev['top3']:.3f} KL {ev['kl']:.3f}")
        if ckpt is not None and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            _checkpoint(ckpt, translator, opt, step, history, cfg)
        if time_limit is not None and time.monotonic() - t_start > time_limit \
                and step < cfg.steps:
            if ckpt is not None:
                _checkpoint(ckpt, translator, opt, step, history, cfg)
            finished = False
            break
    return translator.eval().requires_grad_(False), history, finished


def _checkpoint(path: Path, translator: ExitTranslator, opt: torch.optim.Optimizer, step: int,
                history: list[dict], cfg: TrainConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"translator": to_host(translator.state_dict()),
                "optimizer": to_host(opt.state_dict()),
                "step": step, "history": history, "config": asdict(cfg)}, tmp)
    tmp.replace(path)


# ----------------------------------------------------------------------------- CLI


def register(train_subparsers: argparse._SubParsersAction) -> None:
    d, t = DataConfig(), TrainConfig()
    p = train_subparsers.add_parser(
        "exit-head", help="train an early-exit LM head for an intermediate layer (pipelined)",
        description="Distil the final layer's distribution into an LM classifier for the "
                    "hidden state after --layer layers (model frozen), on ShareGPT text. "
                    "Hidden states are cached once; training resumes from checkpoints. The "
                    "head is saved where `pipelined` and `analyze match-rate` find it.")
    p.add_argument("--model", "--target", dest="model", default=DEFAULT_TARGET)
    p.add_argument("--layer", required=True,
                   help="layers run before the exit (e.g. 12), a fraction of depth (0.5), "
                        "or several separated by commas (trained one after the other)")
    p.add_argument("--kind", default=t.kind, choices=KINDS,
                   help="affine (default) / lowrank translator before the shared LM head, "
                        "or a full LM head")
    p.add_argument("--rank", type=int, default=t.rank, help="rank of the lowrank translator")
    p.add_argument("--steps", type=int, default=t.steps)
    p.add_argument("--batch", type=int, default=t.batch, help="positions per step")
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--warmup", type=float, default=t.warmup, help="share of steps")
    p.add_argument("--weight-decay", type=float, default=t.weight_decay)
    p.add_argument("--eval-every", type=int, default=t.eval_every)
    p.add_argument("--checkpoint-every", type=int, default=t.checkpoint_every)
    p.add_argument("--seed", type=int, default=t.seed)
    p.add_argument("--conversations", type=int, default=d.conversations,
                   help="ShareGPT conversations to train on")
    p.add_argument("--heldout", type=int, default=d.heldout, help="held-out conversations")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--teacher-topk", type=int, default=d.teacher_topk,
                   help="final-layer log-probs kept per position (the rest is one bucket)")
    p.add_argument("--no-chat", dest="chat", action="store_false")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                   help="dtype the model runs in while caching hidden states")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for layer<L>.safetensors (default: where it is found)")
    p.add_argument("--work", type=Path, default=None,
                   help="cache/checkpoint folder (default: <out>/.work)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="stop after a checkpoint when this much training time has passed")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help=DEVICE_HELP + "; the saved head serves any device")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.threads < 1:
        raise InvalidArgumentError("--threads must be >= 1")
    torch.set_num_threads(args.threads)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    bundle = load_bundle(args.model, args.dtype, device=device)
    model = bundle.model.requires_grad_(False)
    depth = model.config.num_layers
    layers = sorted({layer_from_fraction(depth, x) for x in str(args.layer).split(",")
                     if x.strip()})
    data = DataConfig(**{f.name: getattr(args, f.name) for f in fields(DataConfig)})
    train = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    out = args.out or exit_head_save_dir(bundle.folder)
    work = args.work or out / WORK_DIR
    fingerprint = head_fingerprint(model)
    meta = {"model": bundle.name, "fingerprint": fingerprint, "dtype": args.dtype,
            "layers": layers, **asdict(data)}
    states_path = work / "states.pt"
    states = None if args.no_resume else load_states(states_path, meta)
    if states is None:
        say(f"caching hidden states of {data.conversations + data.heldout} ShareGPT "
            f"conversations ({data.seq_len} tokens) at layers {layers} of {depth}")
        seqs = sharegpt_sequences(bundle.tokenizer, data.conversations + data.heldout,
                                  data.seq_len, data.chat)
        t0 = time.monotonic()
        states = collect_states(model, seqs, layers, data.teacher_topk,
                                min(data.conversations, len(seqs) - data.heldout),
                                progress=lambda i, n: say(f"  {i}/{n}") if i % 16 == 0
                                else None)
        save_states(states, states_path, meta)
        say(f"cached {states.rows} positions ({states.train_rows} train) in "
            f"{time.monotonic() - t0:.0f} s -> {states_path}")
    summary: dict[str, Any] = {"model": bundle.name, "layers": {}}
    finished_all = True
    for layer in layers:
        t0 = time.monotonic()
        translator, history, finished = train_head(
            model, states, layer, train, work, resume=not args.no_resume, say=say,
            time_limit=args.time_limit * 60 if args.time_limit else None)
        finished_all &= finished
        evals = [h for h in history if "heldout" in h]
        entry = {"shared": evals[0]["heldout"], "trained": evals[-1]["heldout"],
                 "steps": history[-1]["step"] if history else 0,
                 "seconds": time.monotonic() - t0, "finished": finished}
        if finished:
            path = save_exit_head(translator, out / exit_head_filename(layer), {
                "fingerprint": fingerprint, "model": bundle.name, "train": asdict(train),
                "data": asdict(data), "heldout_shared": entry["shared"],
                "heldout_trained": entry["trained"]})
            entry["path"] = str(path)
            say(f"layer {layer}: held-out top-1 {entry['shared']['top1']:.3f} -> "
                f"{entry['trained']['top1']:.3f}; saved {path}")
        summary["layers"][layer] = entry
    if args.json:
        print(json.dumps(summary))
    else:
        for layer, e in summary["layers"].items():
            print(f"layer {layer}: top-1 {e['shared']['top1']:.3f} -> {e['trained']['top1']:.3f}"
                  f"  top-3 {e['shared']['top3']:.3f} -> {e['trained']['top3']:.3f}  "
                  f"{e.get('path', '(not finished: run again to resume)')}")
    return 0 if finished_all else 3
