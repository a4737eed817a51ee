"""Tree speculation of one request as a step machine, so a batch can verify its tree beside
other requests' rows in one ragged forward (strategies/step_machine.py has the cycle).

Per step the request feeds [pending tokens but the last, root, trie nodes] at positions
that siblings share, attending through the tree's own mask (the segment's mask in the
ragged forward); `accept` reads the nodes' logits, follows the longest path the target
agrees with (greedy or recursive rejection, verification/tree.py) and compacts that path
next to the committed text, exactly as `TreeSpeculative` alone does (the planning and
feedback below are shared with it).

Invariants (those of the step machine, plus): a step's rows are scratch until `accept`
keeps the path; untrimmed, the branch planner and the γ policy see the same trees and
verdicts as alone, so a request's output in a batch equals its output alone. Under load the
batch controller prices a tree as its first branch (a chain of the learnt α): keeping fewer
guesses than that branch cuts the tree to that branch's first n (n = 0: no guess), keeping
them all keeps the whole tree (its other branches ride along unpriced). A trimmed tree is
still verified exactly: greedy output is unchanged and a sampled one keeps the target's
distribution. A tree with a draft model, or a seeded sampled one, is never trimmed.
Backends whose ragged forward holds no per-sequence masks (llama.cpp) do not declare
`ragged_trees`, and their trees run alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from draftsman.core import GenerationConfig, Step
from draftsman.models.base import DecoderLM
from draftsman.models.protocol import Cache
from draftsman.proposers.base import Proposal, Proposer
from draftsman.sampling import Sampler, greedy_tokens
from draftsman.state import ModelState
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import Feedback, GammaPolicy
from draftsman.strategies.step_machine import NO_GUESS, Rows, SpeculativeSteps
from draftsman.trees.draft_tree import DraftTree
from draftsman.verification.tree import TreeVerdict, verify_tree_greedy, verify_tree_sampling


def tree_room(policy: GammaPolicy, planner: BranchPlanner) -> int:
    """Scratch rows a tree step may write past the text: the tree and a re-fed path."""
    return (planner.max_branches + 1) * policy.max_gamma + 2


def plan_branches(proposer: Proposer, policy: GammaPolicy, committed: list[int], gamma: int,
                  asked: int, sampler: Sampler) -> tuple[list[Proposal], int | None]:
    """The drafter's best `asked` branches, cut to the depth the γ policy plans for the
    best one (a planning policy may decide that no guess pays: then none), and that
    depth (None when nothing was planned, as in the chain strategy)."""
    if gamma <= 0:
        return [], None
    branches = proposer.propose_branches(committed, gamma, asked, sampler)
    if not (branches and policy.plans_guesses):
        return branches, None
    depth = policy.plan(len(branches[0].tokens), branches[0].extra.get("match"))
    return [Proposal(b.tokens[:depth], None, extra=b.extra) for b in branches] \
        if depth else [], depth


def first_branch(tree: DraftTree, path: list[int]) -> int:
    """The first branch through the accepted path's end (0 without branches)."""
    end = path[-1]
    return next((i for i, leaf in enumerate(tree.leaves) if end in tree.path_to(leaf)), 0)


def chain_feedback(tree: DraftTree, verdict: TreeVerdict, branch: int, argmax: list[int],
                   key: int | None, seconds: dict) -> Feedback:
    """What the first branch alone earned, so the γ policy keeps estimating the α of a
    chain (its depth plan assumes one) while the planner prices the extra branches.
    When a later branch won, the first one's run comes from greedy matching against
    the target's argmax (an estimate when sampling)."""
    if not tree.leaves:
        return Feedback(0, 0, False, seconds.get("draft", 0.0), 0, seconds["verify"], key)
    drafted = len(tree.path_to(tree.leaves[0])) - 1
    if branch == 0:
        accepted, rejected = len(verdict.path) - 1, verdict.rejected
    else:
        accepted = tree.branch_lengths(argmax)[0]
        rejected = accepted < drafted
    return Feedback(drafted, accepted, rejected, seconds.get("draft", 0.0), 0,
                    seconds["verify"], key)


def settle_tree(state: ModelState, tree: DraftTree, prefix_tokens: list[int],
                logits: torch.Tensor | None, sampler: Sampler,
                tokens: torch.Tensor | None = None) -> tuple[TreeVerdict, list[int]]:
    """After a forward wrote [prefix_tokens, tree] as scratch rows after the state's fed
    tokens: judge the tree on its nodes' logits [C, V] (greedy matching or recursive
    rejection), or on their greedy tokens [C] where the forward picked them itself (greedy
    only; logits None), and keep the accepted path next to the prefix (a backend without
    exact tree keeps keeps the path's leading in-order nodes). (verdict, target argmax per
    node)."""
    argmax = (tokens if tokens is not None else greedy_tokens(logits)).tolist()
    if sampler.greedy:
        verdict = verify_tree_greedy(tree.tokens, tree.children, argmax)
    else:
        verdict = verify_tree_sampling(tree.tokens, tree.children, sampler.probs(logits),
                                       sampler)
    path = verdict.path
    keep = len(path) if state.model.capabilities.exact_tree_keep else DraftTree.contiguous(path)
    prefix = tree.layout.prefix
    state.keep(list(range(prefix)) + [prefix + n for n in path[:keep]],
               prefix_tokens + [tree.tokens[n] for n in path[:keep]])
    return verdict, argmax


class TreeSteps(SpeculativeSteps):
    """One request of tree speculation (see the module docstring)."""

    def __init__(self, target: DecoderLM, proposer: Proposer, policy: GammaPolicy,
                 planner: BranchPlanner, prompt_ids: list[int], config: GenerationConfig, *,
                 prefill_chunk: int | None = None,
                 new_cache: Callable[[int], Cache] | None = None) -> None:
        super().__init__(target, proposer, policy, prompt_ids, config,
                         prefill_chunk=prefill_chunk, new_cache=new_cache,
                         extra_rows=tree_room(policy, planner))
        self.planner = planner
        self.tree: DraftTree | None = None
        self._asked = 0
        self._branches: list[Proposal] = []

    @property
    def adaptive(self) -> bool:
        # a draft model's tree is drafted whole, not capped in a shared draft forward
        return super().adaptive and not self.drafts_with_model

    def offered(self) -> int:
        return len(self._branches[0].tokens) if self._branches else 0

    def propose(self) -> Proposal:
        """This step's branches, merged into the tree `rows` feeds."""
        self.tree, self._branches = None, []
        gamma = self.draft_length()
        if not gamma:
            return self.take(NO_GUESS)
        self._asked = self.planner.next_branches()
        with self.timer("draft"):
            branches, planned = plan_branches(self.proposer, self.policy, self.committed,
                                              gamma, self._asked, self.sampler)
        self._gamma = gamma if planned is None else planned
        self._branches = branches
        self._key = branches[0].extra.get("match") if branches else None
        self.proposal = Proposal([t for b in branches for t in b.tokens], None,
                                 extra=branches[0].extra if branches else {})
        return self.proposal

    def trim(self, n: int) -> None:
        """Under load: fewer than the first branch's guesses cut the tree to that branch's
        first `n` (a chain; none: no guess); otherwise the whole tree stays."""
        if not self._branches or n >= len(self._branches[0].tokens):
            return
        first = self._branches[0]
        self._branches = [Proposal(first.tokens[:n], None, extra=first.extra)] if n else []
        self._gamma = n
        self.proposal = Proposal(first.tokens[:n], None, extra=first.extra if n else {})

    def rows(self, chunk: int | None = None) -> Rows:
        if self.prefilling:
            return super().rows(chunk)
        pending = self.state.sync(self.committed)
        self.tree = tree = DraftTree.build(pending[-1], [b.tokens for b in self._branches],
                                           prefix=len(pending) - 1)
        lay = tree.layout
        branching = any(len(c) > 1 for c in tree.children)
        rows = Rows(pending[:-1] + tree.tokens, len(self.state.fed), lay.prefix, False,
                    offsets=tuple((lay.offsets + lay.prefix).tolist()),
                    mask=lay.mask if branching else None)
        self._rows = rows
        return rows

    def wrote(self) -> None:
        assert self._rows is not None
        if self._rows.prefill:
            super().wrote()
        else:  # scratch rows: `accept` keeps the path
            self.state.forwards += 1

    def accept(self, logits: torch.Tensor | None, forward_seconds: float,
               cost_seconds: float | None = None, *,
               tokens: torch.Tensor | None = None) -> Step | None:
        rows, timer = self._rows, self.timer
        assert rows is not None, "accept() before rows()"
        if rows.prefill:
            return super().accept(logits, forward_seconds, cost_seconds, tokens=tokens)
        self._rows = None
        self._forwards += 1
        tree = self.tree
        assert tree is not None and (logits is not None or tokens is not None)
        timer.seconds["verify"] = timer.seconds.get("verify", 0.0) + forward_seconds
        with timer("verify"):
            verdict, argmax = settle_tree(self.state, tree, rows.tokens[:tree.layout.prefix],
                                          logits, self.sampler, tokens)
        path = verdict.path
        accepted = [tree.tokens[n] for n in path[1:]]
        new = self.budget.clip(accepted + [verdict.next_token])
        self.committed += new
        with timer("other"):
            self.planner.update(tree, argmax, self._asked)
        seconds = timer.take()
        verify = seconds["verify"] - forward_seconds + (
            forward_seconds if cost_seconds is None else cost_seconds)
        branch = first_branch(tree, path)
        self.policy.update(chain_feedback(tree, verdict, branch, argmax, self._key,
                                          {**seconds, "verify": verify}))
        n_kept = min(len(accepted), len(new))
        step = Step(new, ["draft"] * n_kept + ["target"] * (len(new) - n_kept),
                    drafted=tree.nodes, accepted=len(accepted), rejected=verdict.rejected,
                    target_forwards=self._forwards,
                    draft_seconds=seconds.get("draft", 0.0) + seconds.get("draft_setup", 0.0),
                    verify_seconds=seconds["verify"], other_seconds=seconds.get("other", 0.0),
                    finish=self.budget.finish,
                    extra={"gamma": self._gamma, **(self._branches[0].extra
                                                    if self._branches else {}),
                           "branches": len(self._branches), "tree_nodes": tree.nodes,
                           "branch": branch, "siblings_tried": verdict.siblings_tried})
        self._forwards = 0
        return step
