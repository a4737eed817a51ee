"""Where one static decode step's device time goes: kernels by total time, for one model.

A CUDA graph replays the kernels the eager static step launches, so profiling the eager
step (`static_forward`, the function the graph captured) shows the replay's kernels and
their times; the wall time of an eager step beside the summed kernel time says how much
the launches cost that the graph removes.

    python -m draftsman.bench.step_breakdown --target FOLDER --device cuda [--rows 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from draftsman.engine import load_bundle
from draftsman.models.static_step import static_forward, step_inputs


def breakdown(target: str, device: str, rows: int = 1, context: int = 512,
              steps: int = 20) -> str:
    model = load_bundle(target, "bf16", device=device).model
    cache = model.new_cache(context + 64 + 1)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    model(torch.randint(0, vocab, (1, context), generator=gen), torch.arange(context)[None],
          cache)
    tokens = torch.randint(0, vocab, (1, rows), generator=gen).to(model.device)
    inputs = step_inputs(tokens, torch.arange(context, context + rows)[None], context, None,
                         rows, model.config.sliding_window).to(model.device)
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step() -> None:
        with torch.inference_mode():
            static_forward(model, cache.k, cache.v, inputs)

    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    wall_ms = (time.perf_counter() - t0) / steps * 1e3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    kernels = sorted((e for e in events if getattr(e, key, 0) > 0),
                     key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in kernels) / steps / 1e3
    lines = [f"# One static step: {Path(target).name}, {rows} row(s), {context} cached tokens, "
             f"{torch.cuda.get_device_name() if cuda else 'CPU'}", "",
             f"eager step wall {wall_ms:.3f} ms; {'device' if cuda else 'CPU'} time summed "
             f"over ops {total:.3f} ms per step", "",
             "| op / kernel | calls per step | ms per step | share |", "|---|---|---|---|"]
    for e in kernels[:30]:
        ms = getattr(e, key) / steps / 1e3
        lines.append(f"| `{e.key[:90]}` | {e.count / steps:.0f} | {ms:.4f} | "
                     f"{ms / total:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    text = breakdown(args.target, args.device, args.rows, args.context)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
