"""p̂_correct: how often one of the top-k early predictions equals the final token.

Yang et al., "Predictive Pipelined Decoding", section 4.3: generate with the full model and,
for every generated token, compare the early top-k read at layer d̄ (final norm + LM head on
the residual stream after d̄ layers; the shared head "N" or a trained exit head "Y") with the
token the final layer chose:

    p̂_correct(d̄, k) = (1 / n) Σ_t 1[x_t ∈ top-k(z_d̄,t)]

over n generated tokens. Greedy decoding compares with the final top-1; under top-k / top-p
sampling (the paper's Appendix B) with the sampled token.

One generation serves every layer, k and head: the forward runs in layer segments between
the probed layers, keeps the residual stream of the last position after each segment, and
after the generation the heads rank the final token among the early logits. We store the
rank (0 = the early top-1), so p̂ for any k is the share of ranks < k, and a run can be
replayed by the timeline simulator (`draftsman.pipelined_theory`).

Invariants:
- the generated text is the model's own (greedy: identical to `autoregressive`), since the
  segmented forward runs the same layers on the same cache;
- `rank[t, layer, head] < k` iff the final token is among that head's k best early guesses;
- token position t counts generated tokens from 1 (the token read from the prompt's last
  position is position 1).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from draftsman.bench.datasets import load_dataset
from draftsman.errors import InvalidArgumentError
from draftsman.models.base import LAST, DecoderLM
from draftsman.models.exit_heads import ExitTranslator, find_exit_head, load_translator
from draftsman.sampling import Sampler, SamplingConfig

# the paper's probes, 10/20/30/35/37 of 40 layers, as fractions of depth
PAPER_FRACTIONS = (0.25, 0.5, 0.75, 0.875, 0.925)
# task -> (dataset, generated tokens) as in section 4.3 (SQuAD 16, WMT 128, CNN/DM 128)
TASKS: dict[str, tuple[str, int]] = {
    "qa": ("news-qa", 16),
    "translation": ("news-translation", 128),
    "summarization": ("news-summarization", 128),
}
TASK_LABELS = {"qa": "QA", "translation": "Translation", "summarization": "Summarization"}
SAMPLING_MODES: dict[str, SamplingConfig] = {
    "greedy": SamplingConfig(),
    "top-k": SamplingConfig(temperature=1.0, top_k=3),  # Appendix B: k = 3
    "top-p": SamplingConfig(temperature=1.0, top_p=0.95),  # Appendix B: p = 0.95
}
HEADS = ("shared", "trained")
MISSING = -1  # rank when a head is not available for a layer


@dataclass
class Generation:
    """One prompt's generation and the final token's early ranks."""

    model: str
    task: str
    prompt_id: str
    mode: str  # sampling mode
    layers: list[int]
    tokens: list[int]
    ranks: list[list[list[int]]]  # [t][layer index][head index] (MISSING if no head)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class ProbeHeads:
    """For each probed layer: the shared head and, when one exists, a trained translator."""

    layers: list[int]
    trained: dict[int, ExitTranslator] = field(default_factory=dict)


def find_trained_heads(model: DecoderLM, folder: Path | None, layers: Iterable[int],
                       ) -> dict[int, ExitTranslator]:
    out = {}
    for layer in layers:
        path = find_exit_head(folder, layer)
        if path is not None:
            out[layer] = load_translator(path, model)
    return out


# ----------------------------------------------------------------------------- collection


def _segments(layers: Sequence[int], depth: int) -> list[range]:
    bounds = [0, *sorted(set(layers)), depth]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@torch.inference_mode()
def _probed_step(model: DecoderLM, ids: list[int] | None, start: int, cache,
                 segments: list[range]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward in layer segments: final logits [V] at the last position and the
    residual stream [H] after each probed layer (the end of each segment but the last)."""
    n = len(ids)
    tokens = torch.tensor([ids], dtype=torch.long)
    pos = torch.arange(start, start + n, dtype=torch.long)[None]
    x = None
    probes: list[torch.Tensor] = []
    logits = None
    for seg in segments:
        last = seg.stop == model.config.num_layers
        out = model(tokens if seg.start == 0 else None, pos, cache, layers=seg, hidden_from=x,
                    start=start, logits_at=LAST if last else None)
        x = out.hidden
        if last:
            logits = out.logits[0, -1]
        else:
            probes.append(x[0, -1].clone())
    return logits, probes


def _head_logits(normed: torch.Tensor, weight: torch.Tensor, chunk: int = 32768
                 ) -> torch.Tensor:
    """normed [N, H] float32 x weight [V, H] (any dtype) -> logits [N, V] float32, converting
    the weight in row chunks so a bf16 head never needs a full float32 copy."""
    out = torch.empty(normed.shape[0], weight.shape[0], dtype=torch.float32)
    for a in range(0, weight.shape[0], chunk):
        out[:, a:a + chunk] = F.linear(normed, weight[a:a + chunk].float())
    return out


def _rank(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [N, V], targets [N] -> how many tokens score strictly higher [N]."""
    own = logits.gather(1, targets[:, None])
    return (logits > own).sum(1)


@torch.inference_mode()
def early_ranks(model: DecoderLM, hidden: torch.Tensor, tokens: torch.Tensor,
                translator: ExitTranslator | None) -> torch.Tensor:
    """hidden [N, H] after some layer, final tokens [N] -> ranks [N] under one head."""
    normed = model.norm(hidden.to(model.dtype)).float()
    if translator is None:
        logits = _head_logits(normed, model.lm_head.weight)
    else:
        y = translator.float()(normed)
        logits = y if translator.gives_logits else _head_logits(y, model.lm_head.weight)
    return _rank(logits, tokens)


def generate_with_probes(model: DecoderLM, prompt_ids: list[int], max_new_tokens: int,
                         heads: ProbeHeads, *, sampling: SamplingConfig | None = None,
                         eos: frozenset[int] = frozenset()) -> tuple[list[int], torch.Tensor]:
    """Generate (greedy or sampled) and rank each final token under every probe head.

    Returns the generated tokens and ranks [T, len(layers), 2] (head 0 shared, 1 trained;
    MISSING where a layer has no trained head).
    """
    depth = model.config.num_layers
    segments = _segments(heads.layers, depth)
    cache = model.new_cache(len(prompt_ids) + max_new_tokens + 1)
    sampler = Sampler(sampling or SamplingConfig())
    tokens: list[int] = []
    probes: list[list[torch.Tensor]] = []
    ids, start = list(prompt_ids), 0
    while len(tokens) < max_new_tokens:
        logits, hidden = _probed_step(model, ids, start, cache, segments)
        token = sampler.pick(logits)
        tokens.append(token)
        probes.append(hidden)
        start += len(ids)
        ids = [token]
        if token in eos:
            break
    order = sorted(set(heads.layers))
    targets = torch.tensor(tokens, dtype=torch.long)
    ranks = torch.full((len(tokens), len(heads.layers), 2), MISSING, dtype=torch.long)
    for j, layer in enumerate(heads.layers):
        hid = torch.stack([p[order.index(layer)] for p in probes])  # [T, H]
        ranks[:, j, 0] = early_ranks(model, hid, targets, None)
        if layer in heads.trained:
            ranks[:, j, 1] = early_ranks(model, hid, targets, heads.trained[layer])
    return tokens, ranks


def encode(tokenizer: Any, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.encode_chat([{"role": "user", "content": text}])
    return tokenizer.encode(text)


@dataclass(frozen=True)
class RunConfig:
    tasks: tuple[str, ...] = tuple(TASKS)
    limit: int = 8
    layers: tuple[int, ...] = ()
    modes: tuple[str, ...] = ("greedy",)
    sampled_tasks: tuple[str, ...] = ("summarization", "qa")  # Appendix B: CNN/DM, SQuAD
    lengths: tuple[tuple[str, int], ...] = ()  # overrides of TASKS' lengths
    chat: bool = True
    seed: int = 0

    def length(self, task: str) -> int:
        return dict(self.lengths).get(task, TASKS[task][1])


def collect(model: DecoderLM, tokenizer: Any, name: str, heads: ProbeHeads, cfg: RunConfig,
            *, done: set[tuple[str, str, str]] | None = None,
            emit: Callable[[Generation], None] | None = None,
            progress: Callable[[str], None] | None = None) -> list[Generation]:
    """Run every (mode, task, prompt) not in `done`; `emit` sees each Generation at once
    (so a caller can append it to a file and resume later)."""
    for task in cfg.tasks:
        if task not in TASKS:
            raise InvalidArgumentError(f"unknown task {task!r}; choose {', '.join(TASKS)}")
    out: list[Generation] = []
    eos = frozenset(getattr(tokenizer, "eos_token_ids", ()) or ())
    for mode in cfg.modes:
        base = SAMPLING_MODES[mode]
        tasks = cfg.tasks if mode == "greedy" else [t for t in cfg.tasks
                                                     if t in cfg.sampled_tasks]
        for task in tasks:
            prompts = load_dataset(TASKS[task][0], limit=cfg.limit)
            for i, prompt in enumerate(prompts):
                if done and (mode, task, prompt.id) in done:
                    continue
                sampling = base if base.greedy else SamplingConfig(
                    base.temperature, base.top_k, base.top_p, seed=cfg.seed + i)
                ids = encode(tokenizer, prompt.text, cfg.chat)
                tokens, ranks = generate_with_probes(model, ids, cfg.length(task), heads,
                                                     sampling=sampling, eos=eos)
                gen = Generation(name, task, prompt.id, mode, list(heads.layers), tokens,
                                 ranks.tolist())
                out.append(gen)
                if emit:
                    emit(gen)
                if progress:
                    progress(f"{name} {mode} {task} {i + 1}/{len(prompts)}: "
                             f"{len(tokens)} tokens")
    return out


def read_generations(path: Path) -> list[Generation]:
    if not path.is_file():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(Generation(**json.loads(line)))
                except (ValueError, TypeError):
                    continue  # a line cut by an interrupted run
    return out


# ----------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Cell:
    hits: int
    total: int

    @property
    def rate(self) -> float | None:
        return self.hits / self.total if self.total else None

    @property
    def stderr(self) -> float | None:
        """Binomial standard error (tokens are not independent: a lower bound)."""
        p = self.rate
        return None if p is None else math.sqrt(p * (1 - p) / self.total)


def match_cell(gens: Iterable[Generation], layer: int, k: int, head: int,
               positions: tuple[int, int] | None = None) -> Cell:
    """p̂ over every generated token (1-based positions in [lo, hi] when given)."""
    hits = total = 0
    for g in gens:
        if layer not in g.layers:
            continue
        j = g.layers.index(layer)
        for t, row in enumerate(g.ranks, start=1):
            if positions and not positions[0] <= t <= positions[1]:
                continue
            r = row[j][head]
            if r == MISSING:
                continue
            total += 1
            hits += r < k
    return Cell(hits, total)


def match_sequence(gen: Generation, layer: int, k: int, head: int = 0) -> list[bool]:
    """matched[t] for t = 1..T: was token t among the early top-k of the pass producing it."""
    j = gen.layers.index(layer)
    return [row[j][head] != MISSING and row[j][head] < k for row in gen.ranks]


def _pct(cell: Cell) -> str:
    return "—" if cell.rate is None else f"{100 * cell.rate:.2f}%"


def _select(gens: Sequence[Generation], **eq: str) -> list[Generation]:
    return [g for g in gens if all(getattr(g, k) == v for k, v in eq.items())]


def layer_label(layer: int, depth: int) -> str:
    return f"{layer} ({layer / depth:.0%})"


def table2(gens: Sequence[Generation], layers: Sequence[int], depth: int,
           ks: Sequence[int] = (1, 3, 5), mode: str = "greedy") -> str:
    """Markdown in the layout of the paper's Table 2: task x k x trained -> p̂ by layer."""
    head = ["dataset", "k", "trained", *(layer_label(x, depth) for x in layers)]
    rows = [head, ["---"] * len(head)]
    for task in TASKS:
        tg = _select(gens, task=task, mode=mode)
        if not tg:
            continue
        for k in ks:
            for h, flag in enumerate(("N", "Y")):
                cells = [match_cell(tg, layer, k, h) for layer in layers]
                if flag == "Y" and not any(c.total for c in cells):
                    continue
                rows.append([TASK_LABELS[task], str(k), flag, *(_pct(c) for c in cells)])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def position_bins(length: int, bins: int = 8) -> list[tuple[int, int]]:
    width = max(1, math.ceil(length / bins))
    return [(a, min(a + width - 1, length)) for a in range(1, length + 1, width)]


def position_table(gens: Sequence[Generation], task: str, length: int, layers: Sequence[int],
                   depth: int, ks: Sequence[int] = (1, 3, 5), mode: str = "greedy") -> str:
    """Markdown in the layout of the paper's Tables 6-8: p̂ by token position."""
    tg = _select(gens, task=task, mode=mode)
    bins = position_bins(length)
    head = ["d̄", "k", "trained", *(f"{a}–{b}" for a, b in bins), "Total"]
    rows = [head, ["---"] * len(head)]
    for layer in layers:
        for k in ks:
            for h, flag in enumerate(("N", "Y")):
                total = match_cell(tg, layer, k, h)
                if not total.total:
                    continue
                cells = [match_cell(tg, layer, k, h, b) for b in bins]
                rows.append([layer_label(layer, depth), str(k), flag,
                             *(_pct(c) for c in cells), _pct(total)])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def sampling_table(gens: Sequence[Generation], layer: int, k: int = 3, head: int = 0,
                   tasks: Sequence[str] = ("summarization", "qa")) -> str:
    """Markdown in the layout of the paper's Table 5: p̂ under greedy / top-k / top-p."""
    names = {"greedy": "Greedy decoding", "top-k": "Top-k sampling (k=3)",
             "top-p": "Top-p sampling (p=0.95)"}
    head_row = ["method", *(TASK_LABELS[t] for t in tasks)]
    rows = [head_row, ["---"] * len(head_row)]
    for mode in SAMPLING_MODES:
        cells = [match_cell(_select(gens, task=t, mode=mode), layer, k, head) for t in tasks]
        if any(c.total for c in cells):
            rows.append([names[mode], *(_pct(c) for c in cells)])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def summary(gens: Sequence[Generation], layers: Sequence[int], ks: Sequence[int] = (1, 3, 5)
            ) -> dict[str, Any]:
    """Every cell as numbers: {mode: {task: {layer: {k: {N|Y: {rate, hits, total}}}}}}."""
    out: dict[str, Any] = {}
    for mode in SAMPLING_MODES:
        for task in TASKS:
            tg = _select(gens, task=task, mode=mode)
            if not tg:
                continue
            for layer in layers:
                for k in ks:
                    for h, flag in enumerate(("N", "Y")):
                        c = match_cell(tg, layer, k, h)
                        if c.total:
                            out.setdefault(mode, {}).setdefault(task, {}).setdefault(
                                str(layer), {}).setdefault(str(k), {})[flag] = {
                                "rate": c.rate, "hits": c.hits, "total": c.total}
    return out
