"""`draftsman check-exact`: prove a model pair or drafter distribution-exact under sampling.

The conformance harness (`draftsman.testing`) as a command: the target's distribution over
the first `--window` tokens is enumerated from its own logits (float64 reference sampler,
every prefix of positive probability), the method runs `--draws` seeded generations, and
each position's marginal and the joint are tested by chi-square. Top-k keeps the enumeration
small on a real vocabulary (k^window outcomes). The false-alarm rate of an exact method is
at most `--alpha` (Bonferroni over the window + 1 tests).
"""

from __future__ import annotations

import argparse
import json
import sys

import draftsman
from draftsman.cli.common import add_device_arg, csv_items
from draftsman.cli.generate_cmd import (
    add_method_args,
    add_numerics_arg,
    method_and_options,
    print_method_options,
)
from draftsman.engine import DEFAULT_TARGET
from draftsman.errors import InvalidArgumentError
from draftsman.models.weight_formats import DTYPE_CHOICES
from draftsman.sampling import SamplingConfig
from draftsman.strategies import registry

# short (every draw reads it again) and repetitive, so copying drafters (prompt lookup,
# suffix) have something to copy
DEFAULT_PROMPT = "one, two, three, four, one, two, three, four, one,"
DEFAULT_REQUIRE = "accepted at 1,rejected at 1"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check-exact", help="test that a method samples exactly the target's distribution",
        description="Run the conformance harness on a model pair or drafter: the target's "
                    "distribution over the first WINDOW tokens, enumerated from its own "
                    "logits, against DRAWS seeded generations of the method (chi-square per "
                    "position and joint, total variation, and the verification paths the "
                    "runs exercised). Exit 0: passed; 1: a test rejected exactness or a "
                    "required path never ran. An exact method fails by chance with "
                    "probability at most --alpha.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="raw text to continue (default: a short repetitive code prompt); "
                        "'-' reads stdin")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"catalogue name, model folder or hf:owner/name (default: "
                        f"{DEFAULT_TARGET})")
    p.add_argument("--dtype", default="fp32", choices=DTYPE_CHOICES,
                   help="torch weights (default fp32; q4 / q8 run their batch-invariant "
                        "kernels; bf16 verifies batches with different rounding, so small "
                        "deviations are expected there)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--backend", default="torch", choices=["torch", "llama.cpp"],
                   help="torch (default): our models in --dtype; llama.cpp: the model's GGUF "
                        "(use --numerics bitwise: fast verifies batches with other rounding)")
    add_numerics_arg(p)
    add_device_arg(p)
    add_method_args(p)
    p.set_defaults(method="speculative")
    p.add_argument("--temperature", type=float, default=1.0, help="(default 1.0)")
    p.add_argument("--top-k", type=int, default=3,
                   help="(default 3; the enumeration has up to top_k^window outcomes, "
                        "0 is only tractable on tiny vocabularies)")
    p.add_argument("--top-p", type=float, default=1.0, help="(default 1 = off)")
    p.add_argument("--window", type=int, default=4,
                   help="tokens per generation whose joint distribution is tested (default "
                        "4: the first is sampled at prefill, so the first step after it may "
                        "verify up to window - 2 guesses and a bonus token)")
    p.add_argument("--draws", type=int, default=300,
                   help="seeded generations (default 300; power grows with the square root)")
    p.add_argument("--alpha", type=float, default=0.01,
                   help="false-alarm rate for an exact method (default 0.01)")
    p.add_argument("--require", default=DEFAULT_REQUIRE,
                   help="paths that must have run, comma separated (default: "
                        f"'{DEFAULT_REQUIRE}'; '' for none); see draftsman.testing.coverage_of")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace, method: str) -> None:
    if args.window < 3:
        raise InvalidArgumentError(f"--window must be >= 3 (the prefill token, a guess and "
                                   f"the token after it), got {args.window}")
    if args.draws < 20:
        raise InvalidArgumentError(f"--draws must be >= 20, got {args.draws}")
    if not 0 < args.alpha < 1:
        raise InvalidArgumentError(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.temperature <= 0:
        raise InvalidArgumentError("check-exact tests sampling: --temperature must be > 0")
    if method in ("autoregressive", "default"):
        raise InvalidArgumentError(f"--method {args.method}: name the method to check, "
                                   "e.g. speculative or staged")
    SamplingConfig(args.temperature, args.top_k, args.top_p)


def run(args: argparse.Namespace) -> int:
    # the harness pulls scipy.stats (~0.7 s): imported here, not on every `draftsman` start
    from draftsman.testing import check_exact, target_joint

    name, options = method_and_options(args)
    if args.help_options:
        print_method_options(name)
        return 0
    check_args(args, name)
    registry.method_options(name, options)
    text = sys.stdin.read() if args.prompt == "-" else (args.prompt or DEFAULT_PROMPT)
    engine = draftsman.load(args.target, dtype=args.dtype, threads=args.threads,
                            backend=args.backend, numerics=args.numerics, device=args.device,
                            methods=[(name, options)])
    strategy = engine.strategy(name, options)
    if strategy.exactness != "exact":
        raise InvalidArgumentError(
            f"--method {args.method} with these options is {strategy.exactness} under "
            "sampling, not exact: nothing to check")
    prompt = engine.encode_prompt(text, chat=False)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    expected = target_joint(engine.target.model, prompt, args.window, sampling)
    require = csv_items(args.require)
    from tqdm import tqdm

    with tqdm(total=args.draws, desc="check-exact", unit="run", file=sys.stderr,
              disable=args.json or None) as bar:
        result = check_exact(strategy, prompt, expected, sampling, args.draws, require,
                             progress=bar.update)
    passed = result.passed(args.alpha)
    if args.json:
        print(json.dumps({
            "target": engine.target.name, "method": name, "options": options,
            "numbers": numbers(args), "prompt_tokens": len(prompt), "window": args.window,
            "draws": args.draws, "alpha": args.alpha, "outcomes": len(expected),
            "p_joint": result.p_joint, "p_positions": result.p_positions,
            "tv_joint": result.tv_joint, "tv_positions": result.tv_positions,
            "coverage": dict(result.coverage), "missing": result.missing, "passed": passed}))
    else:
        print(report(args, name, options, engine.target.name, len(prompt), len(expected),
                     result, passed))
    return 0 if passed else 1


def numbers(args: argparse.Namespace) -> str:
    return f"llama.cpp {args.numerics}" if args.backend == "llama.cpp" else args.dtype


def report(args: argparse.Namespace, name: str, options: dict, target: str,
           prompt_tokens: int, outcomes: int, result, passed: bool) -> str:
    given = ", ".join(f"{k}={v}" for k, v in options.items())
    lines = [
        f"target {target} ({numbers(args)}), method {name}" + (f" ({given})" if given else ""),
        f"sampling: temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}; "
        f"prompt {prompt_tokens} tokens; {outcomes} possible outcomes over {args.window} "
        "tokens",
        f"{result.draws} draws; false-alarm rate <= {args.alpha:g} (Bonferroni over "
        f"{args.window + 1} tests)",
        "",
        f"{'position':<10}{'chi-square p':>14}{'total variation':>18}",
    ]
    for t, (p, tv) in enumerate(zip(result.p_positions, result.tv_positions, strict=True), 1):
        lines.append(f"{t:<10}{p:>14.3g}{tv:>18.3f}")
    lines.append(f"{'joint':<10}{result.p_joint:>14.3g}{result.tv_joint:>18.3f}")
    lines += ["", "paths exercised (steps):"]
    lines += [f"  {name:<26}{n:>8}" for name, n in sorted(result.coverage.items())]
    if result.missing:
        lines.append("  never ran: " + ", ".join(result.missing))
    verdict = "PASSED: no evidence against exactness" if passed else (
        "FAILED: " + ("required paths never ran" if result.missing and
                      result.p_min * (1 + result.window) > args.alpha
                      else f"the output is not the target's distribution (p = "
                           f"{result.p_min:.3g})"))
    lines += ["", verdict]
    return "\n".join(lines)
