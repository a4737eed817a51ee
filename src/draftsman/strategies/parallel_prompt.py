"""Parallel prompt decoding (Chen et al., "Hardware-Aware Parallel Prompt Decoding").

No draft model: m trained prompt-token embeddings follow the last accepted token, and the
target guesses the next m tokens from them in the same forward that verifies the previous
guesses. Each step is one target forward over

    [root = last committed token] + candidate tree (ranked guesses) + prompt tokens on nodes

with tree attention (tree.py). The accepted path is committed with `cache.keep`, the
target's token after it becomes the next root, and the prompt tokens of the last accepted
node supply the next guesses. The tree depends on the *state* k (prompt tokens carried by
the last accepted node = guesses available): the dynamic sparse tree of section 4
(sparse_tree.py) holds one tree per state, sized for this machine (τ(n) / L_fp(n)).

Exactness: greedy matching commits exactly the autoregressive tokens (candidate rows never
see prompt rows). With temperature > 0 the paper's typical acceptance is used: lossy,
reported with its threshold in every Step's `extra`.

    τ = committed tokens / target forwards = 1 + E[accepted path length]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.errors import InvalidArgumentError
from draftsman.models.base import DecoderLM
from draftsman.models.prompt_tokens import PromptTokens, find_prompt_tokens
from draftsman.profiling import load_profile, measure_latency, profile_path, save_profile
from draftsman.proposers.prompt_tokens import PromptTokenDraftProposer
from draftsman.sampling import Sampler
from draftsman.state import ModelState
from draftsman.strategies.base import Strategy, check_fits
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.options import MethodOptions, option
from draftsman.strategies.speculative import Speculative
from draftsman.trees.sparse import KINDS, PRIOR_ACCURACY, TreeSet, choose_size, make_trees
from draftsman.verification.prompt_tree import TreeDecoder
from draftsman.verification.tree import TypicalAcceptance

if TYPE_CHECKING:
    from draftsman.engine import Engine


class ParallelPrompt(Strategy):
    name = "parallel-prompt"
    exactness = "exact-greedy"  # typical acceptance (temperature > 0) is lossy

    def __init__(self, decoder: TreeDecoder, typical: TypicalAcceptance | None = None,
                 info: dict | None = None) -> None:
        self.decoder = decoder
        self.target: DecoderLM = decoder.model
        self.typical = typical or TypicalAcceptance()
        self.info = dict(info or {})

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        model = self.target
        check_fits(model, len(prompt_ids), config)
        dec = self.decoder
        m, n = dec.prompts.count, dec.prompts.epts
        state = ModelState(model, len(prompt_ids) + config.max_new_tokens,
                           extra_rows=max(dec.max_rows, m * n) + 2)  # tree + prompt rows
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        timer = Timer()
        lossy = not sampler.greedy
        extra = dict(self.info)
        if lossy:
            extra.update(acceptance="typical", threshold=self.typical.threshold,
                         typical_alpha=self.typical.alpha, lossy=True)
        with timer("verify"):  # prefill: prompt + m prompt tokens -> first token + guesses
            res = dec.step(state.cache, list(prompt_ids), None, sampler, self.typical)
            state.record(list(prompt_ids))
        tokens = budget.clip([res.next_token])
        yield Step(tokens, ["target"], target_forwards=1, prefill=True,
                   verify_seconds=timer.take()["verify"], finish=budget.finish,
                   extra={**extra, "state": res.state, "rows": res.rows})
        # No guesses after a step (its accepted node carried no prompt rows): state 0's tree,
        # which keeps the size budget, not the prefill's root with all m prompt tokens
        none = torch.empty((0, dec.topk), dtype=torch.long, device=model.device)
        root, guesses = res.next_token, res.guesses if res.guesses is not None else none
        while not budget.done:
            with timer("verify"):
                res = dec.step(state.cache, [root], guesses, sampler, self.typical)
                state.record([root] + res.accepted)
            new = budget.clip(res.accepted + [res.next_token])
            kept = min(len(res.accepted), len(new))
            yield Step(
                new,
                ["prompt"] * kept + ["target"] * (len(new) - kept),
                drafted=res.drafted,
                accepted=len(res.accepted),
                rejected=res.rejected,
                target_forwards=1,
                verify_seconds=timer.take()["verify"],
                finish=budget.finish,
                extra={**extra, "state": res.state, "rows": res.rows},
            )
            root, guesses = res.next_token, res.guesses if res.guesses is not None else none


# ----------------------------------------------------------------------------- building

DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16"}


def resolve_prompt_tokens(spec: str | None, bundle, count: int, epts: int, seed: int):
    """A folder, "random" (untrained, from vocabulary embeddings: for tests and ablations),
    or None: the prompt tokens saved beside the model or shipped for its catalogue name."""
    if spec == "random":
        return PromptTokens.from_vocabulary(bundle.model, count, epts, seed)
    folder = spec or find_prompt_tokens(bundle.folder, bundle.name)
    if folder is None:
        raise InvalidArgumentError(
            f"no prompt tokens for {bundle.name}: train them with `draftsman train "
            "prompt-tokens`, pass --option prompt_tokens=FOLDER, or prompt_tokens=random")
    return PromptTokens.load(folder)


def select_trees(prompts, model: DecoderLM, model_name: str, kind: str, size: str | int,
                 dtype: str, seed: int = 0):
    """The TreeSet to run: cached in trees.json when calibrated (else built from the prior
    accuracies); size "auto" maximises τ(n) / L_fp(n) with this machine's latency profile
    (measured and saved on first use, see `draftsman profile`)."""
    if kind not in KINDS:
        raise InvalidArgumentError(f"tree must be one of {', '.join(KINDS)}, got {kind!r}")
    table = prompts.trees() or {}
    acc = table.get("accuracy", PRIOR_ACCURACY)[: prompts.count]
    cached = {int(n): t for n, t in table.get(kind, {}).items()} if kind != "random" else {}
    if size == "auto":
        sizes = sorted(cached) or list(range(1, 49))
        tau = {n: (cached[n]["tau"] if n in cached else
                   make_trees(kind, acc, prompts.count, n, prompts.epts, seed).tau)
               for n in sizes}
        threads = torch.get_num_threads()
        path = profile_path(model_name, dtype, threads)
        latency = load_profile(path)
        if latency is None:
            latency = measure_latency(model, [1, 2, 4, 8, 16, 24, 32, 48], 128, 2)
            save_profile(path, latency, {"model": model_name, "dtype": dtype,
                                         "threads": threads, "context": 128, "repeats": 2})
        rows = choose_size(tau, latency)
    else:
        try:
            rows = int(size)
        except ValueError:
            raise InvalidArgumentError(
                f"tree_size must be an integer or auto, got {size!r}") from None
        if rows < 1:
            raise InvalidArgumentError("tree_size must be >= 1")
    if rows in cached:
        return TreeSet.from_json(cached[rows])
    return make_trees(kind, acc, prompts.count, rows, prompts.epts, seed)


AUTO = {"auto": "auto"}


@dataclass(frozen=True)
class ParallelPromptOptions(MethodOptions):
    """`--method parallel-prompt` options; with `draft`, the draft model's own prompt tokens
    draft for speculative decoding of the target instead."""

    prompt_tokens: str | None = option(None, "a trained prompt-token folder, or 'random' "
                                             "(default: the ones saved for the target)")
    tree: str = option("dynamic", "candidate tree: the dynamic sparse tree, a static one, "
                                  "or random", choices=KINDS)
    tree_size: int | str = option("auto", "tree rows per forward; 'auto' fits this machine's "
                                          "latency profile", kind=int, minimum=1, words=AUTO)
    count: int = option(3, "random prompt tokens: how many", kind=int, minimum=1)
    epts: int = option(1, "random prompt tokens: embeddings per prompt token", kind=int,
                       minimum=1)
    seed: int = option(0, "random prompt tokens and trees: the seed", kind=int, minimum=0)
    threshold: float = option(0.09, "typical acceptance (temperature > 0): probability floor",
                              kind=float, minimum=0)
    typical_alpha: float = option(0.3, "typical acceptance: entropy factor", kind=float,
                                  minimum=0)
    draft: str | None = option(None, "a draft model whose own prompt tokens draft for the "
                                     "target (speculative combination)")
    draft_prompt_tokens: str | None = option(None, "the draft's prompt-token folder or "
                                                   "'random'")
    draft_tree_size: int | str = option("auto", "the draft's tree rows per forward or 'auto'",
                                        kind=int, minimum=1, words=AUTO)
    gamma: int | str = option(6, "with draft: tokens drafted per step, or 'auto'", kind=int,
                              minimum=1, words=AUTO)
    max_gamma: int = option(12, "with draft: the largest gamma", kind=int, minimum=1)

    def needs(self) -> dict[str, str]:
        return {"input_embeddings": "prompt-token embeddings fed beside the tokens"}


def build(engine: Engine, o: ParallelPromptOptions) -> Strategy:
    """Registry builder: `--method parallel-prompt [--option KEY=VALUE ...]`."""
    dtype = DTYPE_NAMES.get(str(engine.dtype), str(engine.dtype))  # "q4" / "q8" stay as named
    if o.draft:
        bundle = engine.model(o.draft)
        prompts = resolve_prompt_tokens(o.draft_prompt_tokens, bundle, o.count, o.epts, o.seed)
        trees = select_trees(prompts, bundle.model, bundle.name, o.tree, o.draft_tree_size,
                             dtype, o.seed)
        proposer = PromptTokenDraftProposer(TreeDecoder(bundle.model, prompts, trees.states))
        policy = make_policy(o.gamma, None, o.max_gamma)
        policy.max_gamma = max(policy.max_gamma, policy.gamma)
        return Speculative(engine.target.model, proposer, policy)
    target = engine.target
    prompts = resolve_prompt_tokens(o.prompt_tokens, target, o.count, o.epts, o.seed)
    trees = select_trees(prompts, target.model, target.name, o.tree, o.tree_size, dtype, o.seed)
    typical = TypicalAcceptance(o.threshold, o.typical_alpha)
    info = {"tree": trees.kind, "tree_rows": trees.rows, "predicted_tau": trees.tau}
    return ParallelPrompt(TreeDecoder(target.model, prompts, trees.states), typical, info)
