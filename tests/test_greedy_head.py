"""A greedy verify's head picks its tokens as it multiplies (`draftsman::kquant_records_greedy`,
`DecoderLM.greedy_head`): the tokens `greedy_tokens` reads of the stored product, on every
records type and path this CPU runs, alone and in a batch, at ties across groups and threads;
and the strategies read those tokens wherever a model declares `greedy_head`."""

from __future__ import annotations

import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_q8_records import PATHS  # vectors, AMX tiles for every row count, tiles from 16
from test_quant import gguf_model, quantised, random_blocks
from test_speculative import prompts, run

from draftsman.kernels import native
from draftsman.kernels.greedy import greedy_tokens
from draftsman.kernels.native import byte_records, records_greedy
from draftsman.models.base import DecoderLM
from draftsman.models.int8_linear import TYPE_I8_ROW, Int8RecordsMatrix
from draftsman.models.static_step import STATIC_LACKS
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative

pytestmark = pytest.mark.skipif(not records_greedy(),
                                reason="no AVX-512 VNNI records here: the head stores logits")
KINDS = ["q4_k", "q6_k", "q8_0", "int8-rows"]
N = 16 * 37 + 5  # output columns: 38 groups, the last of 5


def packed_matrix(kind: str, n: int = N, k: int = 512, seed: int = 0,
                  repeat: dict[int, int] | None = None) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(packed, qtype, weights as floats) of a random n x k matrix of `kind`; `repeat`
    {row: source} makes row a copy of source's weights (columns that tie wherever source's
    do)."""
    if kind == "int8-rows":
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
        for row, source in (repeat or {}).items():
            w[row] = w[source]
        return Int8RecordsMatrix(w).packed, TYPE_I8_ROW, w
    qtype = {"q4_k": Q.Q4_K, "q6_k": Q.Q6_K, "q8_0": Q.Q8_0}[kind]
    rows = random_blocks(qtype, n, k, seed=seed)
    for row, source in (repeat or {}).items():
        rows[row] = rows[source]
    packed = torch.ops.draftsman.kquant_pack_records(torch.from_numpy(rows), int(qtype))
    return packed, int(qtype), torch.from_numpy(dequantize(rows, qtype).reshape(n, k)).float()


def picks(x: torch.Tensor, packed: torch.Tensor, qtype: int, tiles: int, n: int = N
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the greedy op's tokens, greedy_rows over the stored product's)"""
    got = torch.ops.draftsman.kquant_records_greedy(x, packed, qtype, n, tiles)
    product = torch.ops.draftsman.kquant_records_mm(x, packed, qtype, n, tiles)
    return got, torch.ops.draftsman.greedy_rows(product)


def needs(kind: str) -> None:
    if kind in ("q8_0", "int8-rows") and not byte_records():
        pytest.skip("no 8-bit records here")


@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_head_picks_what_greedy_rows_reads_of_its_product(kind, dtype, tiles):
    needs(kind)
    packed, qtype, _ = packed_matrix(kind, seed=1)
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)).to(dtype)
    for m in (1, 5, 16, 23, 40):
        got, want = picks(x[:m].contiguous(), packed, qtype, tiles)
        assert got.dtype == torch.long and torch.equal(got, want), m
        assert torch.equal(want, torch.argmax(
            torch.ops.draftsman.kquant_records_mm(x[:m].contiguous(), packed, qtype, N, tiles), -1))


@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_ties_across_groups_and_threads_take_the_first_column(kind, tiles):
    """Columns 3, 19, 40, 300 and 590 hold one row's weights (19 in 3's lane, 590 in the
    second thread's half): where they are the largest, the first of them wins, on 1 and 2
    threads."""
    needs(kind)
    packed, qtype, w = packed_matrix(kind, seed=3, repeat={19: 3, 40: 3, 300: 3, 590: 3})
    noise = torch.randn(24, 512, generator=torch.Generator().manual_seed(4))
    x = w[3] / w[3].norm() * 8 + noise * 0.1  # rows close to column 3's weights
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            got, want = picks(x, packed, qtype, tiles)
            assert torch.equal(got, want)
            assert got.tolist() == [3] * 24
    finally:
        torch.set_num_threads(threads)


def test_a_row_of_equal_columns_picks_the_first():
    if not byte_records():
        pytest.skip("no 8-bit records here")
    w = torch.ones(N, 256)
    packed = Int8RecordsMatrix(w).packed
    got = torch.ops.draftsman.kquant_records_greedy(torch.ones(3, 256), packed, TYPE_I8_ROW, N, 0)
    assert got.tolist() == [0, 0, 0]


@pytest.mark.parametrize("tiles", PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_token_is_its_own_alone_in_a_batch_and_in_a_prompts_slices(kind, tiles):
    needs(kind)
    packed, qtype, _ = packed_matrix(kind, n=64, k=8192, seed=5)
    m = 2 * native.records_slice_rows(32) + 37  # past a slice: the rows run in slices
    x = torch.randn(m, 8192, generator=torch.Generator().manual_seed(6))
    batch = torch.ops.draftsman.kquant_records_greedy(x, packed, qtype, 64, tiles)
    op = torch.ops.draftsman.kquant_records_greedy
    alone = [int(op(x[i:i + 1].contiguous(), packed, qtype, 64, tiles)) for i in range(0, m, 7)]
    assert batch[::7].tolist() == alone
    assert torch.equal(batch, picks(x, packed, qtype, tiles, 64)[1])


def test_the_op_refuses_what_it_cannot_pick():
    packed, qtype, _ = packed_matrix("q4_k", n=32, k=256)
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.draftsman.kquant_records_greedy(torch.randn(256), packed, qtype, 32, 0)
    with pytest.raises(RuntimeError, match="not 32 rows of width 512"):
        torch.ops.draftsman.kquant_records_greedy(torch.randn(2, 512), packed, qtype, 32, 0)


# ------------------------------------------------------------------------------ models


@pytest.fixture(scope="module")
def q8_model():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTSMAN_INT8_KERNEL", "records")
        config, state, blocks = gguf_model("llama", seed=0, lm_scale=8.0)
        return quantised(config, state, blocks, kind="q8", dtype=torch.bfloat16)


def test_a_greedy_forward_gives_the_tokens_of_its_logits_without_them(q8_model):
    if not byte_records():
        pytest.skip("no 8-bit records here")
    assert q8_model.lm_head.greedy_product(q8_model.dtype) is not None
    cache = q8_model.new_cache(32)
    ids, pos = torch.arange(3, 15)[None], torch.arange(12)[None]
    logits = q8_model(ids, pos, cache).logits
    cache.truncate(0)
    out = q8_model(ids, pos, cache, greedy=True)
    assert out.logits is None and out.tokens.shape == (1, 12)
    assert torch.equal(out.tokens, greedy_tokens(logits))
    cache.truncate(8)
    out = q8_model(ids[:, 8:], pos[:, 8:], cache, logits_at=slice(1, None), greedy=True)
    assert torch.equal(out.tokens, greedy_tokens(logits[:, 9:]))


def test_models_without_a_greedy_product_pick_from_their_logits():
    config, state, blocks = gguf_model("llama", seed=1)
    model = quantised(config, state, blocks, kind="q4", dtype=torch.float32)
    model.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    cache = model.new_cache(16)
    ids, pos = torch.arange(2, 9)[None], torch.arange(7)[None]
    logits = model(ids, pos, cache).logits
    cache.truncate(0)
    assert torch.equal(model(ids, pos, cache, greedy=True).tokens, greedy_tokens(logits))


def test_static_steps_declare_no_greedy_head():
    assert "greedy_head" in STATIC_LACKS


@pytest.mark.parametrize("tree", [False, True])
def test_greedy_verifies_read_the_heads_tokens_and_stay_exact(q8_model, tree, monkeypatch):
    """Speculative and tree decoding at temperature 0 verify on the head's tokens (counted),
    and emit what autoregressive decoding does on logits; a head that picked the next token
    id instead changes the text (the negative control), and sampling never asks for it."""
    if not byte_records():
        pytest.skip("no 8-bit records here")
    calls = []
    real = DecoderLM.greedy_head

    def counted(self, hidden):
        calls.append(hidden.shape[1])
        return real(self, hidden)

    def method():
        return (TreeSpeculative(q8_model, PromptLookupProposer(), make_policy(3, None),
                                BranchPlanner(2)) if tree else
                Speculative(q8_model, PromptLookupProposer(), make_policy(4, None)))

    prompt = prompts(1)[0]
    want, _ = run(Autoregressive(q8_model), prompt, max_new=24)
    monkeypatch.setattr(DecoderLM, "greedy_head", counted)
    got, _ = run(method(), prompt, max_new=24)
    assert got == want and calls and max(calls) > 1
    vocab = q8_model.config.vocab_size
    monkeypatch.setattr(DecoderLM, "greedy_head",
                        lambda self, hidden: (real(self, hidden) + 1) % vocab)
    wrong, _ = run(method(), prompt, max_new=24)
    assert wrong != want


def batch_outputs(model, configs, monkeypatch) -> tuple[list[list[int]], list[int]]:
    """Prompt-lookup requests under `configs` decoded together by the batch scheduler: their
    tokens, and the rows of every greedy_head call the shared forwards made."""
    from draftsman.batching.scheduler import BatchConfig, BatchScheduler
    from draftsman.core import GenerationConfig

    calls, real = [], DecoderLM.greedy_head
    monkeypatch.setattr(DecoderLM, "greedy_head",
                        lambda self, hidden: calls.append(hidden.shape[1]) or real(self, hidden))
    scheduler = BatchScheduler(model, BatchConfig(max_batch=len(configs), prefill_chunk=4),
                               lambda n: 1.0 + 0.02 * (n - 1))
    outputs = [[] for _ in configs]
    for i, (prompt, sampling) in enumerate(zip(prompts(len(configs)), configs, strict=True)):
        method = Speculative(model, PromptLookupProposer(), make_policy(4, None))
        scheduler.submit(method.steps(prompt, GenerationConfig(16, sampling), 4),
                         lambda s, i=i: outputs[i].extend(s.tokens))
    while not scheduler.idle:
        scheduler.step()
    monkeypatch.setattr(DecoderLM, "greedy_head", real)
    return outputs, calls


def test_a_batch_of_greedy_requests_reads_the_heads_tokens_and_a_mixed_one_logits(
        q8_model, monkeypatch):
    if not byte_records():
        pytest.skip("no 8-bit records here")
    from draftsman.sampling import SamplingConfig

    greedy = SamplingConfig()
    outputs, calls = batch_outputs(q8_model, [greedy, greedy], monkeypatch)
    assert calls and max(calls) > 2  # the shared forwards' rows of both requests
    for prompt, got in zip(prompts(2), outputs, strict=True):
        assert got == run(Autoregressive(q8_model), prompt, max_new=16)[0]
    outputs, calls = batch_outputs(q8_model, [greedy, SamplingConfig(1.0, seed=0)],
                                   monkeypatch)
    assert not calls  # a sampled request needs every row's logits
    assert outputs[0] == run(Autoregressive(q8_model), prompts(1)[0], max_new=16)[0]
