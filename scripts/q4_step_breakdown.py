#!/usr/bin/env python3
"""Where a torch `--dtype q4` (or q8) decode step spends its time: the kernel or the rest.

Times one forward of T new rows after `--context` cached tokens in one process: as
loaded, then on the fused step's per-call plan (a whole-layers `decoder_layers` call cannot
be wrapped, so both replaced runs take the plan `DRAFTSMAN_LAYERS_CALL=0` runs) as is and
with every K-quant matrix replaced by zeros (no weight read; zeros, as garbage outputs hold
denormals that slow the glue). Both ways a matrix is called are replaced: the module's
forward and the fused CPU step's direct kernel call (`QuantLinear.rows_product`, taken once
into the model's flat plan, which is rebuilt here). The zeros' time is the floor the glue
sets (norms, RoPE, attention, activations, Python); the per-call plan's time less it is the
kernel's share. The step as loaded is printed beside them: where it takes the layers call,
it saves part of the per-call plan's Python. Issue 22 uses it to explain the gap to
llama.cpp.

    scripts/q4_step_breakdown.py                  # T = 1, 4, 16 after 256 tokens
    scripts/q4_step_breakdown.py --rows 1 --repeats 30
    scripts/q4_step_breakdown.py --rows 1,16 --all-logits   # as a verify forward runs
    scripts/q4_step_breakdown.py --rows 1,16 --all-logits --by-matrix
    scripts/q4_step_breakdown.py --dtype q8 --rows 1,16 --all-logits --by-matrix   # int8 rows

`--by-matrix` adds the kernel's time per matrix kind (block type and shape, all layers
together) at each row count, timed around each call: which matrices make a verify dear.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from draftsman.kernels.block_types import I8_ROW
from draftsman.models import fused_cpu_step
from draftsman.models.int8_linear import Int8RecordsMatrix
from draftsman.models.loader import load_model
from draftsman.models.quant_linear import KQuantMatrix, KQuantRecordsMatrix, QuantLinear
from draftsman.store.resolve import resolve_gguf, resolve_model

# the quantised products as this CPU runs them (K-quant blocks; q8's int8 rows)
MATRICES = (KQuantMatrix, KQuantRecordsMatrix, Int8RecordsMatrix)


def time_step(model, cache, context: int, rows: int, repeats: int,
              logits_at: slice) -> tuple[float, float]:
    """(best, median) ms of one forward of `rows` new tokens after `context` cached ones."""
    ids = torch.zeros(1, rows, dtype=torch.long)
    pos = torch.arange(context, context + rows)[None]
    times = []
    for i in range(repeats + 3):  # 3 warm-up forwards
        start = time.perf_counter()
        model(ids, pos, cache, logits_at=logits_at, start=context)
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return min(times), statistics.median(times)


def matrix_kinds(model) -> dict[int, str]:
    """id(matrix module) -> its block type and role, e.g. "Q6_K lm_head"."""
    from gguf import GGMLQuantizationType

    def role(name: str) -> str:  # layers.3.mlp.gate_up_proj.parts.0 -> gate_up_proj
        return [part for part in name.split(".") if not part.isdigit() and part != "parts"][-1]

    def block_type(qtype: int) -> str:  # int8 rows (q8) are not a GGML type
        return "I8_ROW" if qtype == I8_ROW else GGMLQuantizationType(qtype).name

    return {id(m): f"{block_type(int(getattr(m, 'qtype', I8_ROW)))} {role(name)}"
            for name, m in model.named_modules()
            if isinstance(m, MATRICES)}


@contextmanager
def matrices_replaced(model, wrap: Callable[[object, Callable], Callable],
                      direct_calls: bool = True) -> Iterator[None]:
    """Every K-quant product of `model` through `wrap(matrix, product) -> product`, both ways
    it is called: a matrix's forward (and forward_into, a fused projection's part) and the
    fused step's direct kernel calls (QuantLinear.rows_product and swiglu_product, taken once
    into the model's flat plan, which is rebuilt around them; `direct_calls=False`: none, so
    the plan calls the wrapped forwards, adds the biases and runs silu_mul itself: the glue
    then holds the silu * up that the fused gate/up call does in its kernel)."""
    forwards = {kind: kind.forward for kind in MATRICES}
    rows_product, forward_into = QuantLinear.rows_product, KQuantRecordsMatrix.forward_into
    swiglu_product = QuantLinear.swiglu_product

    def forward(self, x):
        return wrap(self, lambda x: forwards[type(self)](self, x))(x)

    def into(self, x, out, col):
        cols = out[:, col:col + self.out_features]

        def product(x):
            forward_into(self, x, out, col)
            return cols

        got = wrap(self, product)(x)
        if got is not cols:  # a replaced product: its columns written here
            cols.copy_(got)

    def direct(self, dtype):
        product = rows_product(self, dtype) if direct_calls else None
        return None if product is None else wrap(self.parts[0], product)

    def swiglu(self, dtype):
        product = swiglu_product(self, dtype) if direct_calls else None
        return None if product is None else wrap(self.parts[0], product)

    layers_in_one_call = fused_cpu_step.layers_in_one_call
    for kind in MATRICES:
        kind.forward = forward
    KQuantRecordsMatrix.forward_into, QuantLinear.rows_product = into, direct
    QuantLinear.swiglu_product = swiglu
    fused_cpu_step.layers_in_one_call = lambda: False  # its C++ calls are not wrappable
    model._fused_cpu_step = None
    try:
        yield
    finally:
        for kind, original in forwards.items():
            kind.forward = original
        KQuantRecordsMatrix.forward_into, QuantLinear.rows_product = forward_into, rows_product
        QuantLinear.swiglu_product = swiglu_product
        fused_cpu_step.layers_in_one_call = layers_in_one_call
        model._fused_cpu_step = None


def as_is(matrix, product: Callable) -> Callable:
    """The product itself (its forward on the per-call plan)."""
    return product


def zeros(matrix, product: Callable) -> Callable:
    """No weight read: zeros of the product's shape (garbage would hold slow denormals)."""
    return lambda x: x.new_zeros(x.shape[0], matrix.out_features)


def by_matrix(model, cache, context: int, rows: list[int], repeats: int,
              logits_at: slice) -> dict[str, dict[int, float]]:
    """kind -> rows -> median ms per forward the kernel spends on that kind of matrix."""
    kinds = matrix_kinds(model)
    spent: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    per_forward: dict[str, float] = defaultdict(float)

    def timed(matrix, product):
        def run(x):
            start = time.perf_counter()
            out = product(x)
            name = f"{kinds[id(matrix)]} {matrix.out_features}x{x.shape[-1]}"
            per_forward[name] += (time.perf_counter() - start) * 1e3
            return out
        return run

    with matrices_replaced(model, timed):
        for t in rows:
            ids, pos = torch.zeros(1, t, dtype=torch.long), torch.arange(context, context + t)[None]
            for i in range(repeats + 3):
                per_forward.clear()
                model(ids, pos, cache, logits_at=logits_at, start=context)
                if i >= 3:
                    for name, ms in per_forward.items():
                        spent[name][t].append(ms)
    return {name: {t: statistics.median(v) for t, v in by_rows.items()}
            for name, by_rows in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--rows", default="1,4,16", help="comma-separated new-token counts")
    p.add_argument("--context", type=int, default=256, help="cached tokens before the step")
    p.add_argument("--dtype", default="q4", choices=("q4", "q4-draft", "q8"),
                   help="q4-draft: a draft's format (every matrix on Q4_K blocks); q8: int8 rows")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--all-logits", action="store_true",
                   help="logits on every row, as a verify forward needs (default: the last row)")
    p.add_argument("--by-matrix", action="store_true",
                   help="also the kernel's ms per matrix kind at each row count")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(resolve_model(a.model, pull=False), a.dtype,
                       gguf=resolve_gguf(a.model, pull=False))
    # the matrices as this CPU runs them: vector paths, or AMX tiles (packed records)
    blocks = sum((m.blocks if isinstance(m, KQuantMatrix) else m.packed).numel()
                 for m in model.modules() if isinstance(m, MATRICES))
    rows = [int(r) for r in a.rows.split(",")]
    cache = model.new_cache(a.context + max(rows))
    model(torch.randint(0, 1000, (1, a.context)), torch.arange(a.context)[None], cache,
          logits_at=slice(-1, None))
    logits_at = slice(None) if a.all_logits else slice(-1, None)
    real = {t: time_step(model, cache, a.context, t, a.repeats, logits_at) for t in rows}
    with matrices_replaced(model, as_is):
        per_call = {t: time_step(model, cache, a.context, t, a.repeats, logits_at) for t in rows}
    with matrices_replaced(model, zeros, direct_calls=False):
        zeroed = {t: time_step(model, cache, a.context, t, a.repeats, logits_at) for t in rows}
    print(f"{a.model} {a.dtype}, {platform.processor() or platform.machine()}, "
          f"{a.threads} threads, {blocks / 2**20:.0f} MiB of K-quant blocks, "
          f"{a.context} cached tokens")
    print("| rows | step ms (best / median) | per-call plan ms | its glue (zeros) ms "
          "| kernel ms | kernel GB/s |")
    print("|---|---|---|---|---|---|")
    for t in rows:
        kernel = per_call[t][1] - zeroed[t][1]
        print(f"| {t} | {real[t][0]:.1f} / {real[t][1]:.1f} | {per_call[t][1]:.1f} "
              f"| {zeroed[t][1]:.1f} | {kernel:.1f} | {blocks / kernel / 1e6:.1f} |")
    if a.by_matrix:
        costs = by_matrix(model, cache, a.context, rows, a.repeats, logits_at)
        first, last = rows[0], rows[-1]
        print(f"\n| matrix kind (all layers) | {' | '.join(f'{t} rows ms' for t in rows)} "
              f"| {last} rows / {first} |")
        print("|---|" + "---|" * (len(rows) + 1))
        for name, ms in sorted(costs.items(), key=lambda kv: -kv[1][last]):
            print(f"| {name} | {' | '.join(f'{ms[t]:.1f}' for t in rows)} "
                  f"| {ms[last] / ms[first]:.2f} |")


if __name__ == "__main__":
    main()
