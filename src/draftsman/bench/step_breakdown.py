"""Where one static decode step's device time goes: kernels by total time, for one model.

A CUDA graph replays the kernels the eager static step launches, so profiling the eager
step (`static_forward`, the function the graph captured) shows the replay's kernels and
their times; the wall time of an eager step beside the summed kernel time says how much
the launches cost that the graph removes. `--compile` profiles the step as `--static
--compile` runs it (inductor's fused kernels, which the graph replays the same way).

`--loop` asks another question: what a one-sequence decode costs per token beyond its forward
(gpu-h200/all-families: eager AR took 77 ms a token over a 28 ms forward). It times and
profiles the loop (host one step ahead, and with a host sync per token) beside bare
forwards, token for token, and counts the host syncs each makes; with `--static` (and
`--compile`) over static steps, where the host's time between steps is what is left.

    python -m draftsman.bench.step_breakdown --target FOLDER --device cuda [--rows 1]
        [--compile] [--loop [--static]]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from draftsman.core import GenerationConfig
from draftsman.engine import load_bundle
from draftsman.models.static_step import StaticConfig, static_forward, step_inputs
from draftsman.strategies.autoregressive import Autoregressive


def breakdown(target: str, device: str, rows: int = 1, context: int = 512,
              steps: int = 20, compile: bool = False) -> str:
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

    forward = torch.compile(static_forward, dynamic=None) if compile else static_forward

    def step() -> None:
        with torch.inference_mode():
            forward(model, cache.k, cache.v, inputs)

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
    # on CUDA the kernels alone: an aten op (or inductor's launcher) also reports its
    # kernels' device time, and summing both counted the step twice (gpu-h200 compiled-batched)
    kernels = sorted((e for e in events if getattr(e, key, 0) > 0
                      and (not cuda or e.device_type == DeviceType.CUDA)),
                     key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in kernels) / steps / 1e3
    how = "compiled static" if compile else "static"
    lines = [f"# One {how} step: {Path(target).name}, {rows} row(s), {context} cached tokens, "
             f"{torch.cuda.get_device_name() if cuda else 'CPU'}", "",
             f"eager step wall {wall_ms:.3f} ms; {'device' if cuda else 'CPU'} time summed "
             f"over ops {total:.3f} ms per step", "",
             "| op / kernel | calls per step | ms per step | share |", "|---|---|---|---|"]
    for e in kernels[:30]:
        ms = getattr(e, key) / steps / 1e3
        lines.append(f"| `{e.key[:90]}` | {e.count / steps:.0f} | {ms:.4f} | "
                     f"{ms / total:.1%} |")
    return "\n".join(lines) + "\n"


# host syncs, as the profiler names the calls that wait for the device
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "aten::_local_scalar_dense")


def loop_breakdown(target: str, device: str, tokens: int = 16, context: int = 64,
                   static: StaticConfig | None = None) -> str:
    """A one-sequence eager decode (`Autoregressive`, the engine's loop) beside bare eager
    forwards of one token: ms per token, host syncs per token, and the ops whose host time
    differs most between the two. Warm-up, timing and profile each run at key lengths the
    others never met, as a benchmark's new prompts do: a cost paid once per length (a
    kernel plan built per shape) shows in the timing rather than hiding in the warm-up."""
    model = load_bundle(target, "bf16", device=device, static=static or False).model
    if static:
        model.warm_up()
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (context + 9 * tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    config = GenerationConfig(max_new_tokens=tokens)

    def decode(run: int, ahead: bool = True) -> float:  # prompts of context + tokens * run
        """Seconds from the first token (the prompt's prefill left out) to the last."""
        steps = Autoregressive(model, ahead).generate(prompt[:context + tokens * run], config)
        next(steps)
        t0 = time.perf_counter()
        for _ in steps:
            pass
        sync()
        return time.perf_counter() - t0

    cache = model.new_cache(len(prompt) + 8)
    model(torch.tensor([prompt[:context]]), torch.arange(context)[None], cache)

    def forwards(run: int) -> float:  # key lengths context + tokens * run + i
        t0 = time.perf_counter()
        for i in range(1, tokens):
            at = context + tokens * run + i
            model(torch.tensor([[prompt[at]]]), torch.tensor([[at]]), cache, start=at)
        sync()
        return time.perf_counter() - t0

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    runs = {}
    # forwards in a profiled run: the loop's prefill and tokens - 1 steps; tokens - 1 bare
    for name, run, first, n in (("decode loop", decode, 0, tokens),
                                ("bare forwards", forwards, 3, tokens - 1),
                                ("decode loop, a host sync per token",
                                 lambda r: decode(r, ahead=False), 6, tokens)):
        run(first)
        wall = run(first + 1) / (tokens - 1) * 1e3
        with profile(activities=activities) as prof:
            run(first + 2)
        ops = {e.key: e for e in prof.key_averages()}
        runs[name] = (wall, ops, n)
    how = "eager" if not static else "static, compiled" if static.compile else "static"
    lines = [f"# One-sequence {how} decode vs bare forwards: {Path(target).name}, {tokens} "
             f"tokens after {context}, {torch.cuda.get_device_name() if cuda else 'CPU'}", "",
             f"Wall: the {tokens - 1} one-token steps after the prompt's (the prefill not "
             "timed). Counts: per forward, the loop's prefill among them.", "",
             "| | ms per token (wall) | host syncs per forward | ops per forward |",
             "|---|---|---|---|"]
    for name, (wall, ops, n) in runs.items():
        syncs = sum(ops[k].count for k in SYNC_EVENTS if k in ops) / n
        count = sum(e.count for k, e in ops.items() if k.startswith("aten::")) / n
        lines.append(f"| {name} | {wall:.3f} | {syncs:.1f} | {count:.0f} |")
    (_, loop, n_loop), (_, bare, n_bare) = runs["decode loop"], runs["bare forwards"]

    def host_ms(ops: dict, key: str) -> float:
        n = n_loop if ops is loop else n_bare
        return ops[key].self_cpu_time_total / n / 1e3 if key in ops else 0.0

    gaps = sorted(set(loop) | set(bare), key=lambda k: host_ms(bare, k) - host_ms(loop, k))
    lines += ["", "Ops whose host time per forward differs most (self CPU ms, decode loop - bare):",
              "", "| op | decode loop calls | ms | bare calls | ms |", "|---|---|---|---|---|"]
    for key in gaps[:20]:
        calls = [ops[key].count / n if key in ops else 0
                 for ops, n in ((loop, n_loop), (bare, n_bare))]
        lines.append(f"| `{key[:80]}` | {calls[0]:.1f} | {host_ms(loop, key):.3f} | "
                     f"{calls[1]:.1f} | {host_ms(bare, key):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--compile", action="store_true",
                   help="profile the step as --static --compile runs it")
    p.add_argument("--loop", action="store_true",
                   help="instead: the one-sequence decode loop beside bare forwards (eager, "
                        "or --static steps, with --compile compiled)")
    p.add_argument("--static", action="store_true", help="with --loop: --static steps")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    static = StaticConfig(compile=args.compile) if args.static or args.compile else None
    text = (loop_breakdown(args.target, args.device, static=static) if args.loop else
            breakdown(args.target, args.device, args.rows, args.context, compile=args.compile))
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
