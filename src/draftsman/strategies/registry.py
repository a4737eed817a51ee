"""Method name -> (its options dataclass, its builder), with clear errors for bad options.

Every front end goes through `method_options` (validation, no model loaded) and
`make_strategy` (validation, capability checks, then building, which may load drafts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from draftsman.errors import InvalidArgumentError
from draftsman.models.protocol import require
from draftsman.models.weight_formats import DTYPE_CHOICES
from draftsman.profiling import draft_cost_ratio, verify_cost_curve
from draftsman.proposers.base import Proposer
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.proposers.drafters import MODEL_FREE, is_model_free
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.proposers.staged import StagedProposer
from draftsman.proposers.suffix import SuffixProposer
from draftsman.strategies import parallel_prompt, pipelined
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.base import Strategy
from draftsman.strategies.big_little import BigLittle, BigLittleOptions
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import POLICIES, CostModelGamma, GammaPolicy, make_policy
from draftsman.strategies.options import MethodOptions, option, parse, takes
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative

if TYPE_CHECKING:
    from draftsman.engine import Engine

AUTO = {"auto": "auto"}
DRAFT_DTYPE_HELP = ("the draft model's weight format (default: the target's; q4-draft under "
                    "q4). Model-free drafters ignore it")
DRAFT_VOCAB_HELP = ("the draft model's head scores only its N most frequent tokens "
                    "(frequency-ranked drafting: a cheaper draft forward, still exact; "
                    "default: the whole vocabulary)")
DRAFT_HELP = ("draft model (name/path) or a model-free drafter (" + ", ".join(MODEL_FREE)
              + "); default: the target's catalogue draft")


@dataclass(frozen=True)
class AutoregressiveOptions(MethodOptions):
    """`--method autoregressive` takes no options."""


@dataclass(frozen=True)
class SpeculativeOptions(MethodOptions):
    """`--method speculative` options (`drafter` is another name of `draft`)."""

    aliases: ClassVar[dict[str, str]] = {"drafter": "draft"}

    draft: str | None = option(None, DRAFT_HELP)
    draft_dtype: str | None = option(None, DRAFT_DTYPE_HELP, choices=tuple(DTYPE_CHOICES))
    draft_vocab: int | None = option(None, DRAFT_VOCAB_HELP, kind=int, minimum=1)
    gamma: int | str = option(4, "tokens drafted per step, or 'auto' for an adaptive policy",
                              kind=int, minimum=1, words=AUTO)
    gamma_policy: str | None = option(None, "how gamma adapts (default: fixed; cost with "
                                            "gamma=auto)", choices=tuple(sorted(POLICIES)))
    max_gamma: int = option(12, "the largest gamma an adaptive policy may choose", kind=int,
                            minimum=1)
    branches: int | str = option(1, "draft branches verified as one tree (model-free "
                                    "drafters), or 'auto'", kind=int, minimum=1, words=AUTO)
    max_branches: int = option(4, "the most branches with branches=auto", kind=int, minimum=1)


@dataclass(frozen=True)
class StagedOptions(MethodOptions):
    """`--method staged` options: subdraft drafts for draft, which drafts for the target."""

    draft: str | None = option(None, "the middle draft model (default: the target's "
                                     "catalogue draft)")
    draft_dtype: str | None = option(None, DRAFT_DTYPE_HELP, choices=tuple(DTYPE_CHOICES))
    draft_vocab: int | None = option(None, DRAFT_VOCAB_HELP, kind=int, minimum=1)
    subdraft: str = option("ngram", "the lowest drafter: a model, " + " or ".join(MODEL_FREE))
    gamma: int | str = option(4, "tokens the middle model drafts per step, or 'auto'",
                              kind=int, minimum=1, words=AUTO)
    subgamma: int = option(4, "tokens the subdraft drafts per middle step", kind=int,
                           minimum=1)
    gamma_policy: str | None = option(None, "how gamma adapts (default: fixed; cost with "
                                            "gamma=auto)", choices=tuple(sorted(POLICIES)))
    max_gamma: int = option(12, "the largest gamma an adaptive policy may choose", kind=int,
                            minimum=1)
    bypass: int | None = option(None, "a model-free subdraft whose match is at least N tokens "
                                      "sends its guesses straight to the target, up to "
                                      "max_gamma, skipping the middle model (needs "
                                      "gamma=auto)", kind=int, minimum=1)


def make_proposer(spec: str, engine: Engine, dtype: str | None = None,
                  vocab: int | None = None) -> Proposer:
    if spec == "ngram":
        return NGramProposer()
    if spec == "prompt-lookup":
        return PromptLookupProposer()
    if spec == "suffix":
        return SuffixProposer()
    return DraftModelProposer(engine.model(spec, dtype, vocab).model)


def _calibrate(policy: GammaPolicy, engine: Engine, proposer: Proposer,
               draft: str | None = None, dtype: str | None = None,
               vocab: int | None = None) -> None:
    """The cost-model policy needs this machine's verify cost curve and, for a draft model
    (in `dtype`), its cost per guess; it must not re-probe a draft model once it has
    stopped paying (the draft would first read every skipped token)."""
    if isinstance(policy, CostModelGamma):
        policy.probe = not proposer.uses_model
        policy.bypassing = proposer.bypasses
        if proposer.uses_model:
            draft_cost = draft_cost_ratio(engine, draft, dtype, vocab) if draft else None
        else:
            # n-gram, lookup and suffix guesses cost microseconds next to a forward: a prior
            # of 0.3 forwards a guess (a draft model's) made every fresh request under load
            # refuse them until its running estimate decayed (load-amx-row-budget)
            draft_cost = 0.0
        policy.calibrate(verify_cost_curve(engine, policy.max_gamma + 1), draft_cost)


def _policy(gamma: int | str, name: str | None, max_gamma: int) -> GammaPolicy:
    policy = make_policy(gamma, name, max_gamma)
    policy.max_gamma = max(policy.max_gamma, policy.gamma)
    return policy


def build_autoregressive(engine: Engine, options: AutoregressiveOptions) -> Strategy:
    return Autoregressive(engine.target.model)


def build_speculative(engine: Engine, o: SpeculativeOptions) -> Strategy:
    spec = o.draft or engine.default_draft()
    policy = _policy(o.gamma, o.gamma_policy, o.max_gamma)
    proposer = make_proposer(spec, engine, o.draft_dtype, o.draft_vocab)
    _calibrate(policy, engine, proposer, spec, o.draft_dtype, o.draft_vocab)
    if o.branches == 1:
        return Speculative(engine.target.model, proposer, policy)
    if proposer.uses_model:
        raise InvalidArgumentError(
            f"branches needs a deterministic drafter ({', '.join(MODEL_FREE)}), "
            f"not the model {spec}")
    return TreeSpeculative(engine.target.model, proposer, policy,
                           _branch_planner(engine, o.branches, o.max_branches, policy))


def _branch_planner(engine: Engine, branches: int | str, max_branches: int,
                    policy: GammaPolicy) -> BranchPlanner:
    """branches: an integer >= 1 or 'auto' (the cost model, up to max_branches)."""
    auto = branches == "auto"
    k = max_branches if auto else int(branches)
    rows = (k + 1) * policy.max_gamma + 1  # the re-fed path, the root and k branches
    caps = engine.target.model.capabilities
    if caps.max_tree_rows is not None and rows > caps.max_tree_rows:
        raise InvalidArgumentError(
            f"{k} branches of up to {policy.max_gamma} guesses need {rows} rows per verify; "
            f"the {caps.backend} backend verifies trees of up to {caps.max_tree_rows}: lower "
            "max_branches or max_gamma")
    if not auto:
        return BranchPlanner(k)
    # without an exact keep, a later branch's accepted nodes are fed again
    return BranchPlanner(None, k, verify_cost_curve(engine, rows),
                         refeed=not caps.exact_tree_keep)


def build_staged(engine: Engine, o: StagedOptions) -> Strategy:
    draft = o.draft or engine.default_draft()
    if is_model_free(draft):
        raise InvalidArgumentError("staged needs a draft model in the middle (--draft MODEL)")
    sub = make_proposer(o.subdraft, engine)
    policy = _policy(o.gamma, o.gamma_policy, o.max_gamma)
    if o.bypass is not None and (sub.uses_model or not policy.plans_guesses):
        raise InvalidArgumentError(
            "bypass needs a model-free subdraft (" + ", ".join(MODEL_FREE) + ") and "
            "gamma=auto (the cost model plans the bypassed guesses)")
    middle = StagedProposer(engine.model(draft, o.draft_dtype, o.draft_vocab).model, sub,
                            o.subgamma, o.bypass)
    _calibrate(policy, engine, middle, draft, o.draft_dtype, o.draft_vocab)
    return Speculative(engine.target.model, middle, policy)


def build_big_little(engine: Engine, o: BigLittleOptions) -> Strategy:
    config = o.config()
    if o.early_exit is not None:
        if o.draft is not None:
            raise InvalidArgumentError("big-little: give either --draft or early_exit, not both")
        return BigLittle(engine.target.model, None, config, early_exit=o.early_exit)
    draft = o.draft or engine.default_draft()
    if is_model_free(draft):
        raise InvalidArgumentError("big-little needs a small model (--draft MODEL), not "
                                   f"{draft}; or use --option early_exit=LAYERS")
    return BigLittle(engine.target.model, engine.model(draft).model, config)


@dataclass(frozen=True)
class Method:
    """A registered method: its options dataclass and how to build it from them."""

    options: type[MethodOptions]
    build: Callable[[Any, Any], Strategy]
    # False where a draft is an optional add-on that changes the method (parallel-prompt
    # with a draft is the speculative combination): --draft does not fill it in
    draft_by_default: bool = True

    @property
    def takes_draft(self) -> bool:
        """Whether the method runs a draft model given as `draft` by default (--draft fills
        it in); parallel-prompt takes one only when asked for by name."""
        return self.draft_by_default and takes(self.options, "draft")


METHODS: dict[str, Method] = {
    "autoregressive": Method(AutoregressiveOptions, build_autoregressive),
    "speculative": Method(SpeculativeOptions, build_speculative),
    "staged": Method(StagedOptions, build_staged),
    "parallel-prompt": Method(parallel_prompt.ParallelPromptOptions, parallel_prompt.build,
                              draft_by_default=False),
    "big-little": Method(BigLittleOptions, build_big_little),
    "pipelined": Method(pipelined.PipelinedOptions, pipelined.build),
}


def method(name: str) -> Method:
    entry = METHODS.get(name)
    if entry is None:
        raise InvalidArgumentError(
            f"unknown method {name!r}; choose from {', '.join(sorted(METHODS))}")
    return entry


def method_options(name: str, values: Mapping[str, Any]) -> MethodOptions:
    """Validate `values` for method `name` (strings or JSON scalars); loads nothing."""
    return parse(method(name).options, values, name)


def runs_static(methods: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
    """Whether every one of `methods` ((name, options) pairs; the default method always)
    runs on static steps, which keep no layer ranges (models/static_step.STATIC_LACKS)."""
    from draftsman.models.static_step import STATIC_LACKS

    return not any(cap in STATIC_LACKS for name, options in methods if name != "default"
                   for cap in method_options(name, options).needs())


def make_strategy(name: str, engine: Engine,
                  options: Mapping[str, Any] | MethodOptions) -> Strategy:
    """Validate the options, check the target's capabilities, then build."""
    entry = method(name)
    if not isinstance(options, MethodOptions):
        options = parse(entry.options, options, name)
    caps = engine.target.model.capabilities
    for capability, why in options.needs().items():
        require(caps, capability, name, why)
    return entry.build(engine, options)
