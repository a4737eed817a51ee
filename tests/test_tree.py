"""Tree specs -> masks, positions and retrieve indices; tree forwards against plain ones."""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny import tiny_pair

from draftsman.trees.layout import TreeSpec, fill_tokens, layout
from draftsman.verification.tree import accept_greedy

SPECS = {
    "root-only": TreeSpec(((),), (0,)),
    "root-prompts": TreeSpec(((),), (3,)),
    "chain": TreeSpec.chain(3, 1),
    "width-1": TreeSpec.build([((), 2), ((0,), 2), ((0, 0), 1)]),
    "wide": TreeSpec.build([((), 3), ((0,), 3), ((1,), 2), ((2,), 1), ((0, 0), 2),
                            ((0, 1), 1), ((1, 0), 1), ((0, 0, 0), 1)]),
    "no-prompts": TreeSpec.build([((), 0), ((0,), 0), ((1,), 0), ((0, 0), 0)]),
}


def is_prefix(a: tuple, b: tuple) -> bool:
    return b[: len(a)] == a


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("epts", [1, 2])
@pytest.mark.parametrize("prefix", [0, 3])
def test_mask_is_exactly_ancestors(name, epts, prefix):
    spec = SPECS[name]
    lay = layout(spec, epts, prefix)
    c = len(spec.paths)
    # describe every row: ("plain", i) / ("node", path) / ("prompt", path, i, e)
    rows = [("plain", i) for i in range(prefix)] + [("node", p) for p in spec.paths]
    for p, k in zip(spec.paths, spec.prompts, strict=True):
        rows += [("prompt", p, i, e) for i in range(1, k + 1) for e in range(epts)]
    assert lay.rows == len(rows) == prefix + spec.size(epts)
    for a, b in itertools.product(range(len(rows)), repeat=2):
        ra, rb = rows[a], rows[b]
        if ra[0] == "plain":
            want = rb[0] == "plain" and rb[1] <= ra[1]
        elif rb[0] == "plain":
            want = True
        elif ra[0] == "node":
            want = rb[0] == "node" and is_prefix(rb[1], ra[1])
        elif rb[0] == "node":
            want = is_prefix(rb[1], ra[1])
        else:
            want = rb[1] == ra[1] and rb[3] == ra[3] and rb[2] <= ra[2]
        assert bool(lay.mask[a, b]) == want, (ra, rb)
    # positions: depth of the node (+ i for prompt tokens), prefix rows before the root
    for r, desc in enumerate(rows):
        want = {"plain": lambda d: d[1] - prefix, "node": lambda d: len(d[1]),
                "prompt": lambda d: len(d[1]) + d[2]}[desc[0]](desc)
        assert int(lay.offsets[r]) == want
    # retrieve indices: ancestors of each node, root first
    for j, p in enumerate(spec.paths):
        assert [spec.paths[i] for i in lay.path_to(j)] == [p[:d] for d in range(len(p) + 1)]
    assert (lay.prompt_rows >= 0).sum() == spec.prompt_tokens * epts
    assert lay.node_rows.tolist() == list(range(prefix, prefix + c))


def test_spec_validation_and_json_roundtrip():
    spec = SPECS["wide"]
    assert TreeSpec.from_json(spec.to_json()) == spec
    assert spec.topk() == [3, 2, 1]
    assert spec.size(1) == 8 + 14
    with pytest.raises(ValueError):
        TreeSpec(((0,),), (1,))  # no root
    with pytest.raises(ValueError):
        TreeSpec(((), (0, 0)), (1, 1))  # orphan
    with pytest.raises(ValueError):
        TreeSpec(((), (0,), (0,)), (1, 1, 1))  # duplicate


def test_accept_greedy_picks_the_matching_path():
    lay = layout(SPECS["wide"], 1)
    guesses = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    cand = fill_tokens(lay, guesses, root=5)
    assert cand.tolist() == [5, 10, 11, 12, 20, 21, 20, 30]
    # target: after 5 -> 11, after 11 (node (1,)) -> 20, after (1,0) -> 99
    argmax = torch.full((len(cand),), 99)
    argmax[0] = 11
    argmax[2] = 20
    end = accept_greedy(lay, cand, argmax)
    assert lay.spec.paths[end] == (1, 0)
    argmax[0] = 7  # nothing matches the first guess: only the root
    assert accept_greedy(lay, cand, argmax) == 0


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_tree_forward_matches_plain_forwards_and_keep_equals_prefill(family):
    """Candidate logits equal ordinary forwards over each root-to-node path (prompt rows do
    not leak), and after `keep` the cache equals a fresh prefill of the accepted tokens."""
    _, model = tiny_pair(family)
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 97, (1, 7), generator=gen)
    spec = SPECS["wide"]
    lay = layout(spec, epts=2, prefix=0)
    guesses = torch.randint(0, 97, (3, 3), generator=gen)
    cand = fill_tokens(lay, guesses, root=int(prefix[0, -1]))
    start = 6  # the root (last prefix token) is not in the cache yet
    cache = model.new_cache(64)
    model(prefix[:, :start], torch.arange(start)[None], cache)
    ids = torch.zeros(lay.rows, dtype=torch.long)
    ids[lay.node_rows] = cand
    pos = (lay.offsets + start)[None]
    emb = model.embed(ids[None], pos)
    emb[0, len(spec.paths):] = torch.randn(lay.rows - len(spec.paths), emb.shape[-1],
                                           generator=gen)
    out = model(None, pos, cache, mask=lay.mask, inputs_embeds=emb)
    for j in range(len(spec.paths)):
        path = cand[lay.path_to(j)]
        seq = torch.cat([prefix[0, :start], path])[None]
        ref = model(seq, torch.arange(seq.shape[1])[None], model.new_cache(64)).logits
        torch.testing.assert_close(out.logits[0, j], ref[0, -1], atol=1e-4, rtol=1e-4)
    end = spec.paths.index((0, 0, 0))
    path = lay.path_to(end)
    cache.keep([start + int(lay.node_rows[j]) for j in path], start)
    accepted = torch.cat([prefix[0, :start], cand[path]])
    fresh = model.new_cache(64)
    model(accepted[None], torch.arange(accepted.numel())[None], fresh)
    n = accepted.numel()
    assert cache.length == fresh.length == n
    torch.testing.assert_close(cache.k[:, :, :, :n], fresh.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :n], fresh.v[:, :, :, :n], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- sparse trees

from draftsman.trees.sparse import (  # noqa: E402
    PRIOR_ACCURACY,
    amortised_tokens,
    choose_size,
    end_probabilities,
    make_trees,
    optimal_candidates,
    path_probability,
    tree_value,
)


def test_optimal_candidates_are_a_tree_in_probability_order():
    nodes = optimal_candidates(PRIOR_ACCURACY, 20, 3)
    paths = [p for p, _ in nodes]
    probs = [q for _, q in nodes]
    assert len(paths) == 20 and probs == sorted(probs, reverse=True)
    seen = {()}
    for p in paths:
        assert p[:-1] in seen and len(p) <= 3
        seen.add(p)
        assert path_probability(p, PRIOR_ACCURACY) == pytest.approx(probs[paths.index(p)])
    assert optimal_candidates(PRIOR_ACCURACY, 5, 1) == [((r,), PRIOR_ACCURACY[0][r])
                                                        for r in range(5)]
    # Prop. 4.1: no other 5-node tree of depth <= 2 has a larger f
    best = tree_value([()] + [p for p, _ in optimal_candidates(PRIOR_ACCURACY, 5, 2)],
                      PRIOR_ACCURACY)
    alt = tree_value([(), (0,), (0, 0), (0, 1), (0, 2), (1,)], PRIOR_ACCURACY)
    assert best >= alt


def test_end_probabilities_sum_to_one():
    paths = [()] + [p for p, _ in optimal_candidates(PRIOR_ACCURACY, 12, 3)]
    assert sum(end_probabilities(paths, PRIOR_ACCURACY)) == pytest.approx(1.0)


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 16, 33, 48])
@pytest.mark.parametrize("epts", [1, 2])
def test_tree_sets_fit_their_size_and_dynamic_beats_static(rows, epts):
    sets = {k: make_trees(k, PRIOR_ACCURACY, 3, rows, epts, seed=1)
            for k in ("dynamic", "static", "random")}
    for ts in sets.values():
        assert set(ts.states) == {0, 1, 2, 3}
        for state, spec in ts.states.items():
            assert spec.size(epts) <= rows and spec.depth <= state
        assert ts.tau == pytest.approx(amortised_tokens(ts.states, PRIOR_ACCURACY, 3))
    assert sets["dynamic"].tau >= sets["static"].tau - 1e-9
    assert sets["dynamic"].tau >= sets["random"].tau - 1e-9


def test_hardware_aware_size_maximises_tau_over_latency():
    tau = {1: 1.0, 8: 1.6, 16: 1.8, 32: 1.9}
    flat = {1: 0.10, 8: 0.10, 16: 0.11, 32: 0.20}
    assert choose_size(tau, flat) == 16  # 1.8 / 0.11 beats 1.6 / 0.10 and 1.9 / 0.20
    steep = {1: 0.10, 8: 0.30, 32: 1.0}
    assert choose_size(tau, steep) == 1  # interpolated L(16) is too slow: decode plainly
