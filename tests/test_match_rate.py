"""Match-rate analysis and exit-head training on tiny random models (fp32)."""

from __future__ import annotations

import pytest
import torch
from tiny import hf_model, ours_from_hf

from draftsman.analysis import match_rate as mr
from draftsman.core import GenerationConfig
from draftsman.models.base import LAST
from draftsman.models.exit_heads import EarlyPredictor, ExitHeadConfig, ExitTranslator
from draftsman.sampling import SamplingConfig
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.training import exit_head as eh

V = 97


@pytest.fixture(scope="module")
def model():
    m = ours_from_hf(hf_model("llama", seed=2, num_hidden_layers=6))
    with torch.no_grad():
        m.lm_head.weight.mul_(8)
    return m


def prompt(n: int = 7, seed: int = 0) -> list[int]:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_probed_generation_is_the_models_own_and_ranks_are_right(model):
    ids = prompt()
    heads = mr.ProbeHeads([2, 3, 5])
    tokens, ranks = mr.generate_with_probes(model, ids, 20, heads)
    ref = [t for s in Autoregressive(model).generate(ids, GenerationConfig(20)) for t in s.tokens]
    assert tokens == ref
    assert ranks.shape == (20, 3, 2) and (ranks[:, :, 1] == mr.MISSING).all()
    # brute force: rerun the prefix through the first L layers and rank the final token
    for t in (0, 7, 19):
        seq = ids + tokens[:t]
        for j, layer in enumerate(heads.layers):
            cache = model.new_cache(len(seq))
            out = model(torch.tensor([seq]), torch.arange(len(seq))[None], cache,
                        layers=range(0, layer), logits_at=None)
            logits = EarlyPredictor(model, layer).logits(out.hidden[0, -1]).float()
            want = int((logits > logits[tokens[t]]).sum())
            assert int(ranks[t, j, 0]) == want
    # the last layer before the head is much better than the first probes on average
    assert (ranks[:, 2, 0] == 0).float().mean() >= (ranks[:, 0, 0] == 0).float().mean()


def test_trained_head_column_and_sampling(model):
    c = model.config
    tr = ExitTranslator(ExitHeadConfig(3, "affine", 0, c.hidden_size, c.vocab_size))
    heads = mr.ProbeHeads([3], {3: tr})
    tokens, ranks = mr.generate_with_probes(model, prompt(), 12, heads)
    assert torch.equal(ranks[:, 0, 0], ranks[:, 0, 1])  # an untrained head is the shared one
    sampled, _ = mr.generate_with_probes(
        model, prompt(), 12, heads, sampling=SamplingConfig(temperature=1.0, top_k=3, seed=4))
    again, _ = mr.generate_with_probes(
        model, prompt(), 12, heads, sampling=SamplingConfig(temperature=1.0, top_k=3, seed=4))
    assert sampled == again
    eos_tokens, eos_ranks = mr.generate_with_probes(model, prompt(), 12, heads,
                                                    eos=frozenset({tokens[3]}))
    assert eos_tokens == tokens[: tokens.index(tokens[3]) + 1]
    assert len(eos_ranks) == len(eos_tokens)


def _gen(task, ranks, mode="greedy"):
    # ranks per token for one layer (8) and two heads
    return mr.Generation("m", task, f"{task}/{len(ranks)}", mode, [8],
                         [1] * len(ranks), [[[r, y]] for r, y in ranks])


def test_cells_tables_and_positions():
    gens = [_gen("qa", [(0, 0), (2, 0), (6, 1), (1, mr.MISSING)]),
            _gen("qa", [(0, 0), (0, 0)]),
            _gen("summarization", [(4, 3)] * 3, mode="top-k")]
    assert mr.match_cell(gens[:2], 8, 1, 0) == mr.Cell(3, 6)
    assert mr.match_cell(gens[:2], 8, 3, 0) == mr.Cell(5, 6)
    assert mr.match_cell(gens[:2], 8, 1, 1) == mr.Cell(4, 5)  # MISSING is skipped
    assert mr.match_cell(gens[:2], 8, 1, 0, positions=(2, 3)) == mr.Cell(1, 3)
    assert mr.match_sequence(gens[0], 8, 2) == [True, False, False, True]
    table = mr.table2(gens, [8], 16)
    assert "| QA | 1 | N | 50.00% |" in table and "| QA | 3 | Y | 100.00% |" in table
    assert mr.position_bins(16) == [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12),
                                    (13, 14), (15, 16)]
    assert mr.position_bins(128)[1] == (17, 32)
    pos = mr.position_table(gens, "qa", 4, [8], 16, ks=(1,))
    assert "| 8 (50%) | 1 | N | 100.00% | 50.00% | 0.00% | 0.00% | 50.00% |" in pos
    samp = mr.sampling_table(gens, 8, 3, 0)
    assert "Greedy decoding" in samp and "Top-k sampling (k=3) | 0.00% | — |" in samp
    s = mr.summary(gens, [8], (1,))
    assert s["greedy"]["qa"]["8"]["1"]["N"] == {"rate": 0.5, "hits": 3, "total": 6}


def test_generations_round_trip(tmp_path):
    g = _gen("qa", [(0, 1), (3, 2)])
    path = tmp_path / "g.jsonl"
    path.write_text(g.to_json() + "\n" + '{"cut": \n')
    assert mr.read_generations(path) == [g]


# ----------------------------------------------------------------------------- training


def test_kl_to_teacher_is_the_coarsened_kl():
    logits = torch.randn(4, V)
    logp = logits.log_softmax(-1)
    top = logp.topk(V, dim=-1)  # K = V: no tail, the exact KL
    assert float(eh.kl_to_teacher(logits, top.indices, top.values)) == pytest.approx(0, abs=1e-5)
    student = torch.randn(4, V)
    exact = (logp.exp() * (logp - student.log_softmax(-1))).sum(-1).mean()
    assert float(eh.kl_to_teacher(student, top.indices, top.values)) == pytest.approx(
        float(exact), rel=1e-4)
    top5 = logp.topk(5, dim=-1)
    coarse = float(eh.kl_to_teacher(student, top5.indices, top5.values))
    assert 0 <= coarse <= float(exact) + 1e-5  # coarsening never increases a KL


def test_batches_are_a_function_of_seed_and_step():
    a = eh.batch_rows(3, 8, 20, 0)
    assert torch.equal(a, eh.batch_rows(3, 8, 20, 0)) and len(set(a.tolist())) == 8
    epoch = torch.cat([eh.batch_rows(s, 4, 20, 1) for s in range(5)])
    assert sorted(epoch.tolist()) == list(range(20))


@pytest.fixture(scope="module")
def states(model):
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, V, (48,), generator=g).tolist() for _ in range(10)]
    return eh.collect_states(model, seqs, [2, 3], teacher_topk=16, train_count=8)


def test_collect_states_matches_the_model(model, states):
    assert states.rows == 480 and states.train_rows == 384
    assert states.hidden[2].shape == (480, model.config.hidden_size)
    g = torch.Generator().manual_seed(5)
    seq = torch.randint(0, V, (48,), generator=g).tolist()
    cache = model.new_cache(48)
    logits = model(torch.tensor([seq]), torch.arange(48)[None], cache, logits_at=LAST).logits
    assert int(states.top_idx[47, 0]) == int(logits[0, -1].argmax())


@pytest.mark.parametrize("kind", ["lowrank", "affine", "head"])
def test_training_improves_heldout_agreement(model, states, kind):
    cfg = eh.TrainConfig(kind=kind, rank=16, steps=60, batch=64, lr=1e-3, eval_every=60)
    tr, history, finished = eh.train_head(model, states, 3, cfg)
    evals = [h["heldout"] for h in history if "heldout" in h]
    assert finished and len(evals) == 2
    assert evals[1]["kl"] < evals[0]["kl"]
    assert evals[1]["top1"] >= evals[0]["top1"]


def test_training_resumes_exactly(model, states, tmp_path):
    cfg = eh.TrainConfig(kind="lowrank", rank=8, steps=10, batch=32, eval_every=0,
                         checkpoint_every=2)
    full, _, _ = eh.train_head(model, states, 3, cfg)
    part, _, finished = eh.train_head(model, states, 3, cfg, tmp_path, time_limit=0.0)
    assert not finished
    resumed, _, finished = eh.train_head(model, states, 3, cfg, tmp_path)
    assert finished
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_states_cache_round_trip(states, tmp_path):
    meta = {"a": 1}
    eh.save_states(states, tmp_path / "s.pt", meta)
    back = eh.load_states(tmp_path / "s.pt", meta)
    assert back is not None and torch.equal(back.hidden[3], states.hidden[3])
    assert eh.load_states(tmp_path / "s.pt", {"a": 2}) is None


def test_cli_resumes_saved_generations(tmp_path, capsys):
    """A second `analyze match-rate` with the same settings reuses generations.jsonl."""
    from test_server import save_model, save_tokenizer

    from draftsman.cli.main import main

    folder = tmp_path / "tiny"
    folder.mkdir()
    save_model(folder, save_tokenizer(folder), seed=1)
    argv = ["analyze", "match-rate", "--model", str(folder), "--dtype", "fp32", "--tasks",
            "qa", "--limit", "1", "--max-new-tokens", "4", "--layers", "1",
            "--exit-heads", "none", "--no-plots", "--out", str(tmp_path / "mr")]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "1/1" in first.err  # generated
    gens = (tmp_path / "mr" / "tiny" / "generations.jsonl").read_text()
    assert main(argv) == 0
    second = capsys.readouterr()
    assert "1/1" not in second.err  # reused, not regenerated
    assert (tmp_path / "mr" / "tiny" / "generations.jsonl").read_text() == gens
    assert (tmp_path / "mr" / "tiny" / "report.html").is_file()
    assert main([*argv, "--no-resume"]) == 0
    assert "1/1" in capsys.readouterr().err
