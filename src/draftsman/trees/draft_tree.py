"""Several draft branches merged into one token tree, verified by one target forward.

Branches that share a prefix share its nodes (a trie). Nodes are numbered in creation
order, inserting the branches best first, so node 0 is the root (the last committed token)
and the first branch occupies nodes 1..len(branch 1) -- a contiguous run right after the
root. A backend that cannot move cached keys/values (llama.cpp) can therefore keep the
first branch's accepted nodes as they are and only has to recompute the nodes of a later
branch (see `DraftTree.contiguous`).

    rows of the forward: prefix plain tokens, then the nodes (tree.py's layout)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from draftsman.trees.layout import Path_, TreeLayout, TreeSpec, layout


@lru_cache(maxsize=1024)
def shape_layout(paths: tuple[Path_, ...], prefix: int) -> TreeLayout:
    """The layout of a tree shape, built once per (shape, prefix) and shared: read-only.

    A layout depends only on the rank paths (the parent structure) and the prefix rows, not
    on the tokens, and a drafter repeats the same few shapes step after step.
    """
    return layout(TreeSpec(paths, (0,) * len(paths)), 1, prefix)


@dataclass(frozen=True)
class DraftTree:
    tokens: list[int]  # [C] node -> token id; node 0 is the root
    parent: list[int]  # [C] node -> parent node (root: 0)
    children: list[list[int]]  # node -> child nodes, best branch first
    leaves: list[int]  # branch i -> the node holding its last guess
    layout: TreeLayout

    @classmethod
    def build(cls, root: int, branches: list[list[int]], prefix: int = 0) -> DraftTree:
        tokens, parent, paths = [root], [0], [()]
        children: list[list[int]] = [[]]
        leaves = []
        for branch in branches:
            node = 0
            for token in branch:
                child = next((c for c in children[node] if tokens[c] == token), None)
                if child is None:
                    child = len(tokens)
                    paths.append(paths[node] + (len(children[node]),))
                    tokens.append(token)
                    parent.append(node)
                    children.append([])
                    children[node].append(child)
                node = child
            leaves.append(node)
        return cls(tokens, parent, children, leaves, shape_layout(tuple(paths), prefix))

    @property
    def nodes(self) -> int:
        """Guess nodes (the root excluded)."""
        return len(self.tokens) - 1

    def path_to(self, node: int) -> list[int]:
        """Nodes root..node."""
        path = [node]
        while path[-1] != 0:
            path.append(self.parent[path[-1]])
        return path[::-1]

    @staticmethod
    def contiguous(path: list[int]) -> int:
        """How many leading nodes of a root path are nodes 0, 1, 2, ... (stored in order)."""
        n = 0
        while n < len(path) and path[n] == n:
            n += 1
        return n

    def branch_lengths(self, argmax: list[int]) -> list[int]:
        """Guesses each branch alone would have had accepted under greedy matching, given the
        target's argmax after every node."""
        ok = [True] + [self.tokens[c] == argmax[self.parent[c]]
                       for c in range(1, len(self.tokens))]
        out = []
        for leaf in self.leaves:
            path = self.path_to(leaf)
            n = 0
            while n + 1 < len(path) and ok[path[n + 1]]:
                n += 1
            out.append(n)
        return out

    def nodes_of_first(self, k: int) -> int:
        """Guess nodes in the trie of the first k branches."""
        seen: set[int] = set()
        for leaf in self.leaves[:k]:
            seen.update(self.path_to(leaf)[1:])
        return len(seen)
