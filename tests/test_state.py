"""ModelState: a cache that follows a text, cheaply (only past the agreed prefix), over layer
ranges and with scratch rows after the text."""

from __future__ import annotations

import pytest
import torch
from tiny import assert_cache_holds, hf_model, ours_from_hf

from draftsman.proposers.draft_model import probability
from draftsman.state import ModelState

TEXT = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 25]


@pytest.fixture(scope="module")
def model():
    return ours_from_hf(hf_model("llama", seed=0, num_hidden_layers=4))


class CountingList(list):
    """A list that counts reads of single items (what a prefix comparison costs)."""

    reads = 0

    def __getitem__(self, index):
        if isinstance(index, int):
            self.reads += 1
        return super().__getitem__(index)


def next_logits(model, tokens):
    return fresh_cache_logits(model, tokens)[-1]


def fresh_cache_logits(model, tokens):
    cache = model.new_cache(len(tokens) + 1)
    return model(torch.tensor([tokens]), torch.arange(len(tokens))[None], cache).logits[0]


# ---- following a text ---------------------------------------------------------------------

def test_sync_returns_what_is_missing(model):
    state = ModelState(model, 32)
    assert state.sync(TEXT[:4]) == TEXT[:4]
    state.feed(TEXT[:4])
    assert state.sync(TEXT[:6]) == TEXT[4:6]
    assert state.fed == TEXT[:4] and state.agreed == 4 and state.cache.length == 4


def test_sync_after_append_compares_only_the_new_tokens(model):
    state = ModelState(model, 64)
    long = TEXT * 4  # 48 tokens
    state.feed(long)
    state.sync(long)
    assert state.agreed == len(long)
    state.feed([7, 8, 9])  # guesses, fed speculatively
    text = CountingList(long + [7, 8, 10])  # the text kept two of them
    pending = state.sync(text)
    assert pending == [10]
    assert text.reads <= 3  # the three fed guesses, none of the 48 agreed tokens
    assert state.fed == long + [7, 8] and state.agreed == len(long) + 2
    assert state.cache.length == len(long) + 2


def test_rollback_to_the_common_prefix_leaves_a_cache_like_a_fresh_one(model):
    state = ModelState(model, 32)
    state.feed(TEXT[:8])
    state.sync(TEXT[:6])  # the text continues differently after 6 tokens
    assert state.fed == TEXT[:6]
    assert_cache_holds(state.cache, model, TEXT[:6])
    pending = state.sync(TEXT[:6] + [50, 51])
    out = state.feed(pending).logits[0, -1]
    torch.testing.assert_close(out, next_logits(model, TEXT[:6] + [50, 51]),
                               rtol=1e-5, atol=1e-5)


def test_provisional_sync_keeps_the_agreement(model):
    state = ModelState(model, 32)
    state.feed(TEXT[:5])
    state.sync(TEXT[:5])
    guessed = TEXT[:5] + [40, 41, 42]
    state.feed(state.sync(guessed, final=False))
    state.sync(guessed, final=False)
    assert state.agreed == 5 and state.fed == guessed
    # the caller drops the last two guesses: a final sync still sees it, from the agreement
    state.sync(TEXT[:5] + [40, 99])
    assert state.fed == TEXT[:5] + [40] and state.agreed == 6
    assert_cache_holds(state.cache, model, TEXT[:5] + [40])


def test_cutting_the_text_needs_rollback(model):
    state = ModelState(model, 32)
    state.feed(TEXT[:8])
    state.sync(TEXT[:8])
    with pytest.raises(ValueError, match="rollback"):
        state.sync(TEXT[:4])
    state.rollback(4)
    assert state.fed == TEXT[:4] and state.agreed == 4 and state.cache.length == 4
    assert state.sync(TEXT[:4] + [1, 2]) == [1, 2]
    state.rollback(10)  # past the fed tokens: nothing to cut
    assert state.fed == TEXT[:4] and state.cache.length == 4


def test_missing_is_the_tail_past_the_fed_tokens(model):
    state = ModelState(model, 32)
    state.feed(TEXT[:3])
    assert state.missing(TEXT[:7]) == TEXT[3:7]


# ---- layer ranges -------------------------------------------------------------------------

def test_layer_ranges_share_one_cache(model):
    n = model.config.num_layers
    shallow = ModelState(model, 32, layers=range(0, 2))
    deep = ModelState(model, layers=range(2, n), cache=shallow.cache)
    assert deep.cache is shallow.cache
    hidden = shallow.feed(TEXT[:6]).hidden
    assert shallow.fed == TEXT[:6] and deep.fed == []
    logits = deep.feed(TEXT[:6], hidden=hidden).logits[0]
    torch.testing.assert_close(logits, fresh_cache_logits(model, TEXT[:6]),
                               rtol=1e-5, atol=1e-5)
    assert_cache_holds(shallow.cache, model, TEXT[:6])
    # the shallow layers run ahead; a cut rolls both back, the widest first
    ahead = shallow.feed(TEXT[6:9]).hidden
    assert shallow.cache.length == 9 and len(deep.fed) == 6
    shallow.rollback(7)
    deep.rollback(7)
    assert shallow.fed == TEXT[:7] and deep.fed == TEXT[:6] and shallow.cache.length == 7
    logits = deep.feed(TEXT[6:7], hidden=ahead[:, :1]).logits[0, -1]
    torch.testing.assert_close(logits, next_logits(model, TEXT[:7]), rtol=1e-5, atol=1e-5)
    assert_cache_holds(shallow.cache, model, TEXT[:7])


# ---- extra rows ---------------------------------------------------------------------------

def test_extra_rows_count_in_the_capacity(model):
    assert ModelState(model, 10, extra_rows=5).cache.capacity == 15


def test_keep_compacts_a_tree_path_after_the_text(model):
    state = ModelState(model, 8, extra_rows=4)
    state.feed(TEXT[:5])
    # root 60 with two children 2 and 33 at the same position: keep root -> 33
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    out = state.forward_rows([60, 2, 33], torch.tensor([0, 1, 1]), mask=mask)
    assert state.fed == TEXT[:5]  # scratch until kept
    torch.testing.assert_close(out.logits[0, 2], next_logits(model, TEXT[:5] + [60, 33]),
                               rtol=1e-5, atol=1e-5)
    state.keep([0, 2], [60, 33])
    assert state.fed == TEXT[:5] + [60, 33]
    assert_cache_holds(state.cache, model, TEXT[:5] + [60, 33])


def test_record_notes_rows_a_forward_kept_itself(model):
    state = ModelState(model, 16)
    state.feed(TEXT[:4])
    model(torch.tensor([TEXT[4:6]]), torch.arange(4, 6)[None], state.cache)
    state.record(TEXT[4:6])
    assert state.fed == TEXT[:6]
    with pytest.raises(RuntimeError):
        state.record([1])


# ---- one probability ----------------------------------------------------------------------

def test_probability_reads_one_softmax_entry():
    logits = torch.randn(97, generator=torch.Generator().manual_seed(0)) * 5
    for token in (0, int(logits.argmax()), 50):
        assert probability(logits, token) == pytest.approx(float(logits.softmax(-1)[token]),
                                                           rel=1e-5)
