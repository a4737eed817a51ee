"""`draftsman serve`: an OpenAI-compatible HTTP server, acceleration on by default.

Models load once, before the port opens. Without `--method`, the server runs the default
method exactly as `generate` and `draftsman.load` resolve it (strategies/default_method.py):
this machine's fastest bench record for the target, else the backend's built-in rule. The
catalogue's draft for the target is loaded beside it, so requests may ask for `speculative`
or `staged` by name. SIGINT / SIGTERM stop accepting connections, let
in-flight requests finish for up to `--shutdown-timeout` seconds, cancel the rest at their
next step, and exit with status 0 (a second Ctrl-C exits at once).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import draftsman
from draftsman.cli.generate_cmd import (
    add_method_args,
    add_model_args,
    add_verbose_arg,
    method_and_options,
    print_method_options,
    report_choices,
    static_option,
)
from draftsman.engine import DEFAULT_DRAFTS
from draftsman.errors import InvalidArgumentError
from draftsman.proposers.drafters import is_model_free
from draftsman.strategies import registry
from draftsman.strategies.default_method import DEFAULT

if TYPE_CHECKING:
    from draftsman.server.engine_thread import EngineThread

KEYS_ENV = "DRAFTSMAN_API_KEYS"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve TARGET at /v1/completions and /v1/chat/completions (streaming "
                    "with stream: true), /v1/models, /health and /metrics. Requests pick a "
                    "method with the extension object \"draftsman\": {\"method\": ..., "
                    "options...}; the flags below set the default.")
    add_model_args(p)
    add_verbose_arg(p)
    add_method_args(p)
    p.set_defaults(method=None)
    for action in p._actions:  # the server's default differs from `generate`'s
        if action.dest == "method":
            action.help = ("default method of requests that name none (default: the fastest "
                           "exact configuration `draftsman bench` measured here, the built-in "
                           "default on llama.cpp, else speculative with --draft, the "
                           "catalogue draft, or prompt-lookup on torch)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the --target name, or the "
                        "folder name for a path)")
    p.add_argument("--parallel", type=int, default=1,
                   help="requests decoded together, one target forward per step for all of "
                        "them (torch backend; methods that cannot share a forward run one at "
                        "a time beside them; llama.cpp and --no-batch: one thread each) "
                        "(default: 1)")
    p.add_argument("--no-batch", action="store_true",
                   help="generate each request alone on its own worker thread, as before "
                        "batching (for comparison)")
    p.add_argument("--prefill-chunk", type=int, default=128,
                   help="prompt tokens a new request reads per step while the others "
                        "decode (default: 128)")
    p.add_argument("--prefill-stall", type=float, default=2.0,
                   help="while others decode, a prompt chunk is cut so that a step costs at "
                        "most this many times the step without it, on this machine's "
                        "measured cost curve (default: 2.0; larger: faster first tokens, "
                        "longer pauses for the others)")
    p.add_argument("--max-step-cost", type=float, default=None,
                   help="with two or more requests decoding, cut the guesses so a step costs "
                        "at most this many times one row per request: a bound on the pause "
                        "between each one's tokens, paid in throughput (default: none)")
    p.add_argument("--max-step-rows", type=int, default=None,
                   help="a row budget for every step shared by two or more requests: their "
                        "pending tokens first, then a joining prompt's chunk, then guesses, "
                        "never more rows in all (the pause between each one's tokens is "
                        "then one such forward; `draftsman profile` shows its cost here). "
                        "Replaces --prefill-stall and --max-step-cost while a step is "
                        "shared (default: none)")
    p.add_argument("--gather-ms", type=float, default=50.0,
                   help="when a request reaches an idle server while others are still being "
                        "received, wait for them up to this long, so that a burst's prompts "
                        "are read in one forward instead of one after another; a lone "
                        "request never waits (default: 50; 0: never wait)")
    p.add_argument("--max-kv-tokens", type=int, default=None,
                   help="KV cache slots all admitted requests may reserve together (prompt "
                        "+ max_tokens + 18 each); beyond it, 429 (default: --parallel x the "
                        "context)")
    p.add_argument("--fixed-gamma-under-load", action="store_true",
                   help="keep each request's own gamma=auto choice when batched, instead of "
                        "letting the load-adaptive controller spend the step's rows")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests waiting beyond --parallel before 429 (default: 16)")
    p.add_argument("--max-tokens-cap", type=int, default=2048,
                   help="largest max_tokens a request may ask for (default: 2048)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt accepted, else 413 (default: the model's context)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* (repeat for several "
                        "keys; also " + KEYS_ENV + ", comma-separated); each key's earlier "
                        "requests are a separate drafting history")
    p.add_argument("--history-tokens", type=int, default=1_000_000,
                   help="tokens of earlier prompts and replies kept, over all keys, for the "
                        "suffix drafter (default: 1000000; 0: none)")
    p.add_argument("--shutdown-timeout", type=int, default=30,
                   help="seconds in-flight requests may finish after SIGTERM (default: 30)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def api_keys(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> list[str]:
    """--api-key values, then those in $DRAFTSMAN_API_KEYS (comma-separated), deduplicated."""
    given = list(args.api_key or []) + environ.get(KEYS_ENV, "").split(",")
    return list(dict.fromkeys(k.strip() for k in given if k.strip()))


def _check_limits(args: argparse.Namespace) -> None:
    for name in ("parallel", "max_tokens_cap", "prefill_chunk"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be >= 1")
    if args.prefill_stall < 1:
        raise InvalidArgumentError("--prefill-stall must be >= 1")
    if args.max_step_cost is not None and args.max_step_cost < 1:
        raise InvalidArgumentError("--max-step-cost must be >= 1")
    if args.max_step_rows is not None and args.max_step_rows < args.parallel + 1:
        raise InvalidArgumentError(f"--max-step-rows must be at least --parallel + 1 "
                                   f"({args.parallel + 1}): every decoding request's token "
                                   "and one prompt token")
    if not 0 <= args.gather_ms <= 1000:
        raise InvalidArgumentError("--gather-ms must be between 0 and 1000")
    if args.max_kv_tokens is not None and args.max_kv_tokens < 1:
        raise InvalidArgumentError("--max-kv-tokens must be >= 1")
    if args.history_tokens < 0:
        raise InvalidArgumentError("--history-tokens must be >= 0")
    if args.max_queue < 0:
        raise InvalidArgumentError("--max-queue must be >= 0")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise InvalidArgumentError("--max-prompt-tokens must be >= 1")
    if not 0 < args.port < 65536:
        raise InvalidArgumentError(f"--port must be in 1..65535, got {args.port}")


def served_name(target: str) -> str:
    """A path's folder (or file) name; a catalogue or hf: name as it is."""
    path = Path(target).expanduser()
    return path.name if path.exists() else target


def default_method(args: argparse.Namespace) -> tuple[str, dict]:
    """(method, options) a request gets when it names no method: `default` (resolved by the
    engine, as for `generate`) unless --method names one."""
    name, options = method_and_options(args)
    return name or DEFAULT, options


def resident_drafts(args: argparse.Namespace, catalogue_draft: str | None) -> list[str]:
    """Companion models to load at start-up: --draft and --subdraft when they are models,
    else the catalogue's draft for the target (so `staged` and `speculative` work)."""
    if args.draft is None:
        drafts = [catalogue_draft] if catalogue_draft else []
    else:
        drafts = [] if is_model_free(args.draft) else [args.draft]
    if args.subdraft is not None and not is_model_free(args.subdraft):
        drafts.append(args.subdraft)
    return drafts


def build_app(args: argparse.Namespace, engine_thread: EngineThread | None = None):
    """Load the models (once) and build the FastAPI app; no socket is opened here. `run`
    calls it on the engine thread, which then also runs the batch loop."""
    from draftsman.server.app import ServerSettings, create_app

    catalogue_draft = DEFAULT_DRAFTS.get(args.target)
    method, options = default_method(args)
    if method != DEFAULT:
        registry.method_options(method, options)  # a bad option fails before any model loads
    drafts = resident_drafts(args, catalogue_draft)
    # without --method the backend is chosen for the default method, not the torch fallback
    engine = draftsman.load(args.target, dtype=args.dtype, threads=args.threads,
                            backend=args.backend, numerics=args.numerics, device=args.device,
                            static=static_option(args),
                            methods=[(method, options)] if args.method else [])
    why = ""
    if method == DEFAULT:
        method, options, why = engine.resolve_method(method, options)
    if args.verbose:
        report_choices(engine, why)
    for spec in drafts:
        engine.model(spec)
    main_draft = drafts[0] if drafts and drafts[0] != args.subdraft else None
    settings = ServerSettings(
        model_name=args.served_model_name or served_name(args.target), method=method,
        options=options, drafts=drafts, parallel=args.parallel, max_queue=args.max_queue,
        max_tokens_cap=args.max_tokens_cap, max_prompt_tokens=args.max_prompt_tokens,
        default_draft=main_draft, api_keys=api_keys(args),
        history_tokens=args.history_tokens, batch=not args.no_batch,
        prefill_chunk=args.prefill_chunk, prefill_stall=args.prefill_stall,
        max_step_cost=args.max_step_cost, max_step_rows=args.max_step_rows,
        max_kv_tokens=args.max_kv_tokens, gather_ms=args.gather_ms,
        adaptive=not args.fixed_gamma_under_load)
    logging.getLogger("draftsman.server").info(
        "%d API key(s); history of up to %d tokens", len(settings.api_keys),
        settings.history_tokens)
    return create_app(engine, settings, engine_thread=engine_thread)


def run(args: argparse.Namespace) -> int:
    if args.help_options:
        print_method_options(method_and_options(args)[0] or "speculative")
        return 0
    import uvicorn

    _check_limits(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(message)s")
    # loading and decoding on one thread: a forward on another than the loading thread's
    # OpenMP team ran 30% slower (server/engine_thread.py)
    from draftsman.server.engine_thread import EngineThread

    engine_thread = EngineThread()
    app = engine_thread.call(build_app, args, engine_thread)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    graceful_server(config).run()
    return 0


def graceful_server(config):
    """A uvicorn Server whose handled SIGINT/SIGTERM ends `run()` normally.

    uvicorn drains connections on the first signal, then re-raises it after shutdown (so
    SIGTERM would end the process with -15); here the drain is the whole story and the
    command exits 0. A second SIGINT still forces an immediate exit.
    """
    import uvicorn

    class GracefulServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield  # signals can only be handled in the main thread
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer(config)
