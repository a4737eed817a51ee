"""Tree layouts and causal masks are built once per shape and equal a fresh build."""

from __future__ import annotations

import torch

from draftsman.models.base import attention_mask, causal_mask
from draftsman.trees.draft_tree import DraftTree
from draftsman.trees.layout import TreeSpec, layout


def test_draft_tree_layout_shared_per_shape():
    a = DraftTree.build(9, [[1, 2, 3], [1, 4], [5]], prefix=2)
    b = DraftTree.build(7, [[6, 8, 8], [6, 0], [3]], prefix=2)  # same shape, other tokens
    assert a.layout is b.layout
    paths = ((), (0,), (0, 0), (0, 0, 0), (0, 1), (1,))
    fresh = layout(TreeSpec(paths, (0,) * len(paths)), 1, 2)
    assert torch.equal(a.layout.mask, fresh.mask) and torch.equal(a.layout.offsets, fresh.offsets)
    assert DraftTree.build(9, [[1, 2, 3]], prefix=2).layout is not a.layout


def test_causal_mask_cached_and_exact():
    cpu = torch.device("cpu")
    for start, length in [(0, 2), (5, 3), (17, 64), (3, 65)]:
        got = attention_mask(start, length, None, cpu)
        q = torch.arange(start, start + length)[:, None]
        assert torch.equal(got[0, 0], torch.arange(start + length)[None, :] <= q)
        assert torch.equal(got, causal_mask(start, length, cpu))
    assert attention_mask(5, 3, None, cpu) is attention_mask(5, 3, None, cpu)
    assert attention_mask(5, 1, None, cpu) is None
