"""Method name + options -> a ready Strategy, with clear errors for bad options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftsman.backends.llama_cpp import SHORT as TREE_ROWS
from draftsman.errors import InvalidArgumentError, UnsupportedError
from draftsman.profiling import draft_cost_ratio, verify_cost_curve
from draftsman.proposers.base import Proposer
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.proposers.ngram import NGramProposer
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.proposers.staged import StagedProposer
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.base import Strategy
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import CostModelGamma, GammaPolicy, make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative

if TYPE_CHECKING:
    from draftsman.engine import Engine

DETERMINISTIC_DRAFTERS = ("ngram", "prompt-lookup")


def make_proposer(spec: str, engine: Engine) -> Proposer:
    if spec == "ngram":
        return NGramProposer()
    if spec == "prompt-lookup":
        return PromptLookupProposer()
    return DraftModelProposer(engine.model(spec).model)


def _take(options: dict[str, Any], method: str, allowed: dict[str, Any]) -> dict[str, Any]:
    unknown = set(options) - set(allowed)
    if unknown:
        raise InvalidArgumentError(
            f"unknown option(s) {', '.join(sorted(unknown))} for {method}; "
            f"valid: {', '.join(sorted(allowed)) or 'none'}")
    return {k: options.get(k, v) for k, v in allowed.items()}


def _int(value: Any, name: str, minimum: int = 1) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}") from None
    if out < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {out}")
    return out


def _calibrate(policy: GammaPolicy, engine: Engine, proposer: Proposer,
               draft: str | None = None) -> None:
    """The cost-model policy needs this machine's verify cost curve and, for a draft model,
    its cost per guess; it must not re-probe a draft model once it has stopped paying (the
    draft would first read every skipped token)."""
    if isinstance(policy, CostModelGamma):
        policy.probe = not proposer.uses_model
        draft_cost = draft_cost_ratio(engine, draft) if proposer.uses_model and draft else None
        policy.calibrate(verify_cost_curve(engine, policy.max_gamma + 1), draft_cost)


def build_autoregressive(engine: Engine, options: dict[str, Any]) -> Strategy:
    _take(options, "autoregressive", {})
    return Autoregressive(engine.target.model)


def build_speculative(engine: Engine, options: dict[str, Any]) -> Strategy:
    o = _take(options, "speculative", {"draft": None, "drafter": None, "gamma": 4,
                                        "gamma_policy": None, "max_gamma": 12,
                                        "branches": 1, "max_branches": 4})
    spec = o["draft"] or o["drafter"] or engine.default_draft()
    policy = make_policy(o["gamma"], o["gamma_policy"], _int(o["max_gamma"], "max_gamma"))
    policy.max_gamma = max(policy.max_gamma, policy.gamma)
    proposer = make_proposer(str(spec), engine)
    _calibrate(policy, engine, proposer, str(spec))
    if str(o["branches"]) == "1":
        return Speculative(engine.target.model, proposer, policy)
    if proposer.uses_model:
        raise InvalidArgumentError(
            f"branches needs a deterministic drafter ({', '.join(DETERMINISTIC_DRAFTERS)}), "
            f"not the model {spec}")
    return TreeSpeculative(engine.target.model, proposer, policy,
                           _branch_planner(engine, o["branches"], o["max_branches"], policy))


def _branch_planner(engine: Engine, branches: Any, max_branches: Any,
                    policy: GammaPolicy) -> BranchPlanner:
    """branches: an integer >= 1 or 'auto' (the cost model, up to max_branches)."""
    auto = str(branches) == "auto"
    k = _int(max_branches if auto else branches, "max_branches" if auto else "branches")
    rows = (k + 1) * policy.max_gamma + 1  # the re-fed path, the root and k branches
    if getattr(engine, "backend", "torch") == "llama.cpp" and rows > TREE_ROWS:
        raise InvalidArgumentError(
            f"{k} branches of up to {policy.max_gamma} guesses need {rows} rows per verify; "
            f"the llama.cpp backend verifies trees of up to {TREE_ROWS}: lower "
            "max_branches or max_gamma")
    if not auto:
        return BranchPlanner(k)
    refeed = getattr(engine, "backend", "torch") == "llama.cpp"
    return BranchPlanner(None, k, verify_cost_curve(engine, rows), refeed=refeed)


def build_staged(engine: Engine, options: dict[str, Any]) -> Strategy:
    o = _take(options, "staged", {"draft": None, "subdraft": "ngram", "gamma": 4,
                                   "subgamma": 4, "gamma_policy": None, "max_gamma": 12})
    draft = o["draft"] or engine.default_draft()
    if draft in DETERMINISTIC_DRAFTERS:
        raise InvalidArgumentError("staged needs a draft model in the middle (--draft MODEL)")
    sub = make_proposer(str(o["subdraft"]), engine)
    middle = StagedProposer(engine.model(draft).model, sub, _int(o["subgamma"], "subgamma"))
    policy = make_policy(o["gamma"], o["gamma_policy"], _int(o["max_gamma"], "max_gamma"))
    policy.max_gamma = max(policy.max_gamma, policy.gamma)
    _calibrate(policy, engine, middle, str(draft))
    return Speculative(engine.target.model, middle, policy)


def build_big_little(engine: Engine, options: dict[str, Any]) -> Strategy:
    from draftsman.strategies.big_little import BigLittle, BigLittleConfig

    o = _take(options, "big-little", {"draft": None, "fallback": 0.5, "rollback": 3.0,
                                       "max_small": 10, "distance": "cross-entropy",
                                       "early_exit": None})
    config = BigLittleConfig.from_options(o["fallback"], o["rollback"], o["max_small"],
                                          o["distance"])
    if o["early_exit"] is not None:
        if o["draft"] is not None:
            raise InvalidArgumentError("big-little: give either --draft or early_exit, not both")
        layer = _int(o["early_exit"], "early_exit")
        return BigLittle(engine.target.model, None, config, early_exit=layer)
    draft = str(o["draft"] or engine.default_draft())
    if draft in DETERMINISTIC_DRAFTERS:
        raise InvalidArgumentError("big-little needs a small model (--draft MODEL), not "
                                   f"{draft}; or use --option early_exit=LAYERS")
    return BigLittle(engine.target.model, engine.model(draft).model, config)


def build_parallel_prompt(engine: Engine, options: dict[str, Any]) -> Strategy:
    from draftsman.strategies.parallel_prompt import build

    return build(engine, options)


def build_pipelined(engine: Engine, options: dict[str, Any]) -> Strategy:
    from draftsman.strategies.pipelined import build

    return build(engine, options)


BUILDERS = {
    "autoregressive": build_autoregressive,
    "speculative": build_speculative,
    "staged": build_staged,
    "parallel-prompt": build_parallel_prompt,
    "big-little": build_big_little,
    "pipelined": build_pipelined,
}


# What a method needs from the model that llama.cpp's API does not expose.
TORCH_ONLY = {
    "parallel-prompt": "prompt-token embeddings fed beside the tokens",
    "pipelined": "hidden states of an intermediate layer",
}


def make_strategy(method: str, engine: Engine, options: dict[str, Any]) -> Strategy:
    builder = BUILDERS.get(method)
    if builder is None:
        raise InvalidArgumentError(
            f"unknown method {method!r}; choose from {', '.join(sorted(BUILDERS))}")
    if getattr(engine, "backend", "torch") != "torch":
        need = TORCH_ONLY.get(method)
        if method == "big-little" and options.get("early_exit") is not None:
            need = "hidden states of an intermediate layer (early_exit)"
        if need:
            raise UnsupportedError(
                f"{method} needs {need}, which the {engine.backend} backend does not expose; "
                "use --backend torch")
    return builder(engine, options)
