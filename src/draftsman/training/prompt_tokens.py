"""`draftsman train prompt-tokens`: learn the prompt-token embeddings of a frozen target.

Objective (Chen et al., eq. 1; self-distillation, Medusa style). For a training sequence
y_0..y_{S-1} and an insertion point t, prompt tokens 1..m (each with n EPTs) are placed at
positions t+1..t+m, seeing y_0..y_t and the earlier prompt tokens of the same insertion and
EPT (tree.py's mask: the sequence is a chain, the insertions are prompt chains on its
nodes). Prompt token i guesses y_{t+i+1}; its distribution Q_i = softmax of the EPT-averaged
logits. The teacher P_i is the target's own next-token distribution at real row t+i (the
real rows never see prompt rows, so the same forward yields the exact teacher). Loss:

    L = mean over insertions t of  sum_{i=1..m} alpha^(i-1) KL(P_i || Q_i),  alpha = 0.8

(KL(teacher || student), the distillation direction: student mass must cover the teacher's
top tokens, which is what top-k candidates need; `kl="reverse"` gives KL(Q || P)).
Many insertion points share one forward: cost ~ S + 2 m n I rows for I insertions (forward
over all rows, backward through prompt rows only; the target is frozen, only E [m, n, H]
learns). Adam, cosine learning rate from `lr` (0.01) to 0, no warm-up; the embeddings start
from real token embeddings. Checkpoints hold the embeddings, the optimiser and the step;
data order and insertion points are functions of (seed, step), so a resumed run is
identical to an uninterrupted one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from tqdm import tqdm

from draftsman.bench.dataset_loaders import sharegpt_conversations
from draftsman.core import GenerationConfig
from draftsman.device import DEVICE_HELP, resolve_device, to_host
from draftsman.engine import DEFAULT_TARGET, load_bundle
from draftsman.models.base import DecoderLM
from draftsman.models.prompt_tokens import TREES_FILE, PromptTokens
from draftsman.strategies.parallel_prompt import ParallelPrompt
from draftsman.trees.layout import TreeSpec, layout
from draftsman.trees.sparse import PRIOR_ACCURACY, build_tree_table, make_trees
from draftsman.verification.prompt_tree import TreeDecoder

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainConfig:
    count: int = 3  # m: prompt tokens
    epts: int = 1  # n: ensemble prompt tokens per prompt token
    steps: int = 200
    lr: float = 0.01
    alpha: float = 0.8  # distance decay of the loss
    insertions: int = 48  # insertion points per sequence (one forward)
    batch: int = 1  # sequences per optimiser step (gradient accumulation)
    kl: str = "forward"  # "forward" = KL(teacher || student), "reverse"
    eval_every: int = 50
    checkpoint_every: int = 20
    seed: int = 0


@dataclass
class Example:
    """A token sequence and the first index where insertion points may go (the response)."""

    ids: list[int]
    first: int = 1


def _examples(seqs: Sequence[Example | list[int]]) -> list[Example]:
    return [s if isinstance(s, Example) else Example(list(s), 1) for s in seqs]


class _NoCache:
    """A write-through stand-in for KVCache: one full forward, nothing kept (training)."""

    length = 0

    def check_room(self, end: int) -> None:
        return None

    def set_length(self, length: int) -> None:
        return None

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        return k, v


_FORWARD = inspect.unwrap(DecoderLM.forward)  # the forward without inference mode


def _grad_ready(model: DecoderLM) -> None:
    """Tables built lazily inside an inference-mode forward cannot enter autograd: drop them
    so the grad-mode forward rebuilds them (RoPE cos/sin of the Llama family)."""
    rope = getattr(model, "_rope", None)
    if rope is not None and rope.cos.is_inference():
        model._rope = None


def insertion_points(n_tokens: int, first: int, m: int, count: int,
                     gen: random.Random) -> list[int]:
    """Up to `count` distinct t in [first-1, n_tokens-1-m] (every prompt has a teacher row)."""
    lo, hi = max(0, first - 1), n_tokens - 1 - m
    if hi < lo:
        return []
    pool = list(range(lo, hi + 1))
    return sorted(gen.sample(pool, min(count, len(pool))))


def _chains(model: DecoderLM, emb: torch.Tensor, ids: list[int], points: list[int]
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over the sequence with a chain of the m prompt tokens after each point.

    Returns the hidden states [S + P, H] and the rows of the chains [I, m, n] (EPT n)."""
    m, n, _ = emb.shape
    s = len(ids)
    marks = set(points)
    spec = TreeSpec(tuple((0,) * d for d in range(s)),
                    tuple(m if d in marks else 0 for d in range(s)))
    lay = layout(spec, n)  # built on the host, moved once per forward
    dev = model.device
    tokens = torch.tensor(ids, dtype=torch.long, device=dev)[None]
    pos = lay.offsets.to(dev)[None]
    real = model.embed(tokens, pos[:, :s])  # [1, S, H]
    index, ept = lay.prompt_index.to(dev) - 1, lay.prompt_ept.to(dev)
    prompt = emb.to(dev, model.dtype)[index, ept][None]  # [1, P, H]
    embeds = torch.cat([real, prompt], dim=1)
    _grad_ready(model)
    out = _FORWARD(model, None, pos, _NoCache(), mask=lay.mask.to(dev), inputs_embeds=embeds,
                   logits_at=None, start=0)
    return out.hidden[0], lay.prompt_rows.to(dev)[torch.tensor(points, device=dev)]


def chain_forward(model: DecoderLM, emb: torch.Tensor, ids: list[int], points: list[int]
                  ) -> torch.Tensor:
    """The prompt tokens' guesses after each point: logits [I, m, V], EPT-averaged; prompt
    token i after point t guesses token t + 1 + i (as in the decoder's tree)."""
    hidden, rows = _chains(model, emb, ids, points)
    return _guesses(model, hidden, rows)


def _guesses(model: DecoderLM, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Head logits of the chain rows [I, m, n] -> [I, m, V], averaged over the n EPTs."""
    i, m, n = rows.shape
    return model.head(hidden[rows.reshape(-1)]).float().view(i, m, n, -1).mean(2)


def distill_forward(model: DecoderLM, emb: torch.Tensor, ids: list[int], points: list[int]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over the sequence with prompt chains at `points`.

    Returns student logits [I, m, V] (EPT-averaged, differentiable w.r.t. emb [m, n, H]) and
    teacher logits [I, m, V] (the target at real rows t+i, detached).
    """
    m = emb.shape[0]
    hidden, rows = _chains(model, emb, ids, points)
    student = _guesses(model, hidden, rows)
    pt = torch.tensor(points, dtype=torch.long, device=hidden.device)
    teacher_rows = pt[:, None] + torch.arange(1, m + 1, device=hidden.device)[None]  # [I, m]
    with torch.no_grad():
        teacher = model.head(hidden[teacher_rows.reshape(-1)].detach()).float()
    return student, teacher.view(len(points), m, -1)


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, alpha: float,
                 kl: str = "forward") -> torch.Tensor:
    """mean_t sum_i alpha^(i-1) KL_i, student/teacher logits [I, m, V]."""
    ls = torch.log_softmax(student, -1)
    lt = torch.log_softmax(teacher, -1)
    if kl == "forward":
        per = (lt.exp() * (lt - ls)).sum(-1)  # KL(P_teacher || Q_student) [I, m]
    elif kl == "reverse":
        per = (ls.exp() * (ls - lt)).sum(-1)
    else:
        raise ValueError(f"kl must be forward or reverse, got {kl!r}")
    decay = alpha ** torch.arange(per.shape[1], dtype=per.dtype, device=per.device)
    return (per * decay).sum(-1).mean()


def cosine_lr(step: int, total: int, lr: float) -> float:
    return 0.5 * lr * (1 + math.cos(math.pi * min(step, total) / max(total, 1)))


@torch.no_grad()
def evaluate(model: DecoderLM, emb: torch.Tensor, seqs: Sequence[Example], cfg: TrainConfig,
             topk: int = 10, seed: int = 12345) -> dict:
    """Held-out loss and rank accuracies: acc[i][r] = P(rank of the teacher's argmax at
    distance i+1 in the student's guesses == r), r < topk (Figure 6 / sparse_tree input)."""
    gen = random.Random(seed)
    m = emb.shape[0]
    total, count = 0.0, 0
    hits = torch.zeros(m, topk, device=model.device)
    n_pts = 0
    for ex in seqs:
        pts = insertion_points(len(ex.ids), ex.first, m, cfg.insertions, gen)
        if not pts:
            continue
        student, teacher = distill_forward(model, emb, ex.ids, pts)
        total += float(distill_loss(student, teacher, cfg.alpha, cfg.kl)) * len(pts)
        count += len(pts)
        truth = teacher.argmax(-1)  # [I, m]
        ranks = (student > student.gather(-1, truth[..., None])).sum(-1)  # [I, m]
        for r in range(topk):
            hits[:, r] += (ranks == r).sum(0).float()
        n_pts += len(pts)
    acc = (hits / max(n_pts, 1)).tolist()
    return {"loss": total / max(count, 1), "accuracy": acc, "points": n_pts}


def _save_checkpoint(folder: Path, emb: torch.Tensor, opt: torch.optim.Optimizer, step: int,
                     cfg: TrainConfig, history: list) -> None:
    tmp = folder / (CHECKPOINT + ".tmp")
    # on the host, so a checkpoint written on a GPU resumes on the CPU too
    torch.save({"embeddings": emb.detach().cpu().clone(), "optimizer": to_host(opt.state_dict()),
                "step": step, "config": asdict(cfg), "history": history}, tmp)
    tmp.replace(folder / CHECKPOINT)


def train(model: DecoderLM, train_seqs: Sequence[Example | list[int]],
          heldout: Sequence[Example | list[int]], cfg: TrainConfig, out: str | Path,
          *, resume: bool = True, progress: bool = True, meta: dict | None = None,
          log=None) -> tuple[PromptTokens, list[dict]]:
    """Train (or resume) prompt tokens for `model`; returns them and the eval history.

    The model must be float32 or bfloat16 and is never modified. Writes `out`/checkpoint.pt
    every `checkpoint_every` steps and the final embeddings with `PromptTokens.save(out)`.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_ex, held_ex = _examples(train_seqs), _examples(heldout)
    if not train_ex:
        raise ValueError("no training sequences")
    init = PromptTokens.from_vocabulary(model, cfg.count, cfg.epts, seed=cfg.seed)
    # the embeddings and Adam's moments live on the model's device; the data stays on the host
    emb = torch.nn.Parameter(init.embeddings.clone().to(model.device))
    opt = torch.optim.Adam([emb], lr=cfg.lr)
    step, history = 0, []
    ckpt = out / CHECKPOINT
    if resume and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False, map_location="cpu")
        if state["config"] != asdict(cfg):
            raise ValueError(f"{ckpt} was written with another config; use a new --out or "
                             "--no-resume")
        with torch.no_grad():
            emb.copy_(state["embeddings"])
        opt.load_state_dict(state["optimizer"])
        step, history = int(state["step"]), list(state["history"])
    order = list(range(len(train_ex)))
    random.Random(cfg.seed).shuffle(order)

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)

    if step == 0 and held_ex and cfg.eval_every:
        ev = evaluate(model, emb.detach(), held_ex, cfg)
        history.append({"step": 0, **ev})
        top1 = [round(a[0], 3) for a in ev["accuracy"]]
        say(f"step 0 held-out loss {ev['loss']:.4f} top1 {top1}")
    bar = None
    if progress:
        bar = tqdm(total=cfg.steps, initial=step, desc="prompt tokens", unit="step",
                   dynamic_ncols=True)
    t0 = time.perf_counter()
    while step < cfg.steps:
        lr = cosine_lr(step, cfg.steps, cfg.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss_value = 0.0
        for b in range(cfg.batch):
            ex = train_ex[order[(step * cfg.batch + b) % len(order)]]
            gen = random.Random(cfg.seed * 1_000_003 + step * 131 + b)
            pts = insertion_points(len(ex.ids), ex.first, cfg.count, cfg.insertions, gen)
            if not pts:
                continue
            student, teacher = distill_forward(model, emb, ex.ids, pts)
            loss = distill_loss(student, teacher, cfg.alpha, cfg.kl) / cfg.batch
            loss.backward()
            loss_value += float(loss.detach())
        opt.step()
        step += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.4f}")
        say(f"step {step} loss {loss_value:.4f} lr {lr:.5f} "
            f"elapsed {time.perf_counter() - t0:.0f}s")
        last = step == cfg.steps
        if held_ex and cfg.eval_every and (step % cfg.eval_every == 0 or last):
            ev = evaluate(model, emb.detach(), held_ex, cfg)
            history.append({"step": step, **ev})
            say(f"step {step} held-out loss {ev['loss']:.4f} "
                f"top1 {[round(a[0], 3) for a in ev['accuracy']]}")
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or last):
            _save_checkpoint(out, emb, opt, step, cfg, history)
    if bar is not None:
        bar.close()
    prompts = PromptTokens(emb.detach().cpu().clone(), {**init.meta, **(meta or {}),
                                                   "train": asdict(cfg), "history": history})
    prompts.save(out)
    return prompts, history


# ----------------------------------------------------------------------------- data


def sharegpt_examples(tokenizer, count: int, seq_len: int, skip: int = 0,
                      max_prompt: int | None = None) -> list[Example]:
    """First user turn (chat template) + the assistant's reply, cut to `seq_len` tokens;
    insertion points go in the reply. Conversations whose prompt leaves no room are skipped."""
    max_prompt = max_prompt or seq_len // 2
    out: list[Example] = []
    seen = 0
    for conv in sharegpt_conversations():
        if len(conv) < 2 or conv[0]["role"] != "user" or conv[1]["role"] != "assistant":
            continue
        if not conv[0]["content"].strip() or not conv[1]["content"].strip():
            continue
        seen += 1
        if seen <= skip:
            continue
        prompt = tokenizer.encode_chat([conv[0]])
        if len(prompt) > max_prompt:
            continue
        reply = tokenizer.encode(conv[1]["content"], special=False)
        ids = (prompt + reply)[:seq_len]
        if len(ids) - len(prompt) < 16:
            continue
        out.append(Example(ids, len(prompt)))
        if len(out) >= count:
            break
    return out


def self_distilled_examples(model: DecoderLM, prompts: PromptTokens, tokenizer,
                            sources: Sequence[Example], new_tokens: int) -> list[Example]:
    """The target's own greedy replies to the prompts of `sources` (generated with parallel
    prompt decoding, which is exact, so it costs fewer target forwards)."""
    trees = make_trees("dynamic", PRIOR_ACCURACY, prompts.count, 16, prompts.epts).states
    strat = ParallelPrompt(TreeDecoder(model, prompts, trees))
    config = GenerationConfig(new_tokens, eos_token_ids=tokenizer.eos_token_ids)
    out = []
    for ex in sources:
        prompt = ex.ids[: ex.first]
        reply = [t for s in strat.generate(prompt, config) for t in s.tokens]
        out.append(Example(prompt + reply, ex.first))
    return out


# ----------------------------------------------------------------------------- CLI


def register(train_subparsers: argparse._SubParsersAction) -> None:
    d = TrainConfig()
    p = train_subparsers.add_parser(
        "prompt-tokens", help="train parallel-prompt-decoding embeddings for a target",
        description="Distil the target's own next-token distributions into m prompt-token "
                    "embeddings (target frozen), then measure per-distance accuracies on "
                    "the target's own greedy replies and cache the dynamic sparse trees.")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--out", default=None,
                   help="output folder (default: <model folder>/prompt_tokens)")
    p.add_argument("--count", type=int, default=d.count, help="prompt tokens m (default 3)")
    p.add_argument("--epts", type=int, default=d.epts, help="EPTs per prompt token (default 1)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--alpha", type=float, default=d.alpha)
    p.add_argument("--insertions", type=int, default=d.insertions,
                   help="insertion points per sequence")
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--kl", choices=["forward", "reverse"], default=d.kl)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--conversations", type=int, default=400,
                   help="ShareGPT conversations to train on")
    p.add_argument("--heldout", type=int, default=8, help="held-out ShareGPT conversations")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--calibrate", type=int, default=8,
                   help="validation prompts whose greedy replies calibrate the trees (0: skip)")
    p.add_argument("--calibrate-tokens", type=int, default=96)
    p.add_argument("--max-rows", type=int, default=64, help="largest tree size cached")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help=DEVICE_HELP + "; the saved embeddings serve any device")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    bundle = load_bundle(args.target, args.dtype, device=device)
    model, tok = bundle.model, bundle.tokenizer
    out = Path(args.out) if args.out else bundle.folder / "prompt_tokens"
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    print(f"loading {args.conversations + args.heldout + args.calibrate} ShareGPT "
          f"conversations", file=sys.stderr, flush=True)
    data = sharegpt_examples(tok, args.conversations + args.heldout + args.calibrate,
                             args.seq_len)
    train_ex = data[: args.conversations]
    held = data[args.conversations: args.conversations + args.heldout]
    calib_src = data[args.conversations + args.heldout:]
    meta = {"model": bundle.name, "argv": sys.argv[1:], "data": "ShareGPT",
            "seq_len": args.seq_len, "conversations": len(train_ex)}
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.log").open("a") as log:
        prompts, history = train(model, train_ex, held, cfg, out, resume=not args.no_resume,
                                 progress=not args.no_progress, meta=meta, log=log)
    if history:
        print(f"held-out loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}",
              file=sys.stderr)
    if args.calibrate:
        calibrate(model, prompts, tok, calib_src, args.calibrate_tokens, cfg,
                  list(range(1, args.max_rows + 1)))
    print(str(out))
    return 0


def calibrate(model: DecoderLM, prompts: PromptTokens, tokenizer, sources: Sequence[Example],
              new_tokens: int, cfg: TrainConfig, sizes: Sequence[int]) -> dict:
    """Measure rank accuracies on the target's own greedy replies; cache trees.json."""
    greedy = self_distilled_examples(model, prompts, tokenizer, sources, new_tokens)
    ev = evaluate(model, prompts.embeddings, greedy, cfg)
    table = build_tree_table(ev["accuracy"], prompts.count, prompts.epts, sizes)
    table["calibration"] = {"prompts": len(greedy), "points": ev["points"],
                            "loss": ev["loss"], "tokens": new_tokens}
    (prompts.folder / TREES_FILE).write_text(json.dumps(table) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsman.training.prompt_tokens ...` (same options as the CLI verb)."""
    parser = argparse.ArgumentParser(prog="draftsman train")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prompt-tokens", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
