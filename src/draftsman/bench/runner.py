"""`draftsman bench`: time every method on every prompt, side by side, and keep each row.

Order of work (invariants):
1. Everything that can fail or load is done before any timing: datasets, the engine, every
   method's strategy (which loads draft models), the transformers peers.
2. Warm-up: one short untimed generation per contestant.
3. Interleaved timing: for each prompt (and turn), for each repeat, every contestant in turn
   (A, B, C, A, B, C, ...), the baseline first, so drift on a noisy machine hits all alike.
4. Each measurement becomes one row of `results.jsonl`, written and flushed at once with its
   untimed extras (agreement with the baseline, logit margin at a divergence, quality).
5. The summary, plots and HTML report are rebuilt from the whole file at the end.

Multi-turn prompts (`turns="all"`, MT-Bench): turn k's conversation holds the contestant's
own earlier answers, as a user of that method would see them.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import draftsman
from draftsman.backends.choose import AUTO
from draftsman.bench import peer_openvino
from draftsman.bench.auto_backend import choose_engine
from draftsman.bench.contestants import (
    Contestant,
    DraftsmanContestant,
    Outcome,
    Sampling,
    display_name,
)
from draftsman.bench.datasets import Prompt, load_dataset
from draftsman.bench.metrics import step_metrics
from draftsman.bench.peers import HFPeer, load_hf, parse_peers, split_variant
from draftsman.bench.quality import (
    bleu_stats,
    first_divergence,
    logit_margin,
    pass_at_1,
    rouge_l,
)
from draftsman.bench.records import record_fastest
from draftsman.bench.results import (
    ResultsFile,
    Row,
    check_machine,
    check_settings,
    environment,
    machine,
    peak_rss_mb,
    record_invocation,
    reset_peak_rss,
    row_key,
)
from draftsman.bench.spec import (
    BASELINE,
    MethodConfig,
    engine_static,
    parse_engine,
    parse_methods,
)
from draftsman.core import GenerationConfig
from draftsman.engine import DEFAULT_DTYPE, DEFAULT_TARGET
from draftsman.errors import ContextOverflowError, InvalidArgumentError
from draftsman.models.static_step import StaticConfig
from draftsman.proposers.drafters import is_model_free
from draftsman.store.random_weights import weights_label
from draftsman.store.resolve import resolve_gguf
from draftsman.strategies.base import check_fits
from draftsman.strategies.default_method import DEFAULT


@dataclass
class BenchConfig:
    target: str = DEFAULT_TARGET
    draft: str | None = None
    methods: list[str] = field(default_factory=lambda: ["speculative"])
    datasets: list[str] = field(default_factory=lambda: ["humaneval"])
    limit: int | None = 5  # prompts per dataset (the first n)
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    repeats: int = 1
    peers: list[str] = field(default_factory=list)
    out: str = "bench-results"
    threads: int | None = None
    # None: bf16, unless the backend is auto and only `default` runs, on a CPU: then the dtype
    # (and backend) of this machine's fastest record, as `draftsman generate` picks them
    dtype: str | None = None
    backend: str = "auto"  # resolved before anything is measured (backends/choose.py)
    numerics: str = "fast"  # llama.cpp's feeding mode (backends/llama_cpp.py)
    device: str = "auto"  # auto, cpu, cuda[:N]; the device used is in the run's environment
    static: bool = False  # fixed-shape steps, CUDA graphs on a GPU (torch only)
    compile: bool = False  # static steps fused by torch.compile
    resume: bool = False
    turns: str = "first"  # "first" or "all"
    warmup_tokens: int = 8
    progress: bool = True
    pass_timeout: float = 10.0
    command: str = ""

    def settings(self) -> dict[str, Any]:
        """What a row's numbers depend on; `--resume` requires these to match."""
        backend = {} if self.backend == "torch" else {"backend": self.backend,
                                                      "numerics": self.numerics}
        static = {"static": True} if self.static else {}  # older runs resume as before
        static |= {"compile": True} if self.compile else {}
        return {"target": self.target, "draft": self.draft, "dtype": self.dtype, **backend,
                **static,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed,
                "turns": self.turns, "threads": self.threads}

    def sampling(self) -> Sampling:
        return Sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)

    def validate(self) -> None:
        if self.repeats < 1:
            raise InvalidArgumentError(f"repeats must be >= 1, got {self.repeats}")
        if self.limit is not None and self.limit < 1:
            raise InvalidArgumentError(f"limit must be >= 1, got {self.limit}")
        if self.turns not in ("first", "all"):
            raise InvalidArgumentError(f"turns must be 'first' or 'all', got {self.turns!r}")
        if not self.datasets:
            raise InvalidArgumentError("no dataset given")
        parse_methods(self.methods)  # every method and option, before any model loads


@dataclass
class Unit:
    """One prompt turn: what each contestant generates for, in every repeat."""

    prompt: Prompt
    turn: int

    @property
    def key(self) -> str:
        return f"{self.prompt.dataset}:{self.prompt.id}#{self.turn + 1}"


@dataclass
class BenchRun:
    out: Path
    rows: list[Row]
    measured: int
    skipped: list[str]
    paths: dict[str, Path] = field(default_factory=dict)


def load_prompts(config: BenchConfig) -> list[Prompt]:
    prompts: list[Prompt] = []
    for name in config.datasets:
        prompts.extend(load_dataset(name, limit=config.limit))
    if not prompts:
        raise InvalidArgumentError("the datasets gave no prompts")
    return prompts


def other_engine(engines: dict[str, Any], tag: str, config: BenchConfig) -> Any:
    """The engine of an `engine=` tag (spec.parse_engine), loaded once per run."""
    if tag not in engines:
        backend, dtype = parse_engine(tag)
        model_draft = None if is_model_free(config.draft) else config.draft
        engines[tag] = draftsman.load(
            config.target, draft=model_draft, dtype=dtype or "bf16", threads=config.threads,
            backend=backend, numerics=config.numerics if backend == "llama.cpp" else "fast",
            device=config.device, static=engine_static(tag))
    return engines[tag]


def build_contestants(engine: Any, config: BenchConfig) -> list[Contestant]:
    draft = config.draft
    contestants: list[Contestant] = []
    engines: dict[str, Any] = {"": engine}
    for m in parse_methods(config.methods):
        if m.method == DEFAULT:  # what `draftsman generate` would run on this engine
            name, options, _ = engine.resolve_method(DEFAULT, {})
            resolved = MethodConfig(name, tuple((k, str(v)) for k, v in options.items()))
            contestants.append(DraftsmanContestant(engine, resolved, draft,
                                                   label=f"{DEFAULT} ({resolved.label})"))
        else:
            contestants.append(DraftsmanContestant(other_engine(engines, m.engine, config),
                                                   m, draft))
    peers = parse_peers(config.peers)
    variants = [v for peer, v in peers if peer == "hf"]
    contestants += llama_cpp_peers(engine, config, [v for peer, v in peers
                                                    if peer == "llama.cpp"])
    for name, weights in peer_openvino.PEERS.items():
        contestants += openvino_peers(engine, config, [v for peer, v in peers if peer == name],
                                      weights)
    # transformers has no kernel for our q4 / q8 formats: it runs such an engine's folder in
    # bf16, its own CPU path
    hf_dtype = engine.dtype if isinstance(engine.dtype, torch.dtype) else torch.bfloat16
    if "compiled" in variants:  # a model of its own: compiling patches its forward
        compiled = load_hf(engine.target.folder, hf_dtype, engine.device)
        contestants.append(HFPeer("compiled", compiled, engine.target.tokenizer.eos_token_ids))
        variants = [v for v in variants if v != "compiled"]
    if variants:
        target = load_hf(engine.target.folder, hf_dtype, engine.device)
        eos = engine.target.tokenizer.eos_token_ids
        assistant = assistant_name = None
        if "assisted" in variants:
            assistant_name = None if is_model_free(draft) else draft
            if assistant_name is None:
                assistant_name = engine.default_draft()
            assistant = load_hf(engine.model(assistant_name).folder, hf_dtype, engine.device)
        for v in variants:
            drafter = {"assisted": display_name(assistant_name),
                       "prompt-lookup": "prompt-lookup"}.get(v)
            contestants.append(HFPeer(v, target, eos, assistant=assistant, drafter=drafter))
    return contestants


def llama_cpp_peers(engine: Any, config: BenchConfig, variants: list[str]) -> list[Contestant]:
    """llama.cpp's own decoding on the GGUF files behind the target (and draft)."""
    if not variants:
        return []
    from draftsman.bench.peer_llama_cpp import (
        LlamaCppLookupPeer,
        LlamaCppPlainPeer,
        LlamaCppSpeculativePeer,
    )

    threads = config.threads or torch.get_num_threads()
    eos = engine.target.tokenizer.eos_token_ids
    target = resolve_gguf(config.target)
    out: list[Contestant] = []
    for variant in variants:
        v, length = split_variant(variant)
        if v == "plain":
            out.append(LlamaCppPlainPeer(target, threads, eos))
        elif v == "lookup":
            out.append(LlamaCppLookupPeer(target, threads, engine.target.tokenizer, eos,
                                          length))
        else:
            draft = config.draft if config.draft and not is_model_free(config.draft) \
                else engine.default_draft()
            out.append(LlamaCppSpeculativePeer(target, resolve_gguf(draft), display_name(draft),
                                               threads, engine.target.tokenizer, eos, length))
    return out


def openvino_peers(engine: Any, config: BenchConfig, variants: list[str],
                   weights: str = peer_openvino.WEIGHTS) -> list[Contestant]:
    """OpenVINO GenAI's decoding on the exports of the target (and draft) with `weights`
    (int4 or int8) under $DRAFTSMAN_HOME/openvino (`make openvino`)."""
    if not variants:
        return []
    threads = config.threads or torch.get_num_threads()
    eos = engine.target.tokenizer.eos_token_ids
    target = peer_openvino.exported_folder(config.target, weights)
    out: list[Contestant] = []
    for variant in variants:
        v, length = split_variant(variant)
        draft = draft_folder = None
        if v == "speculative":
            draft = config.draft if config.draft and not is_model_free(config.draft) \
                else engine.default_draft()
            draft_folder = peer_openvino.exported_folder(draft, weights)
        out.append(peer_openvino.OpenVINOPeer(v, target, threads, eos, draft=draft_folder,
                                              draft_name=display_name(draft), weights=weights,
                                              draft_length=length))
    return out


def prompt_hash(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


class Bench:
    """One benchmark run over a results folder (see the module docstring)."""

    def __init__(self, config: BenchConfig, engine: Any | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        if config.backend == AUTO and config.static:
            config = replace(config, backend="torch")  # as draftsman.load does for static
        if config.backend == AUTO and engine is None:
            backend, dtype = choose_engine(config.target, config.draft, config.methods,
                                           config.dtype, config.numerics, config.device, self.log)
            config = replace(config, backend=backend, dtype=dtype)
        elif config.backend == AUTO:
            config = replace(config, backend=engine.backend)
        config = replace(config, dtype=config.dtype or DEFAULT_DTYPE)
        self.config = config
        self.out = Path(config.out)
        self.results = ResultsFile(self.out)
        self.settings = config.settings()
        self.existing: list[Row] = []
        if self.results.exists():
            if not config.resume:
                raise InvalidArgumentError(
                    f"{self.results.path} already has results; pass --resume to continue "
                    "that run, or choose another --out")
            self.existing = self.results.rows()
            check_settings(self.existing, self.settings, self.out)
            check_machine(self.existing, machine(), self.out)
        self.prompts = load_prompts(config)
        if engine is None:
            model_draft = None if is_model_free(config.draft) else config.draft
            engine = draftsman.load(config.target, draft=model_draft, dtype=config.dtype,
                                    threads=config.threads, backend=config.backend,
                                    numerics=config.numerics, device=config.device,
                                    static=StaticConfig(compile=True) if config.compile
                                    else config.static)
        self.engine = engine
        self.tokenizer = engine.target.tokenizer
        self.contestants = build_contestants(engine, config)
        self.env = environment(config.dtype if config.backend == "torch" else "gguf (llama.cpp)",
                               numerics=config.numerics)
        self.env["device"] = str(getattr(engine, "device", "cpu"))
        self.env["static"] = bool(getattr(engine, "static", False))
        self.env["weights"] = weights_label(getattr(engine.target, "folder", None))
        self.done = {row_key(r) for r in self.existing}
        self.baseline: dict[tuple[str, int], Row] = {}
        self.answers: dict[tuple[str, int, str], str] = {}  # (unit key, repeat, label)
        for row in self.existing:
            self._remember(row)
        self.skipped: list[str] = []

    # ---- bookkeeping ------------------------------------------------------------------
    def _remember(self, row: Row) -> None:
        if row["label"] == BASELINE:
            self.baseline[(row["prompt_key"], int(row["repeat"]))] = row
        self.answers[(row["prompt_key"], int(row["repeat"]), row["label"])] = row["text"]

    def _baseline_for(self, key: str, repeat: int) -> Row | None:
        row = self.baseline.get((key, repeat))
        if row is None:
            row = next((r for (k, _), r in sorted(self.baseline.items()) if k == key), None)
        return row

    def units(self) -> list[Unit]:
        multi = self.config.turns == "all" and bool(self.tokenizer.chat_template)
        if self.config.turns == "all" and not multi:
            self.log("bench: the target has no chat template; timing first turns only")
        return [Unit(p, t) for p in self.prompts
                for t in range(len(p.turns) if multi and p.turns else 1)]

    def prompt_ids(self, unit: Unit, repeat: int, label: str) -> list[int] | None:
        """Token ids of the unit's conversation for this contestant, None if unavailable."""
        p = unit.prompt
        if unit.turn == 0:
            return self.engine.encode_prompt(p.text)
        messages: list[dict[str, str]] = []
        for t in range(unit.turn):
            answer = self.answers.get((Unit(p, t).key, repeat, label))
            if answer is None:
                return None
            messages += [{"role": "user", "content": p.turns[t]},
                         {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": p.turns[unit.turn]})
        return self.engine.encode_prompt(messages)

    def fits(self, ids: list[int]) -> bool:
        try:
            check_fits(self.engine.target.model, len(ids),
                       GenerationConfig(self.config.max_new_tokens))
        except ContextOverflowError:
            return False
        return True

    # ---- the run ------------------------------------------------------------------------
    def warm_up(self, units: list[Unit]) -> None:
        ids = next((i for u in units if u.turn == 0
                    for i in [self.engine.encode_prompt(u.prompt.text)] if self.fits(i)), None)
        if ids is None:
            return
        for c in self.contestants:
            t0 = time.perf_counter()
            c.warm_up(ids, self.config.sampling(), self.config.warmup_tokens)
            self.log(f"bench: warmed up {c.label} ({time.perf_counter() - t0:.1f} s)")

    def run(self) -> BenchRun:
        from tqdm import tqdm

        units = self.units()
        reps = range(self.config.repeats)
        todo = sum(1 for u in units for r in reps for c in self.contestants
                   if (u.key, c.label, r) not in self.done)
        measured = 0
        if todo:
            self.warm_up(units)
        bar = tqdm(total=todo, desc="bench", unit="gen", disable=not self.config.progress,
                   file=sys.stderr, dynamic_ncols=True)
        try:
            for unit in units:
                for repeat in reps:
                    for c in self.contestants:
                        if (unit.key, c.label, repeat) in self.done:
                            continue
                        bar.set_postfix_str(f"{unit.key} {c.label}", refresh=False)
                        if self.measure(unit, repeat, c):
                            measured += 1
                        bar.update(1)
        except KeyboardInterrupt:
            bar.close()
            self.log(f"bench: interrupted; {measured} new row(s) kept in "
                     f"{self.results.path}; continue with --resume")
            raise
        bar.close()
        from draftsman.bench.controller_report import save_verify_cost

        save_verify_cost(self.out, self.engine)
        return BenchRun(self.out, self.results.rows(), measured, self.skipped)

    def measure(self, unit: Unit, repeat: int, c: Contestant) -> bool:
        ids = self.prompt_ids(unit, repeat, c.label)
        if ids is None or not self.fits(ids):
            why = "no earlier turn" if ids is None else "prompt too long"
            self.skipped.append(f"{unit.key} {c.label} r{repeat}: {why}")
            return False
        seed = self.config.seed + repeat
        reset_peak_rss()
        outcome = c.run(ids, self.config.sampling(), seed)
        row = self.make_row(unit, repeat, c, ids, seed, outcome)
        row["peak_rss_mb"] = peak_rss_mb()
        self.assess(row, unit, ids, outcome)
        self.results.append(row)
        self._remember(row)
        self.done.add(row_key(row))
        return True

    def make_row(self, unit: Unit, repeat: int, c: Contestant, ids: list[int], seed: int,
                 outcome: Outcome) -> Row:
        n = len(outcome.token_ids)
        p = unit.prompt
        row: Row = {
            "label": c.label, "method": c.method, "kind": c.kind, "exactness": c.exactness,
            "drafter": c.drafter, "options": c.options,
            "dataset": p.dataset, "task": p.task, "prompt_id": p.id,
            "prompt_key": unit.key, "turn": unit.turn + 1,
            "repeat": repeat, "seed": seed,
            "prompt_tokens": len(ids), "prompt_hash": prompt_hash(ids),
            "new_tokens": n, "token_ids": outcome.token_ids,
            "text": self.tokenizer.decode(outcome.token_ids), "finish": outcome.finish,
            "seconds": outcome.seconds, "ttft_seconds": outcome.ttft_seconds,
            "tokens_per_second": n / outcome.seconds if outcome.seconds > 0 else None,
            "ms_per_token": 1000 * outcome.seconds / n if n else None,
        }
        if outcome.steps is not None:
            row.update(step_metrics(outcome.steps))
        row.update(settings=self.settings, env=self.env,
                   measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return row

    def assess(self, row: Row, unit: Unit, ids: list[int], outcome: Outcome) -> None:
        """Untimed extras: agreement with the baseline, margin at a divergence, quality."""
        p = unit.prompt
        base = None if row["label"] == BASELINE else self._baseline_for(unit.key, row["repeat"])
        if base is not None:
            mine, theirs = outcome.token_ids, base["token_ids"]
            same_prompt = base["prompt_hash"] == row["prompt_hash"]
            at = first_divergence(mine, theirs) if same_prompt else 0
            row["identical"] = same_prompt and at is None
            row["divergence_index"] = at
            greedy = self.config.temperature == 0
            if same_prompt and at is not None and greedy and at < min(len(mine), len(theirs)):
                m = logit_margin(self.engine.target.model, ids + mine[:at])
                row["divergence_margin"] = m.margin
                row["divergence_tokens"] = {"method": mine[at], "baseline": theirs[at],
                                            "target_top1": m.top1, "target_top2": m.top2}
            row["rouge_l_ar"] = rouge_l(row["text"], base["text"])
            row["bleu_ar_stats"] = bleu_stats(row["text"], base["text"])
        reference = p.reference if unit.turn == 0 else None
        refs = p.metadata.get("references") if isinstance(p.metadata, dict) else None
        if unit.turn > 0 and isinstance(refs, list) and unit.turn < len(refs):
            reference = refs[unit.turn]
        if reference:
            row["rouge_l_ref"] = rouge_l(row["text"], reference)
            row["bleu_ref_stats"] = bleu_stats(row["text"], reference)
        if unit.turn == 0 and {"entry_point", "test"} <= set(p.metadata):
            row["pass_at_1"] = pass_at_1(row["text"], p.metadata, self.config.pass_timeout)


def run_bench(config: BenchConfig, engine: Any | None = None,
              log: Callable[[str], None] | None = None) -> BenchRun:
    """Measure (or resume), then write summary.md, the plots and report.html."""
    from draftsman.bench.report import write_report

    bench = Bench(config, engine, log)
    record_invocation(Path(bench.config.out), asdict(bench.config))
    result = bench.run()
    result.paths = write_report(result.out, result.rows, asdict(bench.config))
    record_fastest(bench.config.target, bench.config.temperature, bench.config.numerics,
                   bench.engine, result.rows, bench.log)
    return result
