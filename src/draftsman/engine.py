"""The Python API: load models once, then generate or stream with any strategy.

    engine = draftsman.load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct")
    result = engine.generate("Write quicksort in Python", method="speculative", gamma=4)

The CLI, the server and the benchmark all go through `Engine.stream`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftsman.backends.choose import (
    AUTO,
    DEFAULT_DTYPE,
    BackendChoice,
    Need,
    check_backend,
    check_static,
    choose_backend,
)
from draftsman.core import GenerationConfig, Stats, Step
from draftsman.device import resolve_device
from draftsman.errors import DraftsmanError, InvalidArgumentError, UnsupportedError
from draftsman.models.base import DecoderLM
from draftsman.models.config import ModelConfig
from draftsman.models.draft_vocab import draft_head_rows
from draftsman.models.loader import load_model
from draftsman.models.static_step import StaticConfig, StaticModel
from draftsman.models.weight_formats import companion_dtype, gguf_source, is_quantised, parse_dtype
from draftsman.proposers.history import HistoryStore, Scope
from draftsman.sampling import SamplingConfig
from draftsman.store.resolve import model_has_gguf
from draftsman.strategies.base import check_fits
from draftsman.strategies.default_method import (
    DEFAULT,
    DefaultChoice,
    measured_configuration,
    measured_dtype,
    measured_reason,
    resolve_default,
    split_spec,
)
from draftsman.text.stops import StopMatcher
from draftsman.text.stream import TextStream
from draftsman.text.tokenizer import Tokenizer, check_same_vocabulary

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_DRAFTS = {DEFAULT_TARGET: DEFAULT_DRAFT}


@dataclass
class LoadedModel:
    name: str
    folder: Path
    model: DecoderLM | StaticModel
    tokenizer: Tokenizer

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def is_instruct(self) -> bool:
        return bool(self.tokenizer.chat_template)


def pick_device(device: str | torch.device | None, backend: str = "torch",
                dtype: str | torch.dtype = "bf16") -> torch.device:
    """The device a model runs on for `--device` (see device.py). llama.cpp is built for the
    CPU here, and q4/q8 are CPU kernels: for them `auto` means the CPU, a GPU is refused."""
    if backend == "llama.cpp":
        return resolve_device(device, cpu_only="--backend llama.cpp runs on the CPU; "
                                               "use --backend torch")
    if is_quantised(dtype):
        return resolve_device(device, cpu_only=f"--dtype {dtype} runs on the CPU only")
    return resolve_device(device)


MethodSpec = tuple[str, Mapping[str, Any]]  # (method name, options)


def _llama_cpp_problem() -> str | None:
    from draftsman.backends.llama_cpp import llama

    try:
        llama()
    except DraftsmanError as exc:
        return str(exc)
    return None


def pick_backend(target: str | Path, requested: str = AUTO, *, dtype: str = DEFAULT_DTYPE,
                 draft: str | None = None, methods: Sequence[MethodSpec] = ()
                 ) -> BackendChoice:
    """Gather the facts `choose_backend` needs for `target` (and `draft`) running `methods`
    (the `default` method runs on either backend, so it needs nothing)."""
    from draftsman.backends.llama_cpp import LlamaCppLM
    from draftsman.proposers.drafters import is_model_free
    from draftsman.strategies.registry import method, method_options

    if requested != AUTO:
        return choose_backend(requested, llama_cpp=LlamaCppLM.capabilities, has_gguf=False,
                              has_cuda=False)
    needs: list[Need] = []
    models = [str(target)] + ([draft] if draft and not is_model_free(draft) else [])
    for name, options in methods:
        if name == DEFAULT:
            continue
        parsed = method_options(name, options)
        needs += [Need(name, cap, why) for cap, why in parsed.needs().items()]
        for key in ("draft", "subdraft"):
            value = getattr(parsed, key, None)
            if value is None and key == "draft" and method(name).takes_draft:
                value = DEFAULT_DRAFTS.get(str(target))
            if value and not is_model_free(str(value)):
                models.append(str(value))
    return choose_backend(AUTO, llama_cpp=LlamaCppLM.capabilities, needs=needs,
                          has_gguf=all(model_has_gguf(m) for m in models),
                          has_cuda=torch.cuda.is_available(), dtype=dtype,
                          llama_cpp_problem=_llama_cpp_problem)


def load_bundle(spec: str | Path, dtype: str | torch.dtype = "bf16",
                backend: str = "torch", numerics: str = "fast",
                device: str | torch.device | None = "cpu", static: bool | StaticConfig = False,
                draft_vocab: int | None = None) -> LoadedModel:
    """A catalogue name, a Hugging Face-style folder, a .gguf file or hf:owner/name.

    backend "torch" runs our own models/ in `dtype` on `device` (auto, cpu, cuda[:N]);
    "llama.cpp" runs the model's GGUF on llama.cpp (its own quantisation; `dtype` ignored;
    CPU only), so it needs a catalogue name or a .gguf file; the folder gives the config and
    tokenizer either way. `numerics` ("fast" or "bitwise"): llama.cpp's feeding mode
    (backends/llama_cpp.py). `static` (torch only): models/static_step.py. `draft_vocab`
    (torch only): the head scores only that many ranked tokens (models/draft_vocab.py)."""
    from draftsman.store.resolve import resolve_gguf, resolve_model

    check_backend(backend, numerics)
    check_static(static, backend)
    placed = pick_device(device, backend, dtype)  # before any download: fail fast
    folder = resolve_model(str(spec))
    if backend == "llama.cpp":
        from draftsman.backends.llama_cpp import LlamaCppLM

        if draft_vocab is not None:
            raise UnsupportedError("draft_vocab runs on the torch backend")
        gguf = resolve_gguf(str(spec))
        model = LlamaCppLM(gguf, ModelConfig.from_folder(folder), numerics=numerics)
    else:
        head = None if draft_vocab is None else draft_head_rows(folder, draft_vocab)
        model = load_model(folder, dtype, gguf=gguf_source(str(spec), dtype), device=placed,
                           head_rows=head)
        if static:
            model = StaticModel(model, static if isinstance(static, StaticConfig) else None)
    tokenizer = Tokenizer.from_folder(folder, extra_eos=model.config.eos_token_ids)
    return LoadedModel(str(spec), Path(folder), model, tokenizer)


@dataclass
class Request:
    method: str
    options: dict[str, Any]
    prompt_ids: list[int]
    config: GenerationConfig
    strategy: Any
    stops: StopMatcher


@dataclass
class Event:
    """One committed step as the user sees it: tokens after EOS/stop clipping, text delta."""

    step: Step
    token_ids: list[int]
    text: str
    finish: str | None


@dataclass
class Result:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    seconds: float
    method: str
    finish_reason: str
    steps: list[Step] = field(repr=False)
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, request: Request, events: list[Event], seconds: float) -> Result:
        """A request's Result from the Events it produced."""
        return cls(text="".join(e.text for e in events),
                   token_ids=[t for e in events for t in e.token_ids],
                   prompt_tokens=len(request.prompt_ids), seconds=seconds,
                   method=request.method,
                   finish_reason=(events[-1].finish or "length") if events else "length",
                   steps=[e.step for e in events], options=request.options)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def stats(self) -> Stats:
        return Stats.from_steps(self.steps)

    def as_dict(self) -> dict[str, Any]:
        from draftsman.theory.speculative import expected_speedup

        stats = self.stats
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "method": self.method,
            "options": self.options,
            "finish_reason": self.finish_reason,
        }
        out.update(stats.as_dict())
        if stats.alpha is not None and stats.mean_gamma and stats.cost_ratio is not None:
            out["predicted_speedup"] = expected_speedup(stats.alpha, stats.mean_gamma,
                                                        stats.cost_ratio)
        return out


class Engine:
    def __init__(self, target: LoadedModel, dtype: torch.dtype = torch.bfloat16,
                 backend: str = "torch", numerics: str = "fast",
                 device: torch.device | None = None, backend_reason: str = "",
                 static: bool | StaticConfig = False) -> None:
        self.target = target
        self.dtype = dtype
        self.backend = backend
        self.numerics = numerics
        self.device = device or torch.device("cpu")  # where every model of this engine lives
        self.backend_reason = backend_reason  # why `backend` was chosen (--verbose)
        self.static = static  # every model of this engine runs static-shape steps
        self._models: dict[str, LoadedModel] = {target.name: target}

    # ---- models -------------------------------------------------------------------
    def companion_dtype(self, dtype: str | torch.dtype | None = None) -> str | torch.dtype:
        """A companion's (a draft's) format: `dtype`, else the engine's (q4 -> q4-draft)."""
        return parse_dtype(dtype) if dtype is not None else companion_dtype(self.dtype)

    def model(self, spec: str, dtype: str | torch.dtype | None = None,
              vocab: int | None = None) -> LoadedModel:
        """A companion model in `companion_dtype(dtype)` (its head over `vocab` ranked tokens
        if given), loaded once, vocabulary checked."""
        fmt = self.companion_dtype(dtype)
        key = spec if dtype is None or fmt == self.companion_dtype() else f"{spec} ({fmt})"
        key += "" if vocab is None else f" vocab {vocab}"
        if key not in self._models:
            bundle = load_bundle(spec, fmt if self.backend == "torch" else self.dtype,
                                 self.backend, self.numerics, self.device, self.static, vocab)
            check_same_vocabulary(self.target.tokenizer, bundle.tokenizer, self.target.name,
                                  bundle.name)
            if bundle.config.vocab_size != self.target.config.vocab_size:
                raise DraftsmanError(
                    f"{spec} has {bundle.config.vocab_size} logits and {self.target.name} "
                    f"{self.target.config.vocab_size}; padded vocabularies are not supported"
                )
            self._models[key] = bundle
        return self._models[key]

    def warm_up(self) -> None:
        """Compile and capture each loaded model's static steps now (StaticModel.warm_up)."""
        for model in (m.model for m in self._models.values() if isinstance(m.model, StaticModel)):
            model.warm_up()

    def default_draft(self) -> str:
        draft = DEFAULT_DRAFTS.get(self.target.name)
        if draft is None:
            raise InvalidArgumentError(f"no default draft for {self.target.name}; pass --draft")
        return draft

    @property
    def numerics_key(self) -> str:
        """The number format timings depend on: llama.cpp's mode, or torch's dtype."""
        if self.backend == "llama.cpp":
            return self.numerics
        return {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(self.dtype, str(self.dtype))

    def default_method(self) -> DefaultChoice:
        """What `method="default"` runs here (strategies/default_method.py)."""
        return resolve_default(self.target.name, self.backend, self.numerics_key)

    def resolve_method(self, method: str, options: Mapping[str, Any]
                       ) -> tuple[str, dict[str, Any], str]:
        """(method, options, reason): `default` becomes its spec, with `options` over the
        spec's own; any other method passes through with an empty reason."""
        if method != DEFAULT:
            return method, dict(options), ""
        choice = self.default_method()
        name, spec_options = split_spec(choice.spec)
        return name, {**spec_options, **options}, f"{choice.spec}: {choice.reason}"

    # ---- prompts ------------------------------------------------------------------
    def encode_prompt(
        self, prompt: str | list[int] | list[dict[str, str]], chat: bool | None = None
    ) -> list[int]:
        tok = self.target.tokenizer
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, list):
            ids = tok.encode_chat(prompt)
        else:
            if not prompt.strip():
                raise InvalidArgumentError("the prompt is empty")
            use_chat = self.target.is_instruct if chat is None else chat
            ids = tok.encode_chat([{"role": "user", "content": prompt}]) if use_chat \
                else tok.encode(prompt)
        if not ids:
            raise InvalidArgumentError("the prompt is empty")
        return ids

    # ---- generation ---------------------------------------------------------------
    def strategy(self, method: str, options: dict[str, Any]):
        from draftsman.strategies.registry import make_strategy

        return make_strategy(method, self, dict(options))

    def prepare(
        self,
        prompt: str | list[int] | list[dict[str, str]],
        *,
        method: str = DEFAULT,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: tuple[str, ...] | list[str] = (),
        chat: bool | None = None,
        history: Scope | None = None,
        **options: Any,
    ) -> Request:
        """Validate everything and load what the method needs, before any timed work.
        `method="default"` runs what `default_method()` names. `history`: earlier sequences
        a history-aware drafter (`suffix`) may copy from."""
        method, options, _ = self.resolve_method(method, options)
        sampling = SamplingConfig(temperature, top_k, top_p, seed)
        config = GenerationConfig(max_new_tokens, sampling, self.target.tokenizer.eos_token_ids,
                                  history)
        strategy = self.strategy(method, options)
        prompt_ids = self.encode_prompt(prompt, chat)
        check_fits(self.target.model, len(prompt_ids), config)
        return Request(method, options, prompt_ids, config, strategy, StopMatcher(tuple(stop)))

    def run(self, request: Request) -> Iterator[Event]:
        return self._events(request.strategy.generate(request.prompt_ids, request.config),
                            request.stops)

    def stream(self, prompt, **kwargs: Any) -> Iterator[Event]:
        return self.run(self.prepare(prompt, **kwargs))

    def text_events(self, stops: StopMatcher) -> Callable[[Step], Event]:
        """Step -> Event for one request: its text delta and clipping at stop strings; the
        Event whose `finish` is set is the request's last."""
        text = TextStream(self.target.tokenizer.decode, stops)

        def event(step: Step) -> Event:
            delta = text.push(list(step.tokens), step.finish)
            return Event(step, delta.tokens, delta.text, delta.finish)

        return event

    def _events(self, steps: Iterator[Step], stops: StopMatcher) -> Iterator[Event]:
        event_of = self.text_events(stops)
        try:
            for step in steps:
                event = event_of(step)
                yield event
                if event.finish is not None:
                    return
        finally:
            close = getattr(steps, "close", None)
            if close:
                close()

    def generate_many(self, prompts: Sequence[Any], *, parallel: int = 4,
                      **kwargs: Any) -> list[Result]:
        """Generate for every prompt, up to `parallel` decoding together in shared forwards
        (batching/generate_many.py); the same keywords as `generate`, for every prompt."""
        from draftsman.batching.generate_many import generate_many

        out = []
        for prompt, (request, events, seconds) in zip(
                prompts, generate_many(self, prompts, parallel=parallel, **kwargs), strict=True):
            out.append(self.generate(prompt, **kwargs) if events is None
                       else Result.of(request, events, seconds))
        return out

    def generate(self, prompt, *, history: HistoryStore | None = None, scope: str = "",
                 **kwargs: Any) -> Result:
        """Generate; with a `history` store, draft from (and then remember) the earlier
        prompts and replies of `scope` (e.g. one user)."""
        if history is not None:
            kwargs["history"] = history.scope(scope)
        request = self.prepare(prompt, **kwargs)
        t_start = time.perf_counter()  # from the tokenised prompt: prefill in, loading out
        events = list(self.run(request))
        seconds = time.perf_counter() - t_start
        if history is not None:
            history.add(scope, request.prompt_ids + [t for e in events for t in e.token_ids])
        return Result.of(request, events, seconds)


def load(
    target: str | Path = DEFAULT_TARGET,
    *,
    draft: str | None = None,
    dtype: str | None = None,
    threads: int | None = None,
    backend: str = AUTO,
    numerics: str = "fast",
    methods: Sequence[MethodSpec] = (),
    device: str | torch.device | None = "auto",
    static: bool | StaticConfig | None = None,
) -> Engine:
    """Load `target` (and `draft`) once. `backend="auto"` with no `dtype` and only the
    default method runs what `draftsman bench` measured fastest on this CPU, backend and
    dtype (default_method.fastest_here); without a record, or otherwise, it picks llama.cpp
    on a machine without a CUDA GPU when the models have a GGUF, `dtype` is bf16 (None
    means bf16) and llama.cpp runs every one of `methods` ((name, options) pairs you mean
    to run; none: the default method, which runs on both); else torch, in `dtype`.
    `engine.backend_reason` says why. `device`: auto (the GPU when torch sees one, else the
    CPU), cpu, cuda or cuda:N; a GPU that is not there is a DeviceError. `static`: fixed-shape
    decode and verify steps, CUDA graphs on a GPU (torch only; `backend="auto"` then means
    torch); a StaticConfig sets their options (`compile=True`: fused by torch.compile); None:
    on where they are the fast path, a CUDA device on torch with `methods` that run the whole
    model (docs/devices.md)."""
    check_backend(backend, numerics)
    if static and backend == AUTO:
        backend = "torch"
    check_static(static, backend)
    if threads is not None and threads < 1:
        raise InvalidArgumentError(f"threads must be >= 1, got {threads}")
    measured = None
    if backend == AUTO:
        measured = measured_configuration(str(target), numerics, methods, dtype, device)
        if measured is not None:
            backend, dtype = measured.backend, measured_dtype(measured)
    dtype = DEFAULT_DTYPE if dtype is None else dtype
    torch_dtype = parse_dtype(dtype)
    choice = pick_backend(target, backend, dtype=str(dtype), draft=draft, methods=methods)
    if measured is not None:
        choice = BackendChoice(choice.backend, measured_reason(measured))
    check_backend(choice.backend, numerics)
    placed = pick_device(device, choice.backend, dtype)
    if static is None:
        from draftsman.strategies.registry import runs_static

        static = placed.type == "cuda" and choice.backend == "torch" and runs_static(methods)
    if threads is not None:
        torch.set_num_threads(threads)
    engine = Engine(load_bundle(target, torch_dtype, choice.backend, numerics, placed, static),
                    torch_dtype, choice.backend, numerics, placed, choice.reason, static)
    if draft is not None:
        engine.model(draft)
    return engine


def generate(prompt: str, *, target: str = DEFAULT_TARGET, draft: str | None = None,
             dtype: str | None = None, backend: str = AUTO, device: str = "auto",
             static: bool | StaticConfig | None = None, **kwargs: Any) -> Result:
    method = kwargs.get("method", DEFAULT)
    options = {k: v for k, v in kwargs.items() if k not in _PREPARE_KEYS}
    engine = load(target, draft=draft, dtype=dtype, backend=backend, device=device,
                  static=static, methods=[(method, options)])
    return engine.generate(prompt, **kwargs)


# Engine.prepare's own keywords; the rest of its keywords are method options
_PREPARE_KEYS = frozenset({"method", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
                           "stop", "chat", "history", "scope"})
