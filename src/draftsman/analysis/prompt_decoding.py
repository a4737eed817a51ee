"""Parallel prompt decoding measured: the paper's Figure 6, 8a and 8b/c on this machine.

Chen et al., "Hardware-Aware Parallel Prompt Decoding", sections 4-5. Three questions:

1. How often is the r-th guess of prompt token i right (Figure 6)? For each reply of the
   target (greedy, autoregressive), one teacher-forced forward puts a chain of the m prompt
   tokens after *every* reply position a (the training layout: each chain attends to the
   real tokens up to a and to its own earlier prompt tokens). Prompt token i at point a
   guesses token a + 1 + i; we store the rank of the true token among its guesses.

2. How many tokens per step does a tree give (Figure 8a)? Exactly the replay of the
   decoder on those ranks: a step rooted after point a accepts the longest candidate path
   (r_1, ..., r_L) in the tree with r_j = rank[a][j]; it commits L + 1 tokens (the
   accepted guesses and the target's token after them), and the next step's guesses are
   the chain of the last accepted node, i.e. point a + 1 + L, limited to the prompt tokens
   that node carries (its state). Greedy verification accepts a candidate iff it equals
   the true token, and a chain after an accepted node sees exactly the true prefix, so the
   replay reproduces `parallel-prompt`'s steps (up to floating-point ties) for any tree
   without running it: dynamic, static and random trees at every size from one forward.

3. What speedup does this CPU give (Figure 8b/c)? Predicted: τ(n) · L_fp(1) / L_fp(n) with
   the replayed τ and the forward latency profile of this machine; measured: interleaved
   timing of `parallel-prompt` at several tree sizes against `autoregressive`.

Invariants: ranks are in [0, K) or MISS (not among the top K, or beyond the reply);
`replay` mirrors `TreeDecoder.step` including its state-0 rule (a node carrying no prompt
tokens is followed by the root-only layout with all m prompt tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftsman.models.base import DecoderLM
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.training.prompt_tokens import chain_forward
from draftsman.trees.sparse import TreeSet

TOPK = 10  # ranks kept per guess (the Figure 6 x-axis)
MISS = TOPK


@dataclass
class Reply:
    """A prompt, the target's greedy reply and the prompt tokens' guess ranks along it."""

    dataset: str
    prompt_id: str
    prompt_len: int
    ids: list[int]  # prompt + reply
    ranks: list[list[int]]  # [point a - (prompt_len - 1)][i - 1]: rank of ids[a + 1 + i]

    @property
    def new_tokens(self) -> int:
        return len(self.ids) - self.prompt_len


@torch.inference_mode()
def guess_ranks(model: DecoderLM, prompts: PromptTokens, ids: list[int], prompt_len: int,
                topk: int = TOPK, chunk: int = 48) -> list[list[int]]:
    """rank[a - (prompt_len - 1)][i - 1] for every point a in [prompt_len - 1, len(ids) - 2].

    Chains are inserted `chunk` points per forward (each forward re-reads the sequence;
    chunks bound the tree mask and the head's [points * m, V] logits)."""
    m = prompts.count
    emb = prompts.embeddings.to(model.dtype)
    truth = torch.tensor(ids, dtype=torch.long)
    points = list(range(prompt_len - 1, len(ids) - 1))
    out: list[list[int]] = []
    for lo in range(0, len(points), chunk):
        pts = points[lo: lo + chunk]
        logits = chain_forward(model, emb, ids, pts)  # [I, m, V]
        top = logits.topk(topk, dim=-1).indices  # [I, m, K]
        for j, a in enumerate(pts):
            row = []
            for i in range(1, m + 1):
                t = a + 1 + i
                if t >= len(ids):
                    row.append(MISS)
                    continue
                hit = (top[j, i - 1] == truth[t]).nonzero()
                row.append(int(hit[0, 0]) if hit.numel() else MISS)
            out.append(row)
    return out


def accuracy(replies: Sequence[Reply], m: int, topk: int = TOPK) -> list[list[float]]:
    """acc[i][r]: share of points where the true token at distance i + 1 has rank r."""
    counts = [[0] * topk for _ in range(m)]
    totals = [0] * m
    for rep in replies:
        n = len(rep.ids)
        for j, row in enumerate(rep.ranks):
            a = rep.prompt_len - 1 + j
            for i in range(m):
                if a + 2 + i >= n:  # no true token that far: not a trial
                    continue
                totals[i] += 1
                if row[i] < topk:
                    counts[i][row[i]] += 1
    return [[c / t if t else 0.0 for c in cs] for cs, t in zip(counts, totals, strict=True)]


def cumulative(acc: Sequence[Sequence[float]]) -> list[list[float]]:
    """Top-k accuracy (k = 1..K) from rank accuracies."""
    out = []
    for row in acc:
        total, run = 0.0, []
        for x in row:
            total += x
            run.append(total)
        out.append(run)
    return out


@dataclass
class Replay:
    lengths: list[int]  # tokens committed by each decode forward (the prefill not counted)

    @property
    def steps(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def tau(self) -> float:
        return self.tokens / self.steps if self.steps else 1.0


def replay(reply: Reply, trees: TreeSet, m: int) -> Replay:
    """Steps `parallel-prompt` takes on this reply with `trees` (module docstring, point 2).

    The prefill commits the first reply token and leaves the m guesses of the chain after
    the prompt; each decode step then commits L + 1 tokens until the reply is complete."""
    nodes = {state: dict(zip(spec.paths, spec.prompts, strict=True))
             for state, spec in trees.states.items()}
    root_only = {(): m}
    a = reply.prompt_len - 1
    left = reply.new_tokens - 1  # after the prefill's token
    state = m
    lengths: list[int] = []
    while left > 0:
        tree = root_only if state == 0 else nodes[state]
        ranks = reply.ranks[a - (reply.prompt_len - 1)]
        path: tuple[int, ...] = ()
        while len(path) < len(ranks):
            nxt = path + (ranks[len(path)],)
            if ranks[len(path)] >= MISS or nxt not in tree:
                break
            path = nxt
        new = min(len(path) + 1, left)
        lengths.append(new)
        left -= new
        state = tree[path]
        a += 1 + len(path)
    return Replay(lengths)


def replay_tau(replies: Sequence[Reply], trees: TreeSet, m: int) -> float:
    runs = [replay(r, trees, m) for r in replies]
    steps = sum(r.steps for r in runs)
    return sum(r.tokens for r in runs) / steps if steps else 1.0
