"""Tree spec -> attention mask, position offsets and retrieve indices for one tree forward.

A *tree spec* lists candidate nodes by their rank path from the root, Medusa style: the node
``(r1, ..., rd)`` holds the r_d-th most likely guess for the token at distance d, and its
parent is ``(r1, ..., r_{d-1})``. The root ``()`` is the last committed token (the one not
yet in the KV cache). Every node also carries a chain of ``prompts`` prompt tokens (parallel
prompt decoding): prompt token i of a node at depth d sits at depth d + i and its output
guesses the token at distance d + i + 1 from the root, i.e. the i-th token after the token
the target will choose after that node. With n ensemble prompt tokens (EPTs) each prompt
token is fed n times; EPT e of prompt token i sees EPT e of prompt tokens 1..i-1 of the same
node and nothing else among the prompt rows.

Rows of the forward, in order: ``prefix`` plain tokens (a causal run fed before the root,
used when more than one committed token is missing from the cache), the candidate nodes in
spec order (root first), then the prompt rows grouped by node, prompt index, EPT.

Invariants (tested): a candidate row sees exactly the prefix rows, its ancestors and itself;
a prompt row sees the prefix rows, its node's ancestors, its node, and the earlier prompt
rows of the same node and EPT; positions are ``root position + depth``. Candidate rows never
see prompt rows, so the target's logits at candidate rows equal those of an ordinary
forward over the root-to-node path, which is what makes greedy verification exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property

import torch

Path_ = tuple[int, ...]


@dataclass(frozen=True)
class TreeSpec:
    """Candidate nodes (rank paths, root first) and the prompt tokens each node carries."""

    paths: tuple[Path_, ...]
    prompts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.paths or self.paths[0] != ():
            raise ValueError("a tree spec starts with the root ()")
        if len(self.paths) != len(self.prompts):
            raise ValueError("one prompt count per node")
        seen: set[Path_] = set()
        for p, k in zip(self.paths, self.prompts, strict=True):
            if p in seen:
                raise ValueError(f"node {p} appears twice")
            if p and p[:-1] not in seen:
                raise ValueError(f"node {p} comes before its parent")
            if any(r < 0 for r in p) or k < 0:
                raise ValueError(f"negative rank or prompt count at {p}")
            seen.add(p)

    @classmethod
    def build(cls, nodes: Iterable[tuple[Sequence[int], int]]) -> TreeSpec:
        """From (path, prompts) pairs in any order; sorted parents-first (depth, then ranks)."""
        items = sorted(((tuple(p), int(k)) for p, k in nodes), key=lambda x: (len(x[0]), x[0]))
        return cls(tuple(p for p, _ in items), tuple(k for _, k in items))

    @classmethod
    def chain(cls, depth: int, prompts: int) -> TreeSpec:
        """A single path of top-1 guesses; every node carries `prompts` prompt tokens."""
        return cls(tuple((0,) * d for d in range(depth + 1)), (prompts,) * (depth + 1))

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def candidates(self) -> int:
        """Candidate nodes excluding the root."""
        return len(self.paths) - 1

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompts)

    def size(self, epts: int = 1) -> int:
        """Rows the tree adds to a forward: root + candidates + prompt tokens x EPTs."""
        return len(self.paths) + self.prompt_tokens * epts

    def topk(self) -> list[int]:
        """How many ranked guesses each depth 1..depth needs: 1 + the largest rank used."""
        need = [0] * self.depth
        for p in self.paths:
            if p:
                need[len(p) - 1] = max(need[len(p) - 1], p[-1] + 1)
        return need

    def to_json(self) -> list:
        return [[list(p), k] for p, k in zip(self.paths, self.prompts, strict=True)]

    @classmethod
    def from_json(cls, data: list) -> TreeSpec:
        return cls.build((p, k) for p, k in data)

    def __str__(self) -> str:
        return json.dumps(self.to_json())


@dataclass
class TreeLayout:
    """Tensors for one forward over `prefix` plain rows + the tree of `spec` with `epts` EPTs.

    Shapes (C = nodes incl. root, D = spec depth, m = max prompts on a node, n = epts):
      mask [T, T] bool, offsets [T] long (position - root position; prefix rows negative),
      node_rows [C], parent [C] (root: 0), depth [C], rank [C] (root: -1),
      ancestors [C, D + 1] node indices root..node padded by repeating the node,
      prompt_rows [C, m, n] row indices (-1 where a node carries fewer prompts),
      prompt_count [C], prompt_owner/prompt_index/prompt_ept [P] for the P prompt rows.
    """

    spec: TreeSpec
    epts: int
    prefix: int
    mask: torch.Tensor
    offsets: torch.Tensor
    node_rows: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    rank: torch.Tensor
    ancestors: torch.Tensor
    prompt_rows: torch.Tensor
    prompt_count: torch.Tensor
    prompt_owner: torch.Tensor
    prompt_index: torch.Tensor
    prompt_ept: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.offsets.numel())

    @cached_property
    def parent_list(self) -> list[int]:
        return self.parent.tolist()

    def to(self, device: torch.device) -> TreeLayout:
        """The same layout with every tensor on `device` (itself when already there)."""
        if self.mask.device == device:
            return self
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    @cached_property
    def depth_list(self) -> list[int]:
        return self.depth.tolist()

    @cached_property
    def node_rows_list(self) -> list[int]:
        return self.node_rows.tolist()

    @cached_property
    def prompt_count_list(self) -> list[int]:
        return self.prompt_count.tolist()

    def path_to(self, node: int) -> list[int]:
        """Node indices root..node."""
        return self.ancestors[node, : self.depth_list[node] + 1].tolist()


def ancestor_matrix(parent: Sequence[int]) -> torch.Tensor:
    """[C, C] bool: entry (j, i) is True iff node i is node j or one of its ancestors.

    Requires parent[j] < j for j > 0 (parents first); parent[0] is ignored (the root).
    """
    c = len(parent)
    anc = torch.eye(c, dtype=torch.bool)
    for j in range(1, c):
        anc[j] |= anc[parent[j]]
    return anc


def layout(spec: TreeSpec, epts: int = 1, prefix: int = 0) -> TreeLayout:
    """Build the mask, offsets and index tensors for `spec` (see the module docstring)."""
    if epts < 1:
        raise ValueError("epts must be >= 1")
    index = {p: i for i, p in enumerate(spec.paths)}
    parent = [0] + [index[p[:-1]] for p in spec.paths[1:]]
    depth = torch.tensor([len(p) for p in spec.paths], dtype=torch.long)
    rank = torch.tensor([p[-1] if p else -1 for p in spec.paths], dtype=torch.long)
    c = len(spec.paths)
    anc = ancestor_matrix(parent)  # [C, C]

    # prompt rows: node-major, then prompt index i (1-based), then EPT e
    owner, pidx, pept = [], [], []
    for j, k in enumerate(spec.prompts):
        for i in range(1, k + 1):
            for e in range(epts):
                owner.append(j)
                pidx.append(i)
                pept.append(e)
    owner_t = torch.tensor(owner, dtype=torch.long)
    pidx_t = torch.tensor(pidx, dtype=torch.long)
    pept_t = torch.tensor(pept, dtype=torch.long)
    p = len(owner)
    t = prefix + c + p

    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[:prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    mask[prefix:, :prefix] = True
    cs = slice(prefix, prefix + c)
    ps = slice(prefix + c, t)
    mask[cs, cs] = anc
    if p:
        mask[ps, cs] = anc[owner_t]
        same = (owner_t[:, None] == owner_t[None, :]) & (pept_t[:, None] == pept_t[None, :])
        mask[ps, ps] = same & (pidx_t[None, :] <= pidx_t[:, None])

    offsets = torch.cat([
        torch.arange(-prefix, 0, dtype=torch.long),
        depth,
        depth[owner_t] + pidx_t if p else torch.zeros(0, dtype=torch.long),
    ])

    d = int(depth.max())
    ancestors = torch.arange(c)[:, None].repeat(1, d + 1)
    for j in range(c):
        path = anc[j].nonzero().flatten()  # ancestors in index order = depth order
        ancestors[j, : path.numel()] = path

    m = max(spec.prompts) if spec.prompts else 0
    prompt_rows = torch.full((c, m, epts), -1, dtype=torch.long)
    if p:
        prompt_rows[owner_t, pidx_t - 1, pept_t] = torch.arange(prefix + c, t)
    return TreeLayout(
        spec=spec, epts=epts, prefix=prefix, mask=mask, offsets=offsets,
        node_rows=torch.arange(prefix, prefix + c), parent=torch.tensor(parent),
        depth=depth, rank=rank, ancestors=ancestors, prompt_rows=prompt_rows,
        prompt_count=torch.tensor(spec.prompts, dtype=torch.long), prompt_owner=owner_t,
        prompt_index=pidx_t, prompt_ept=pept_t,
    )


def fill_tokens(lay: TreeLayout, guesses_topk: torch.Tensor | None, root: int) -> torch.Tensor:
    """Candidate token ids [C]: the root, then guesses_topk[depth - 1, rank] for each node.

    guesses_topk [D', K] holds the ranked guesses for distances 1..D' (D' >= spec depth,
    K >= the largest rank + 1).
    """
    tokens = torch.full((len(lay.spec.paths),), root, dtype=torch.long, device=lay.depth.device)
    if len(lay.spec.paths) > 1:
        tokens[1:] = guesses_topk[lay.depth[1:] - 1, lay.rank[1:]]
    return tokens


