"""`draftsman profile`: forward latency vs input length on this machine (L_fp(n)).

Parallel prompt decoding picks its tree size n to maximise τ(n) / L_fp(n) (Chen et al.,
section 4.2). τ(n) comes from the prompt tokens' calibration (trees.json); L_fp(n) is
measured here, once per model / dtype / thread count, and saved under
$DRAFTSMAN_HOME/profiles/ where the `parallel-prompt` strategy finds it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from draftsman.bench.results import environment
from draftsman.cli.common import add_device_arg, command_line, positive_ints
from draftsman.cli.generate_cmd import add_compile_arg, add_numerics_arg, static_option
from draftsman.engine import DEFAULT_TARGET, load_bundle
from draftsman.errors import InvalidArgumentError
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.models.weight_formats import DTYPE_CHOICES
from draftsman.profiling import (
    dot_rate,
    measure_rounds,
    medians,
    memory_stream_gbs,
    model_kind,
    profile_path,
    round_ratios,
    save_profile,
)
from draftsman.records_floor import floor_curve
from draftsman.trees.sparse import predicted_speedups

DEFAULT_LENGTHS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def parse_lengths(text: str) -> list[int]:
    return sorted(set(positive_ints(text, "lengths")))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure forward latency vs input length (hardware-aware trees)",
        description="Time one target forward over n new tokens after a fixed context, for "
                    "each n, and save the curve for parallel-prompt's tree-size choice. On the "
                    "CPU it also reads the host's memory stream (GB/s) and its rate of integer "
                    "dot products (vpdpbusd) before and after the curve: a one-row step "
                    "streams its weights, so its time moves with the stream, and where every "
                    "product runs on the records' AVX-512 VNNI vectors it prints the floor, the "
                    "least time those products need at n rows at the faster readings, and "
                    "floor(n) / L(1), the least v(n) these kernels could reach here now.")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES)
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: all cores); profiles are per thread count")
    p.add_argument("--backend", default="torch", choices=["torch", "llama.cpp"],
                   help="torch (default) or llama.cpp (the model's GGUF; --dtype ignored)")
    add_numerics_arg(p)
    add_device_arg(p)
    p.add_argument("--static", action="store_true",
                   help="time the fixed-shape steps (buckets up to 64 rows, CUDA graphs on a "
                        "GPU) that generate --static runs; saved as a profile of its own")
    add_compile_arg(p)
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                   help="input lengths to time, comma separated")
    p.add_argument("--context", type=int, default=256, help="cached tokens before the input")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-tokens", default=None,
                   help="prompt tokens folder: also print predicted speedups per tree size")
    p.add_argument("--greedy", action="store_true",
                   help="time greedy verifies: each forward gives its rows' greedy tokens, as "
                        "generate verifies at temperature 0 (a records-kernel head picks them "
                        "as it multiplies and never stores the logits); saved as a profile of "
                        "its own")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise InvalidArgumentError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    lengths = parse_lengths(args.lengths)
    bundle = load_bundle(args.target, args.dtype, args.backend, args.numerics, args.device,
                         static=static_option(args))
    if args.greedy and not bundle.model.capabilities.has("greedy_head"):
        raise InvalidArgumentError(
            f"--greedy needs a forward that gives greedy tokens (greedy_head), which the "
            f"{bundle.model.capabilities.backend} backend does not declare")
    on_cpu = getattr(bundle.model, "device", torch.device("cpu")).type == "cpu"
    before = _host_rates() if on_cpu else (None, None)
    rounds = measure_rounds(bundle.model, lengths, args.context, args.repeats,
                            greedy=args.greedy)
    latency = medians(rounds)
    # each round's L(n) / L(first length): least, median and most (the noise a goal on v(n)
    # is judged within)
    spread = {n: [min(r), statistics.median(r), max(r)]
              for n, r in round_ratios(rounds, lengths[0]).items()}
    after = _host_rates() if on_cpu else (None, None)
    # the host's memory stream (GB/s) and dot products (G vpdpbusd/s) before and after the
    # curve: where they moved, L(n) did
    stream = _pair(before[0], after[0])
    dots = _pair(before[1], after[1])
    floor = floor_curve(bundle.model, lengths, max(stream) if stream else None,
                        max(dots) * 1e9 if dots else None)
    threads = torch.get_num_threads()
    kind = model_kind(bundle.model, args.dtype) + ("-greedy" if args.greedy else "")
    path = profile_path(bundle.name, kind, threads)
    save_profile(path, latency, {"model": bundle.name, "dtype": kind, "threads": threads,
                                 "context": args.context, "repeats": args.repeats,
                                 "stream_gbs": stream, "dots_g": dots, "floor": floor,
                                 "round_ratios": spread})
    speed = _predicted(args.prompt_tokens, latency)
    if args.json:
        # where and how it was timed, as a bench row records it: a results folder of these
        # files names its machine and commit without a note written by hand
        print(json.dumps({"profile": str(path), "latency": latency, "round_ratios": spread,
                          "predicted": speed,
                          "stream_gbs": stream, "dots_g": dots, "floor": floor,
                          "command": command_line(),
                          "settings": {"model": bundle.name, "backend": args.backend,
                                       "lengths": lengths, "context": args.context,
                                       "repeats": args.repeats, "greedy": args.greedy},
                          "env": environment(kind, args.numerics)}))
        return 0
    base = latency[lengths[0]]
    floor_head = f" {'floor ms':>9} {'x L(1)':>7}" if floor else ""
    print(f"{'n':>4} {'ms':>9} {'x L(1)':>7} {'rounds':>11}{floor_head}")
    for n in lengths:
        cells = f" {floor[n] * 1e3:>9.1f} {floor[n] / base:>7.2f}" if floor else ""
        least, _, most = spread[n]
        print(f"{n:>4} {latency[n] * 1e3:>9.1f} {latency[n] / base:>7.2f} "
              f"{f'{least:.2f}-{most:.2f}':>11}{cells}")
    print(f"rounds: the least and most L(n) / L({lengths[0]}) of a round's forwards "
          f"({args.repeats} rounds, each length once a round)")
    if stream:
        print(f"memory stream {stream[0]:.0f} GB/s before the curve, {stream[1]:.0f} after "
              f"({threads} threads): a one-row step streams its weights near this speed")
    if dots:
        print(f"dot products {dots[0]:.1f} G vpdpbusd/s before, {dots[1]:.1f} after")
    if floor:
        print("floor: the records products alone, each at the slower of its weight stream and "
              "its pipe operations at the faster readings (records_floor.py): these kernels "
              "cannot run n rows in less, so v(n) stays at or above floor(n) / L(1) while one "
              "row takes L(1)")
    if speed:
        print(f"\n{'rows':>4} {'tau':>6} {'speedup':>8}")
        for n, (tau, s) in speed.items():
            print(f"{n:>4} {tau:>6.2f} {s:>8.2f}")
    print(f"saved {path}", file=sys.stderr)
    return 0


def _host_rates() -> tuple[float | None, float | None]:
    """(memory stream GB/s, G vpdpbusd a second) on torch's threads now; None for each the
    kernels cannot read here."""
    dots = dot_rate()
    return memory_stream_gbs(), dots / 1e9 if dots else None


def _pair(before: float | None, after: float | None) -> list[float] | None:
    return [round(before, 1), round(after, 1)] if before and after else None


def _predicted(folder: str | None, latency: dict[int, float]) -> dict[int, tuple[float, float]]:
    """tree rows -> (τ(n), predicted speedup) from the prompt tokens' cached trees."""
    if not folder:
        return {}

    table = PromptTokens.load(folder).trees()
    if not table:
        raise InvalidArgumentError(f"{folder} has no trees.json (calibrate the prompt tokens)")
    tau = {int(n): t["tau"] for n, t in table["dynamic"].items()}
    speed = predicted_speedups(tau, latency)
    return {n: (tau[n], speed[n]) for n in sorted(tau)}
