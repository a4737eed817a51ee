"""Speculative decoding over a tree of draft branches, verified in one target forward.

A deterministic drafter (n-gram, prompt lookup) often has several plausible continuations;
a chain bets on one. Here the drafter's best k branches are merged into a trie
(draft_tree.py), the target runs once over [pending tokens, root, trie nodes] with tree
attention (each node sees the committed text and its own ancestors), and the longest path
the target agrees with is kept: greedy matching follows the target's argmax, sampling uses
recursive rejection over the distinct guesses at each node (verify.py), so the output is
exactly the target's in both cases. The depth of the branches comes from the γ policy, the
number of branches from the BranchPlanner (fixed, or the cost model that picks k = 1 --
a plain chain -- where extra verify rows are not nearly free).

Committing a path: a cache that can move entries (torch) compacts the path next to the
committed prefix; one that cannot (llama.cpp, whose attention sums cells in storage order)
keeps only the path's leading nodes that already sit in order -- the first branch is stored
right after the root -- and feeds the rest again at the start of the next forward.

In a batch the same request runs as a step machine (tree_steps.py, which holds the
planning and feedback both share), on backends that declare `ragged_trees`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from draftsman.core import Budget, GenerationConfig, Step, Timer
from draftsman.models.base import DecoderLM
from draftsman.models.protocol import Cache
from draftsman.proposers.base import Proposer
from draftsman.sampling import Sampler
from draftsman.state import ModelState, reads_greedy_tokens
from draftsman.strategies.base import Strategy, check_fits
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import GammaPolicy
from draftsman.strategies.speculative import prefill
from draftsman.strategies.tree_steps import (
    TreeSteps,
    chain_feedback,
    first_branch,
    plan_branches,
    settle_tree,
    tree_room,
)
from draftsman.trees.draft_tree import DraftTree
from draftsman.verification.tree import TreeVerdict


def verify_tree(state: ModelState, pending: list[int], tree: DraftTree,
                sampler: Sampler) -> tuple[TreeVerdict, list[int]]:
    """One target forward over pending[:-1] (plain rows) and the tree rooted at pending[-1];
    commits the accepted path to the cache. Returns the verdict and the target's argmax
    after every node."""
    lay = tree.layout
    branching = any(len(c) > 1 for c in tree.children)
    greedy = reads_greedy_tokens(state.model, sampler.greedy)
    out = state.forward_rows(pending[:-1] + tree.tokens, lay.offsets + lay.prefix,
                             mask=lay.mask if branching else None, logits_at=lay.node_rows,
                             greedy=greedy)
    logits = None if out.logits is None else out.logits[0]
    tokens = None if out.tokens is None else out.tokens[0]
    return settle_tree(state, tree, pending[:-1], logits, sampler, tokens)


class TreeSpeculative(Strategy):
    name = "speculative"
    exactness = "exact"

    def __init__(self, target: DecoderLM, proposer: Proposer, policy: GammaPolicy,
                 planner: BranchPlanner) -> None:
        if proposer.uses_model:
            raise ValueError("tree verification needs a deterministic drafter")
        self.target = target
        self.proposer = proposer
        self.policy = policy
        self.planner = planner

    @property
    def batchable(self) -> bool:  # type: ignore[override]
        """Whether a batch can verify this tree beside other requests (a backend whose
        ragged forward takes per-sequence tree masks)."""
        return self.target.capabilities.has("ragged_trees")

    def steps(self, prompt_ids: list[int], config: GenerationConfig,
              prefill_chunk: int | None = None,
              new_cache: Callable[[int], Cache] | None = None) -> TreeSteps:
        """This request as a step machine for the batch scheduler (tree_steps.py)."""
        return TreeSteps(self.target, self.proposer, self.policy, self.planner, prompt_ids,
                         config, prefill_chunk=prefill_chunk, new_cache=new_cache)

    def generate(self, prompt_ids: list[int], config: GenerationConfig) -> Iterator[Step]:
        check_fits(self.target, len(prompt_ids), config)
        policy, planner = self.policy, self.planner
        room = tree_room(policy, planner)
        capacity = len(prompt_ids) + config.max_new_tokens + room
        state = ModelState(self.target, len(prompt_ids) + config.max_new_tokens,
                           extra_rows=room)
        sampler = Sampler(config.sampling)
        budget = Budget(config)
        timer = Timer()
        step = prefill(state, prompt_ids, sampler, budget, timer)
        committed = prompt_ids + step.tokens
        yield step
        with timer("draft_setup"):  # a one-time cost: out of the policy's cost per guess
            self.proposer.use_history(config.history)
            self.proposer.start(prompt_ids, capacity)
        while not budget.done:
            gamma = min(policy.max_gamma if policy.plans_guesses else policy.next_gamma(),
                        budget.remaining - 1)
            asked = planner.next_branches()
            with timer("draft"):
                branches, planned = plan_branches(self.proposer, policy, committed, gamma,
                                                  asked, sampler)
            gamma = gamma if planned is None else planned
            key = branches[0].extra.get("match") if branches else None
            with timer("verify"):
                pending = state.sync(committed)
                tree = DraftTree.build(pending[-1], [b.tokens for b in branches],
                                       prefix=len(pending) - 1)
                verdict, argmax = verify_tree(state, pending, tree, sampler)
            accepted = [tree.tokens[n] for n in verdict.path[1:]]
            new = budget.clip(accepted + [verdict.next_token])
            committed += new
            with timer("other"):
                planner.update(tree, argmax, asked)
            seconds = timer.take()
            branch = first_branch(tree, verdict.path)
            policy.update(chain_feedback(tree, verdict, branch, argmax, key, seconds))
            kept = min(len(accepted), len(new))
            yield Step(
                new,
                ["draft"] * kept + ["target"] * (len(new) - kept),
                drafted=tree.nodes,
                accepted=len(accepted),
                rejected=verdict.rejected,
                target_forwards=1,
                draft_seconds=seconds.get("draft", 0.0) + seconds.get("draft_setup", 0.0),
                verify_seconds=seconds["verify"],
                other_seconds=seconds.get("other", 0.0),
                finish=budget.finish,
                extra={"gamma": gamma, **(branches[0].extra if branches else {}),
                       "branches": len(branches), "tree_nodes": tree.nodes,
                       "branch": branch, "siblings_tried": verdict.siblings_tried},
            )
