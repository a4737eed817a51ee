"""What the runner times: a draftsman method configuration or a peer implementation.

Every contestant receives the same prompt token ids and the same sampling settings and
returns its new token ids, counted the same way for all: the tokens after the prompt, cut
after the first EOS (kept) and at max_new_tokens. Only `run` is timed; building the request
(loading models, validation) happens before the clock starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from draftsman.bench.spec import BASELINE, MethodConfig
from draftsman.core import Step
from draftsman.errors import InvalidArgumentError
from draftsman.strategies.registry import method


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass
class Outcome:
    token_ids: list[int]
    seconds: float  # from the prompt ids to the last token
    ttft_seconds: float | None = None  # to the first committed token, when streamed
    steps: list[Step] | None = None  # draftsman methods only
    finish: str | None = None


@dataclass
class Contestant:
    label: str
    method: str
    kind: str  # "baseline", "draftsman", "peer"
    exactness: str = "exact"
    drafter: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        raise NotImplementedError

    def warm_up(self, prompt_ids: list[int], sampling: Sampling, tokens: int) -> None:
        """One short untimed generation: first-call allocations, lazy loads, caches."""
        short = Sampling(min(tokens, sampling.max_new_tokens), sampling.temperature,
                         sampling.top_k, sampling.top_p)
        self.run(prompt_ids, short, 0)


def clip_new_tokens(ids: list[int], eos: frozenset[int], max_new_tokens: int) -> list[int]:
    """The counting rule shared by every contestant: cut after the first EOS (kept)."""
    out: list[int] = []
    for t in ids[:max_new_tokens]:
        out.append(t)
        if t in eos:
            break
    return out


class DraftsmanContestant(Contestant):
    """A registered strategy with its options, driven through `Engine.prepare` / `run`."""

    def __init__(self, engine: Any, config: MethodConfig, default_draft: str | None,
                 label: str | None = None) -> None:
        options = config.kwargs()
        self.engine = engine
        # --draft fills in the draft model of methods that declare one and were not given one
        if (default_draft and method(config.method).takes_draft
                and "draft" not in options and "drafter" not in options):
            options["draft"] = default_draft
        self._options = options
        # build once: checks the options and loads any draft model now, before timing
        strategy = engine.strategy(config.method, options)
        drafter = options.get("draft") or options.get("drafter")
        if drafter is None and getattr(strategy, "proposer", None) is not None:
            drafter = _default_draft_name(engine)
        label = label or config.label
        super().__init__(
            label=label, method=config.method,
            kind="baseline" if label == BASELINE else "draftsman",
            exactness=getattr(strategy, "exactness", "exact"),
            drafter=display_name(drafter),
            options={k: v for k, v in config.options},
        )

    def warm_up(self, prompt_ids: list[int], sampling: Sampling, tokens: int) -> None:
        """Every static step compiled and captured first (a short generation meets only
        some of them), then the short generation."""
        self.engine.warm_up()
        super().warm_up(prompt_ids, sampling, tokens)

    def request(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Any:
        return self.engine.prepare(
            list(prompt_ids), method=self.method, max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            seed=seed, **self._options)

    def run(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Outcome:
        request = self.request(prompt_ids, sampling, seed)
        ids: list[int] = []
        steps: list[Step] = []
        ttft = None
        finish = None
        t0 = time.perf_counter()
        for event in self.engine.run(request):
            if ttft is None and event.token_ids:
                ttft = time.perf_counter() - t0
            ids.extend(event.token_ids)
            steps.append(event.step)
            finish = event.finish
        seconds = time.perf_counter() - t0
        return Outcome(ids, seconds, ttft, steps, finish or "length")


def display_name(model: object | None) -> str | None:
    """A model spec as tables show it: a folder or file path by its last component."""
    if model is None:
        return None
    text = str(model).rstrip("/")
    return text.rsplit("/", 1)[-1] if "/" in text and not text.startswith("hf:") else text


def _default_draft_name(engine: Any) -> str | None:
    try:
        return engine.default_draft()
    except InvalidArgumentError:
        return None
