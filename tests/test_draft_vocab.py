"""Drafts whose head scores only the most frequent tokens (models/draft_vocab.py).

A narrowed head must give the kept ids exactly the full head's scores and every other id
-inf, in every weight format; a draft with one must leave greedy output identical and
sampled output distribution-exact (the residual draws the tokens the draft cannot propose:
a rule that forgets them is caught); the option must reach the draft model, with one-line
errors where it cannot apply.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_conformance import CHAIN_NEEDS, CHAIN_PROMPT, DRAWS, T1, report, spread_pair
from test_quant import gguf_model
from test_speculative import models, perturbed_copy, prompts, run  # noqa: F401 (fixture)
from tiny import hf_model, ours_from_hf

from draftsman.errors import DraftsmanError
from draftsman.kernels.native import kquant_available
from draftsman.models import draft_vocab
from draftsman.models.draft_vocab import (
    VocabSubsetHead,
    head_tokens,
    narrowed_linear,
    special_tokens,
    top_level_value,
)
from draftsman.models.loader import build_model
from draftsman.models.quant_linear import quantize_model
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.sampling import SamplingConfig
from draftsman.strategies import step_machine
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.testing import check_exact, target_joint
from draftsman.verification import chain


def narrowed(model, keep: list[int]):
    """A copy of `model` whose head keeps the ids `keep`."""
    import copy

    out = copy.deepcopy(model)
    ids = torch.tensor(keep)
    out.lm_head = VocabSubsetHead(narrowed_linear(model.lm_head, ids), ids,
                                  model.config.vocab_size)
    return out


def logits(model, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([tokens])
    return model(ids, torch.arange(len(tokens))[None], model.new_cache(len(tokens))).logits[0]


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: tied embeddings
def test_kept_ids_score_as_the_full_head_and_the_rest_is_minus_infinity(family):
    model = ours_from_hf(hf_model(family, seed=3))
    keep = [0, 5, 17, 18, 60, 96]
    full, part = logits(model, [4, 9, 33, 2]), logits(narrowed(model, keep), [4, 9, 33, 2])
    assert part.shape == full.shape
    # the same products, but PyTorch's float32 GEMM may sum a 6-row head in another order
    # than the 97-row one (last bits differ on an AVX2 EPYC, not on AVX-512 Xeons)
    torch.testing.assert_close(part[:, keep], full[:, keep], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(part[:, keep], full[:, [1, 6, 16, 19, 61, 95]], atol=1e-3)
    dropped = torch.ones(full.shape[-1], dtype=torch.bool)
    dropped[keep] = False
    assert torch.isinf(part[:, dropped]).all() and (part[:, dropped] < 0).all()
    # the embedding a tied head came from is untouched
    assert torch.equal(logits(model, [4, 9, 33, 2]), full)


@pytest.mark.skipif(not kquant_available(), reason="the kernels do not build here")
@pytest.mark.parametrize("kind", ["q4", "q4-draft", "q8"])
def test_a_quantised_head_keeps_the_gguf_rows_bit_for_bit(kind):
    """The kept rows' blocks as stored (q4) or requantised as the full head would be: a
    row's products do not depend on the other rows, so the scores are the same bits."""
    config, state, blocks = gguf_model("llama", seed=2)
    keep = torch.tensor([1, 2, 30, 31, 64, 95])
    full = quantize_model(build_model(config, state, torch.float32), kind, blocks)
    part = quantize_model(build_model(config, state, torch.float32), kind, blocks, keep)
    assert isinstance(part.lm_head, VocabSubsetHead)
    a, b = logits(full, [3, 8, 40]), logits(part, [3, 8, 40])
    assert torch.equal(a[:, keep], b[:, keep])
    assert torch.isinf(b).sum() == b.shape[0] * (config.vocab_size - len(keep))


@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_output_is_the_targets_with_a_narrowed_draft(models, gamma):  # noqa: F811
    target = models["target"]
    keep = list(range(0, 97, 2)) + [1, 3]  # most odd ids dropped: the draft misses them
    draft = narrowed(models["close"], keep)
    accepted = 0
    for prompt in prompts(4):
        want, _ = run(Autoregressive(target), prompt)
        got, steps = run(Speculative(target, DraftModelProposer(draft), make_policy(gamma, None)),
                         prompt)
        assert got == want
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0


@pytest.fixture(scope="module")
def tiny_pair():
    target, draft = spread_pair()
    return target, narrowed(draft, [0, 1, 3])  # token 2 only ever comes from the residual


def test_sampling_with_a_narrowed_draft_is_exact(tiny_pair):
    target, draft = tiny_pair
    expected = target_joint(target, CHAIN_PROMPT, 5, T1)
    assert sum(p for seq, p in expected.items() if 2 in seq[1:]) > 0.2  # 2 matters
    strategy = Speculative(target, DraftModelProposer(draft), make_policy(3, None))
    result = report(check_exact(strategy, CHAIN_PROMPT, expected, T1, DRAWS,
                                require=CHAIN_NEEDS), "speculative, narrowed draft head")
    assert result.passed(), result.table()


def residual_over_the_drafts_vocabulary(drafts, q, p, sampler):
    """A mutation: after a rejection the residual max(0, p - q) is drawn only over the ids
    the draft can score (as an implementation that trims everything to the kept ids would)."""
    verdict = chain.verify_sampling(drafts, q, p, sampler)
    if not verdict.rejected or q is None:
        return verdict
    i = verdict.accepted
    residual = (p[i] - q[i]).clamp_min(0) * torch.isfinite(q[i].log()).to(p.dtype)
    residual[drafts[i]] = 0
    if residual.sum() <= 0:
        return verdict
    return chain.Verdict(i, sampler.draw(residual / residual.sum()), True)


def test_a_residual_that_forgets_the_dropped_ids_is_caught(tiny_pair, monkeypatch):
    target, draft = tiny_pair
    monkeypatch.setattr(step_machine, "verify_sampling", residual_over_the_drafts_vocabulary)
    expected = target_joint(target, CHAIN_PROMPT, 5, T1)
    strategy = Speculative(target, DraftModelProposer(draft), make_policy(3, None))
    result = report(check_exact(strategy, CHAIN_PROMPT, expected, T1, DRAWS),
                    "mutation: residual over the draft's vocabulary")
    assert result.p_min < 1e-6, result.table()


def test_head_tokens_keep_the_ranked_the_special_and_the_end_ids(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(
        '{"added_tokens": [{"id": 95, "content": "<|end|>"}, {"id": 96, "content": "<|x|>"}]}')
    np.save(folder / draft_vocab.RANKS_FILE, np.array([7, 3, 50, 9, 1], dtype=np.uint32))
    assert head_tokens(folder, 3, 97, eos_ids=(90,)).tolist() == [3, 7, 50, 90, 95, 96]
    assert head_tokens(folder, 97, 97).tolist() == list(range(97))
    with pytest.raises(DraftsmanError, match="lists 5 tokens"):
        head_tokens(folder, 6, 97)
    with pytest.raises(DraftsmanError, match=">= 1"):
        head_tokens(folder, 0, 97)
    (folder / draft_vocab.RANKS_FILE).unlink()
    monkeypatch.setattr(draft_vocab, "ASSETS", tmp_path / "none")
    with pytest.raises(DraftsmanError, match="no token ranking .*scripts/token_ranks.py"):
        head_tokens(folder, 3, 97)


def test_the_shipped_ranking_covers_the_catalogue_tokenizer():
    """The Qwen2.5 tokenizer's ranking ships with the package (scripts/token_ranks.py)."""
    files = list(draft_vocab.ASSETS.glob("*.npy"))
    assert files, "no token ranking shipped"
    ranks = np.load(files[0])
    assert len(ranks) == len(set(ranks.tolist())) > 32768


def test_the_option_reaches_the_draft_and_errors_are_one_line(monkeypatch):
    from draftsman.engine import Engine, LoadedModel
    from draftsman.server.worker import pin_models
    from draftsman.strategies.registry import make_strategy

    calls = []
    target = ours_from_hf(hf_model("llama", seed=0))

    def load(self, spec, dtype=None, vocab=None):
        calls.append((spec, vocab))
        model = narrowed(target, [1, 2, 3]) if vocab else target
        return LoadedModel(spec, None, model, None)

    monkeypatch.setattr(Engine, "model", load)
    engine = Engine(LoadedModel("t", None, target, None), torch.float32)
    strategy = make_strategy("speculative", engine, {"draft": "d", "draft_vocab": 3, "gamma": 2})
    assert isinstance(strategy.proposer.model.lm_head, VocabSubsetHead)
    assert calls == [("d", 3)]
    with pytest.raises(DraftsmanError, match="draft_vocab"):
        make_strategy("speculative", engine, {"draft": "d", "draft_vocab": 0})
    pin_models(engine, ["d"], "d")
    with pytest.raises(DraftsmanError, match="whole vocabulary, not draft_vocab=3"):
        engine.model("d", None, 3)


def test_a_server_keeps_the_default_methods_narrowed_draft_resident():
    """A recorded default may be a cascade with `draft_vocab`: `serve` loads the draft whole
    and narrowed at start-up, requests get either, and another width is a one-line 404."""
    from draftsman.engine import Engine, LoadedModel
    from draftsman.server.service import ServerSettings, load_resident

    target = ours_from_hf(hf_model("llama", seed=0))
    loaded = []

    class Counting(Engine):
        def model(self, spec, dtype=None, vocab=None):
            loaded.append((spec, vocab))
            return LoadedModel(spec, None, narrowed(target, [1, 2, 3]) if vocab else target,
                               None)

    engine = Counting(LoadedModel("t", None, target, None), torch.float32)
    # as a bench record spells them: strings
    options = {"subdraft": "suffix", "gamma": "auto", "draft_vocab": "3", "bypass": "1",
               "draft": "d"}
    settings = ServerSettings("t", method="staged", options=options, drafts=["d"],
                              default_draft="d")
    load_resident(engine, settings)
    assert ("d", None) in loaded and ("d", 3) in loaded
    assert isinstance(engine.model("d", None, 3).model.lm_head, VocabSubsetHead)
    with pytest.raises(DraftsmanError, match="draft_vocab=3, not draft_vocab=5"):
        engine.model("d", None, 5)


def test_sampled_draft_tokens_stay_inside_the_kept_ids(tiny_pair):
    _, draft = tiny_pair
    from draftsman.sampling import Sampler

    drawn = set()
    for seed in range(40):
        proposer = DraftModelProposer(draft)
        proposer.start(CHAIN_PROMPT, 32)
        sampler = Sampler(SamplingConfig(temperature=1.0, seed=seed))
        proposal = proposer.propose(CHAIN_PROMPT, 3, sampler)
        drawn.update(proposal.tokens)
        assert proposal.q is not None and float(proposal.q[:, 2].max()) == 0.0
    assert 2 not in drawn and drawn


def test_a_head_with_a_bias_keeps_its_rows_of_the_bias():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 20)
    keep = torch.tensor([2, 5, 19])
    x = torch.randn(3, 8)
    got = VocabSubsetHead(narrowed_linear(head, keep), keep, 20)(x)
    torch.testing.assert_close(got[:, keep], head(x)[:, keep], rtol=1e-6, atol=1e-6)


def test_special_tokens_read_the_added_tokens_without_the_vocabulary(tmp_path):
    """The top-level list's ids, wherever it stands (first, as Hugging Face writes it; after
    a model whose vocabulary holds the same key; absent)."""
    folder = tmp_path / "m"
    folder.mkdir()
    added = '[{"id": 95, "content": "<|end|>"}, {"id": 96, "content": "]"}]'
    model = '{"vocab": {"added_tokens": 1, "a": 0}, "merges": [["a", "b"]]}'
    for text, want in [
        (f'{{"version": "1.0", "added_tokens": {added}, "model": {model}}}', {95, 96}),
        (f'{{"model": {model} ,\n "added_tokens" :{added} }}', {95, 96}),
        (f'{{"model": {model}}}', set()),
    ]:
        (folder / "tokenizer.json").write_text(text)
        assert special_tokens(folder) == want, text
    with pytest.raises(DraftsmanError, match="not a JSON object"):
        top_level_value("[1]", "added_tokens")
