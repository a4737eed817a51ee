"""`draftsman generate`: one prompt, any method, text or JSON out."""

from __future__ import annotations

import argparse
import json
import sys
import time

import draftsman
from draftsman.backends.choose import AUTO, CHOICES
from draftsman.cli.common import add_device_arg
from draftsman.core import GenerationConfig
from draftsman.engine import DEFAULT_TARGET
from draftsman.errors import InvalidArgumentError
from draftsman.kernels.native import (
    attention_amx,
    attention_bf16_pairs,
    kquant_amx,
    kquant_available,
    kquant_isa,
    kquant_records,
    records_isa,
    unavailable_reason,
)
from draftsman.kernels.tile_rows import describe as tile_rows_line
from draftsman.models.static_step import StaticConfig
from draftsman.models.weight_formats import DTYPE_CHOICES, INT8_KERNEL_NAMES, int8_kernel
from draftsman.sampling import SamplingConfig
from draftsman.strategies import registry
from draftsman.strategies.default_method import (
    DEFAULT,
    DEFAULT_METHOD,
    TORCH_DEFAULT_METHOD,
    split_spec,
)
from draftsman.strategies.options import help_lines
from draftsman.strategies.registry import METHODS


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="catalogue name, model folder, .gguf file or hf:owner/name "
                             f"(default: {DEFAULT_TARGET})")
    parser.add_argument("--dtype", default=None, choices=DTYPE_CHOICES,
                        help="weights: bf16, fp32, or q4 / q8 on integer CPU kernels fed the "
                             "GGUF's own blocks (int8 = q8; a q4 engine's drafts load as "
                             "q4-draft, every matrix on Q4_K); fp32, q4 or q8 also make "
                             "--backend auto choose torch. Default: with --backend auto, the "
                             "backend and dtype `draftsman bench` measured fastest on this "
                             "CPU (--verbose says which record), else bf16")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for PyTorch / llama.cpp (default: all cores)")
    parser.add_argument("--backend", default=AUTO, choices=list(CHOICES),
                        help="auto (default): llama.cpp on a machine without a CUDA GPU when "
                             "the model has a GGUF and the method runs there, else torch "
                             "(--verbose says which and why); torch: our PyTorch models in "
                             "--dtype; llama.cpp: the model's GGUF on llama.cpp's quantised "
                             "kernels (catalogue names and .gguf files; --dtype is ignored)")
    add_numerics_arg(parser)
    add_device_arg(parser)
    parser.add_argument("--static", action=argparse.BooleanOptionalAction, default=None,
                        help="torch: decode and verify steps of up to 64 rows at fixed "
                             "shapes over the whole KV cache, replayed as CUDA graphs on a "
                             "GPU (on the CPU they only cost time). Default: on for a CUDA "
                             "device with --backend torch when the method runs the whole "
                             "model (not early exit or pipelined); --no-static: the eager "
                             "path")
    add_compile_arg(parser)


def add_compile_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true",
                        help="with --static: fuse each step's small kernels with torch.compile "
                             "before capture (compiles once per row bucket on first use, "
                             "minutes in all; for long-running GPU work)")


def static_option(args: argparse.Namespace) -> bool | StaticConfig:
    """--static / --static --compile as `draftsman.load`'s `static`."""
    if getattr(args, "compile", False) and not args.static:
        raise InvalidArgumentError("--compile fuses --static steps: add --static")
    return StaticConfig(compile=True) if getattr(args, "compile", False) else args.static


def add_verbose_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="say which backend and default method were chosen, and why")


def add_numerics_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--numerics", default="fast", choices=["fast", "bitwise"],
                        help="llama.cpp: fast (default) verifies in one batch on llama.cpp's "
                             "defaults, greedy output may part from autoregressive at "
                             "near-ties; bitwise feeds 3-row pieces over a Q8_0 cache, "
                             "identical output, verify cost linear in the rows. torch: only "
                             "fast (bf16 is batch-variant anyway, fp32 exact)")


def add_method_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", default=DEFAULT,
                        help=" | ".join([DEFAULT, *METHODS]) + ", alone or with its options "
                             "as `--verbose` and `draftsman bench` write them "
                             "(speculative:draft=suffix,gamma=auto). Default: default, the "
                             "fastest exact configuration `draftsman bench` measured on this "
                             "machine for the target and backend, else "
                             f"{DEFAULT_METHOD} on llama.cpp and {TORCH_DEFAULT_METHOD} on "
                             "torch; --help-options lists a method's options")
    parser.add_argument("--draft", default=None,
                        help="draft model (name/path), or ngram / prompt-lookup / suffix "
                             "(speculative); middle model (staged)")
    parser.add_argument("--subdraft", default=None,
                        help="staged: the lowest drafter (model, ngram, prompt-lookup or suffix)")
    parser.add_argument("--gamma", default=None,
                        help="tokens drafted per step, or 'auto' for an adaptive policy")
    parser.add_argument("--gamma-policy", default=None,
                        choices=["fixed", "heuristic", "acceptance", "cost"],
                        help="adaptive policy with --gamma auto (default: cost)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra method option, repeatable (e.g. --option subgamma=2)")
    parser.add_argument("--help-options", action="store_true",
                        help="print the options of --method (name, type, default, choices, "
                             "help) and exit")


def print_method_options(method: str) -> None:
    """`--help-options`: the declaration of `method`'s options, one entry per option."""
    if method == DEFAULT:
        print(f"--method {DEFAULT} runs a spec chosen at start-up (--verbose names it); the "
              "options of that method apply")
        return
    lines = help_lines(registry.method(method).options)
    print(f"options of --method {method}" + (":" if lines else ": none"))
    for line in lines:
        print(line)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument("--max-new-tokens", type=int, default=128)


def method_and_options(args: argparse.Namespace) -> tuple[str | None, dict]:
    """(method name, options) from --method, a name or a spec `name:key=value,...`, and the
    option flags; a key given both ways must agree. `args.method` None stays None (serve's
    "no --method")."""
    if args.method is None:
        return None, flag_options(args)
    name, options = split_spec(args.method)
    if not name:
        raise InvalidArgumentError(f"--method {args.method!r}: name a method before the ':'")
    if "engine" in options:
        raise InvalidArgumentError(
            f"--method {args.method!r}: engine= is a bench option; choose the engine with "
            "--backend and --dtype (engine=torch-q4: --backend torch --dtype q4)")
    for key, value in flag_options(args).items():
        if options.setdefault(key, value) != value:
            raise InvalidArgumentError(f"--method sets {key}={options[key]} and a flag sets "
                                       f"{key}={value}: give it once")
    return name, options


def flag_options(args: argparse.Namespace) -> dict:
    """The method options given as flags (--draft, --gamma, --option KEY=VALUE, ...)."""
    options: dict = {}
    if args.draft is not None:
        options["draft"] = args.draft
    if args.subdraft is not None:
        options["subdraft"] = args.subdraft
    if args.gamma is not None:
        options["gamma"] = args.gamma
    if args.gamma_policy is not None:
        options["gamma_policy"] = args.gamma_policy
    for item in args.option:
        if "=" not in item:
            raise InvalidArgumentError(f"--option wants KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        options[key.strip().replace("-", "_")] = value.strip()
    return options


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text for one prompt",
        description="Generate a continuation of PROMPT (or stdin) with the chosen method. "
                    "Exact methods produce the same text as autoregressive decoding.")
    p.add_argument("prompt", nargs="?", help="the prompt; read from stdin when omitted")
    add_model_args(p)
    add_verbose_arg(p)
    add_method_args(p)
    add_sampling_args(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default for instruct models)")
    chat.add_argument("--no-chat", dest="chat", action="store_false",
                      help="feed the prompt as raw text")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--json", action="store_true", help="print one JSON object with stats")
    p.set_defaults(func=run)


def report_choices(engine: draftsman.Engine, default_why: str = "") -> None:
    """--verbose: the backend and the default method taken, and why, on stderr."""
    print(f"backend: {engine.backend} ({engine.backend_reason})", file=sys.stderr)
    summary = getattr(engine.target.model, "quant_summary", None)
    if summary:
        paths = ", ".join(f"{n} {kind}" for kind, n in summary.items())
        print(f"weights: {paths}", file=sys.stderr)
        note = getattr(engine.target.model, "packed_note", None)
        if note:
            print(f"packed weights: {note}", file=sys.stderr)
        if any(k.endswith("kernel (as stored)") for k in summary):
            path = (f"records of 16 rows, vectors and {tile_rows_line()}" if kquant_amx() else
                    "records of 16 rows on "
                    + ("AVX-512 VNNI" if records_isa() == "avx512vnni" else "AVX2")
                    if kquant_records() else kquant_isa())
            print(f"kernel: K-quant blocks on {path}", file=sys.stderr)
        if any("int8 per row" in k or "Q8_0 records" in k for k in summary):
            print(f"kernel: 8-bit matrices on {INT8_KERNEL_NAMES[int8_kernel()]}",
                  file=sys.stderr)
        if getattr(engine.target.model, "fused_cpu_ops", False):
            tiles = (" (bf16 attention on AMX-BF16 tiles)" if attention_amx() else
                     " (bf16 attention scores on AVX512-BF16 pairs)" if attention_bf16_pairs()
                     else "")
            print("ops: norms, SwiGLU and short attention on draftsman's fused CPU kernels"
                  + tiles, file=sys.stderr)
        if not kquant_available() and any(k.startswith(("Q4_K", "Q6_K")) for k in summary):
            print(f"note: K-quant kernel unavailable ({unavailable_reason()}); "
                  "PyTorch's packed kernels instead", file=sys.stderr)
    if default_why:
        print(f"method: default -> {default_why}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    name, options = method_and_options(args)
    if args.help_options:
        print_method_options(name)
        return 0
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt or not prompt.strip():
        raise InvalidArgumentError("the prompt is empty")
    # fail before loading any model
    SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    GenerationConfig(args.max_new_tokens)
    if name != DEFAULT:
        registry.method_options(name, options)
    engine = draftsman.load(args.target, dtype=args.dtype, threads=args.threads,
                            backend=args.backend, numerics=args.numerics, device=args.device,
                            static=static_option(args), methods=[(name, options)])
    method, options, why = engine.resolve_method(name, options)
    if args.verbose:
        report_choices(engine, why)
    kwargs = dict(method=method, max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                  seed=args.seed, stop=args.stop, chat=args.chat, **options)
    if args.stream and not args.json:
        request = engine.prepare(prompt, **kwargs)
        t0 = time.perf_counter()
        n = 0
        for event in engine.run(request):
            n += len(event.token_ids)
            sys.stdout.write(event.text)
            sys.stdout.flush()
        seconds = time.perf_counter() - t0
        sys.stdout.write("\n")
        print(f"[{n} tokens, {seconds:.2f} s, {n / seconds:.2f} tok/s]", file=sys.stderr)
        return 0
    result = engine.generate(prompt, **kwargs)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(result.text)
        s = result.stats
        extra = f", tau {s.tau:.2f}, alpha {s.alpha:.2f}" if s.alpha is not None else ""
        print(f"[{result.new_tokens} tokens, {result.seconds:.2f} s, "
              f"{result.tokens_per_second:.2f} tok/s{extra}]", file=sys.stderr)
    return 0
