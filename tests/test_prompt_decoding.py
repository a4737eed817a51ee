"""The parallel-prompt analysis: guess ranks from one teacher-forced forward, accuracies, and
a replay that reproduces the real decoder's steps for every tree."""

from __future__ import annotations

import pytest
import torch
from test_parallel_prompt import SHAPES, greedy_texts, run, sharp_model

from draftsman.analysis.prompt_decoding import (
    MISS,
    Reply,
    accuracy,
    cumulative,
    guess_ranks,
    replay,
)
from draftsman.core import GenerationConfig
from draftsman.sampling import SamplingConfig
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.parallel_prompt import ParallelPrompt
from draftsman.trees.sparse import TreeSet
from draftsman.verification.prompt_tree import TreeDecoder


@pytest.fixture(scope="module")
def trained():
    from draftsman.training.prompt_tokens import TrainConfig, train

    torch.manual_seed(0)
    model = sharp_model()
    seqs = greedy_texts(model, 24)
    cfg = TrainConfig(steps=60, lr=0.01, insertions=16, eval_every=0, checkpoint_every=0)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        prompts, _ = train(model, seqs[:20], seqs[20:], cfg, tmp, progress=False)
    return model, prompts


@pytest.mark.parametrize("shape", ["chain", "dynamic-8", "dynamic-24", "static-16",
                                   "random-20", "size-1", "wide-depth-1"])
def test_replay_reproduces_the_decoder_steps(trained, shape):
    model, prompts = trained
    m = prompts.count
    states = SHAPES[shape](m)
    accepted_somewhere = False
    for prompt in ([1, 7, 3], [5, 17, 3, 44, 12, 9, 60, 2], [30, 2]):
        n = 40
        reply = run(Autoregressive(model), prompt=prompt, n=n)
        steps = list(ParallelPrompt(TreeDecoder(model, prompts, states, topk=MISS)).generate(
            prompt, GenerationConfig(n, SamplingConfig())))
        assert [t for s in steps for t in s.tokens] == reply
        real = [len(s.tokens) for s in steps if not s.prefill]
        ids = prompt + reply
        rep = Reply("tiny", "p", len(prompt), ids, guess_ranks(model, prompts, ids, len(prompt)))
        assert len(rep.ranks) == n
        assert replay(rep, TreeSet(shape, 0, states, 0.0), m).lengths == real
        accepted_somewhere |= max(real) > 1
    if shape not in ("size-1",):
        assert accepted_somewhere  # the comparison covered accepted guesses, not only misses


def test_ranks_agree_with_the_decoder_guesses(trained):
    """The chain after point a in one long forward gives the same top guesses as the
    decoder's prefill at that point."""
    model, prompts = trained
    ids = greedy_texts(model, 1, n=20)[0]
    ranks = guess_ranks(model, prompts, ids, 3)
    dec = TreeDecoder(model, prompts, SHAPES["chain"](prompts.count), topk=MISS)
    for a in (2, 7, 15):
        res = dec.step(model.new_cache(64), ids[: a + 1], None)
        for i in range(prompts.count):
            t = a + 2 + i
            if t < len(ids):
                hit = (res.guesses[i] == ids[t]).nonzero()
                want = int(hit[0, 0]) if hit.numel() else MISS
                assert ranks[a - 2][i] == want


def test_accuracy_counts_ranks_per_distance():
    # prompt of 2 tokens, 4 reply tokens: points a = 1..4, distance i guesses ids[a + 1 + i]
    rep = Reply("d", "p", 2, [0, 1, 2, 3, 4, 5], [[0, 1], [2, MISS], [0, MISS], [MISS, MISS]])
    acc = accuracy([rep], m=2, topk=4)
    # distance 1 trials: a = 1, 2, 3 (a + 2 < 6); ranks 0, 2, 0
    assert acc[0] == pytest.approx([2 / 3, 0, 1 / 3, 0])
    # distance 2 trials: a = 1, 2 (a + 3 < 6); ranks 1, MISS
    assert acc[1] == pytest.approx([0, 1 / 2, 0, 0])
    assert cumulative(acc)[0] == pytest.approx([2 / 3, 2 / 3, 1, 1])


def test_replay_by_hand():
    """A chain tree of depth 2 carrying 2 prompt tokens on each node (m = 2)."""
    from draftsman.trees.layout import TreeSpec

    chain = TreeSpec.chain(2, 2)
    states = {0: TreeSpec(((),), (0,)), 1: TreeSpec(((), (0,)), (2, 2)), 2: chain}
    # 7 reply tokens after a 1-token prompt: the prefill commits ids[1]
    ranks = [[0, 0], [1, 0], [0, 1], [0, 0], [0, 0], [0, 0], [MISS, MISS]]
    rep = Reply("d", "p", 1, list(range(8)), ranks)
    # a=0: path (0,0) -> 3 tokens, a=3: ranks [0,0] -> 3 tokens, a=6: 0 left... total 6
    assert replay(rep, TreeSet("x", 0, states, 0.0), 2).lengths == [3, 3]
    ranks2 = [[1, 0], [0, 1], [0, 0], [0, 0], [0, 0], [0, 0], [MISS, MISS]]
    rep2 = Reply("d", "p", 1, list(range(8)), ranks2)
    # a=0: rank 1 at depth 1 -> 1 token; a=1: path (0,) then rank 1 -> 2 tokens; a=3: 3
    assert replay(rep2, TreeSet("x", 0, states, 0.0), 2).lengths == [1, 2, 3]


def test_cli_report_measured_tau_equals_replayed(tmp_path):
    """`draftsman analyze parallel-prompt` end to end on a tiny model folder: the real
    decoder's τ at each timed size equals the replay's, and report.html embeds every plot."""
    import json

    from test_server import WORDS, save_model, save_tokenizer

    from draftsman.cli.main import main

    folder = tmp_path / "tiny"
    folder.mkdir()
    save_model(folder, save_tokenizer(folder), seed=1)
    data = []
    for i in range(2):
        path = tmp_path / f"set{i}.jsonl"
        path.write_text(json.dumps({"prompt": " ".join(WORDS[i * 5: i * 5 + 6])}) + "\n")
        data.append(str(path))
    out = tmp_path / "out"
    code = main(["analyze", "parallel-prompt", "--target", str(folder), "--dtype", "fp32",
                 "--prompt-tokens", "random", "--datasets", ",".join(data), "--limit", "1",
                 "--max-new-tokens", "24", "--sizes", "1,2,4,8", "--time-sizes", "2,8",
                 "--threads", "1", "--also", "speculative:drafter=ngram,gamma=2",
                 "--out", str(out)])
    assert code == 0
    result = json.loads((out / "prompt_decoding.json").read_text())
    for d in data:
        per = result["timings"][d]
        assert set(per) == {"autoregressive", "parallel-prompt:tree_size=2",
                            "parallel-prompt:tree_size=8", "speculative:drafter=ngram,gamma=2"}
        assert all(t["identical"] for ts in per.values() for t in ts)
        for n in (2, 8):
            measured = per[f"parallel-prompt:tree_size={n}"][0]["tau"]
            assert measured == pytest.approx(result["replayed_tau_timed"][d][str(n)])
    html = (out / "report.html").read_text()
    md = (out / "prompt_decoding.md").read_text()
    for png in ("fig6_accuracy.png", "fig8a_trees.png", "fig8bc_speedup.png"):
        assert (out / png).stat().st_size > 1000
        assert png in html and png in md
    assert html.count("data:image/png;base64,") == 3
    assert "Figure 8b/c" in md and "<table>" in html


def test_cli_rejects_bad_sizes(tmp_path, capsys):
    from draftsman.cli.main import main

    code = main(["analyze", "parallel-prompt", "--sizes", "2,4", "--time-sizes", "8",
                 "--out", str(tmp_path)])
    assert code != 0
    assert "--time-sizes" in capsys.readouterr().err
