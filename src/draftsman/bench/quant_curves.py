"""Forward cost curves of quantised models with random weights, interleaved in one process.

A quantised forward's cost depends on the shapes and block types of the weights, never on
their values, so a CPU we can reach only without its models (a lent GPU machine's host: 64 MiB
a call, the 1.5B's GGUF is 1.1 GB) can still time `q4`, `q4-draft` and `q8` models of the
real shapes: the config gives the shapes, `gguf-types.json` beside it (written by
scripts/gpu_carry.py from the real GGUF) the block type of every matrix, and the blocks are
random valid bytes of those types (small fp16 scales). The models are built as the loader
builds them (`build_model` without Linears, then `quantize_model` from the blocks; q8 from
random bf16 weights), so they take the same kernels the real ones take on that CPU.

Each round times one forward of every n new rows after `--context` cached tokens (a tree
mask, logits on every row, as `draftsman profile` does) for every contestant in turn, the
order rotating, so a slow spell falls on all. Reports best and median ms per n and
v(n) = L(n) / L(1) as the median of each round's ratio.

    python -m draftsman.bench.quant_curves --like DIR[,DIR] --contestants q4,q8 \\
        --threads 2 --rounds 10 --out curves.json

A contestant is a dtype, optionally with `@records` / `@onednn` (the 8-bit kernel forced,
DRAFTSMAN_INT8_KERNEL) or `@vectors` (AMX tiles off for the K-quant records,
DRAFTSMAN_KQUANT_AMX=0; read once per process, so only as the first contestant's setting).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from draftsman.errors import DraftsmanError
from draftsman.hardware import cpu_flags, cpu_model
from draftsman.kernels.random_blocks import random_block_rows
from draftsman.models.base import DecoderLM
from draftsman.models.config import ModelConfig
from draftsman.models.loader import build_model
from draftsman.models.quant_linear import quantize_model
from draftsman.models.weight_formats import INT8_KERNEL_NAMES, int8_kernel
from draftsman.store.gguf_blocks import BlockTensor

TYPES_FILE = "gguf-types.json"
ISA = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def hf_shapes(like: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of the Hugging Face model of `like`'s config: name -> shape (meta)."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.from_pretrained(str(like))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    return {name: tuple(t.shape) for name, t in hf.state_dict().items()}


def block_types(like: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """HF name -> GGML type: the real GGUF's (gguf-types.json), else Q4_K where the width is
    a multiple of 256 and Q8_0 elsewhere (tiny dry-run models)."""
    path = like / TYPES_FILE
    if path.is_file():
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    return {name: 12 if shape[1] % 256 == 0 else 8 for name, shape in shapes.items()
            if len(shape) == 2}


def random_model(like: Path, dtype: str, seed: int = 0) -> DecoderLM:
    """`like`'s architecture in `dtype` (q4, q4-draft, q8) with random weights, built as the
    loader builds a quantised model from its folder and GGUF."""
    config = ModelConfig.from_folder(like)
    shapes = hf_shapes(like)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if len(shape) == 1:
            return torch.ones(shape) if "norm" in name else torch.randn(shape, generator=gen) * 0.02
        return torch.randn(shape, generator=gen) * 0.02

    if dtype == "q8":  # q8 of the folder's own weights: every tensor drawn in bf16
        state = {n: draw(n, s).to(torch.bfloat16) for n, s in shapes.items()}
        return quantize_model(build_model(config, state, torch.bfloat16), "q8")
    types = block_types(like, shapes)
    blocks = {name: BlockTensor(name, qtype, shapes[name][:2],
                                random_block_rows(qtype, *shapes[name][:2], rng))
              for name, qtype in types.items() if name in shapes}
    state = {n: draw(n, s).to(torch.bfloat16) for n, s in shapes.items()
             if len(s) == 1 or n == "model.embed_tokens.weight"}
    model = build_model(config, state, torch.bfloat16, without_linears=True)
    model = quantize_model(model, dtype, blocks)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"no random weights for {left[:3]}")
    return model


class Contestant:
    """One random model on one kernel choice, with its cache and inputs for every n."""

    def __init__(self, like: Path, spec: str, lengths: list[int], context: int) -> None:
        dtype, _, kernel = spec.partition("@")
        self.name = f"{like.name} {spec}"
        if kernel in ("records", "onednn"):
            os.environ["DRAFTSMAN_INT8_KERNEL"] = kernel
        self.model = random_model(like, dtype)
        self.summary = dict(getattr(self.model, "quant_summary", {}))
        self.summary["8-bit kernel"] = INT8_KERNEL_NAMES[int8_kernel()]
        os.environ.pop("DRAFTSMAN_INT8_KERNEL", None)
        vocab = self.model.config.vocab_size
        gen = torch.Generator().manual_seed(1)
        self.context = context
        self.cache = self.model.new_cache(context + max(lengths) + 1)
        with torch.inference_mode():
            self.model(torch.randint(0, vocab, (1, context), generator=gen),
                       torch.arange(context)[None], self.cache)
        self.inputs = {n: (torch.randint(0, vocab, (1, n), generator=gen),
                           torch.arange(context, context + n)[None],
                           torch.ones(n, n, dtype=torch.bool).tril()) for n in lengths}

    def forward(self, n: int) -> float:
        tokens, pos, mask = self.inputs[n]
        self.cache.truncate(self.context)
        t0 = time.perf_counter()
        self.model(tokens, pos, self.cache, mask=mask)
        return time.perf_counter() - t0


def time_rounds(contestants: list[Contestant], lengths: list[int], rounds: int
                ) -> list[dict[str, float]]:
    """Round 0 warms up; each later round times every (contestant, n), the order rotating."""
    keys = [(c, n) for c in contestants for n in lengths]
    out = []
    with torch.inference_mode():
        for r in range(rounds + 1):
            shift = r % len(keys)
            times = {f"{c.name}|{n}": c.forward(n) for c, n in keys[shift:] + keys[:shift]}
            if r:
                out.append(times)
    return out


def table(contestants: list[Contestant], lengths: list[int], rounds: list[dict[str, float]]
          ) -> str:
    head = "| model, dtype | " + " | ".join(f"n={n}" for n in lengths) + " |"
    lines = [head, "|" + "---|" * (len(lengths) + 1)]
    for c in contestants:
        cells = []
        for n in lengths:
            ts = [r[f"{c.name}|{n}"] for r in rounds]
            ratio = statistics.median(r[f"{c.name}|{n}"] / r[f"{c.name}|1"] for r in rounds)
            cells.append(f"{statistics.median(ts) * 1e3:.1f} ({ratio:.2f})")
        lines.append(f"| {c.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--like", required=True,
                   help="model folders (config.json, optional gguf-types.json), comma separated")
    p.add_argument("--contestants", default="q4,q8",
                   help="dtypes, each optionally @records, @onednn or @vectors (default q4,q8)")
    p.add_argument("--lengths", default="1,2,4,8,16")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--build-threads", type=int, default=None,
                   help="threads while the random models are built (default: all)")
    p.add_argument("--out", type=Path, default=None, help="JSON of every round and the table")
    a = p.parse_args(argv)
    specs = [s for s in a.contestants.split(",") if s]
    if any(s.endswith("@vectors") for s in specs):
        os.environ["DRAFTSMAN_KQUANT_AMX"] = "0"
    lengths = [int(n) for n in a.lengths.split(",")]
    if a.build_threads:
        torch.set_num_threads(a.build_threads)
    contestants = []
    for like in (Path(x) for x in a.like.split(",")):
        for spec in specs:
            t0 = time.perf_counter()
            try:
                contestants.append(Contestant(like, spec, lengths, a.context))
            except DraftsmanError as exc:  # a kernel forced where it cannot run
                print(f"skipped {like.name} {spec}: {exc}", flush=True)
                continue
            print(f"built {contestants[-1].name} in {time.perf_counter() - t0:.0f} s: "
                  f"{contestants[-1].summary}", flush=True)
    torch.set_num_threads(a.threads)
    rounds = time_rounds(contestants, lengths, a.rounds)
    text = (f"{cpu_model()} ({' '.join(f for f in ISA if f in cpu_flags())}), {a.threads} "
            f"threads, {a.context} cached tokens, median ms of {a.rounds} rounds "
            f"(v(n) = median of each round's L(n) / L(1)); random weights\n\n"
            + table(contestants, lengths, rounds))
    print(text, flush=True)
    if a.out:
        a.out.write_text(json.dumps({
            "cpu": cpu_model(), "isa": sorted(cpu_flags() & set(ISA)), "threads": a.threads,
            "context": a.context, "lengths": lengths, "weights": "random",
            "summaries": {c.name: c.summary for c in contestants}, "rounds": rounds,
            "table": text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
