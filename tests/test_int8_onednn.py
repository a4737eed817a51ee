"""q8 on oneDNN's int8 GEMM with activations quantised per row (models/quant_linear.py,
models/weight_formats.py).

Held to a float64 reference written from the definition (round(x / s) with s = max|x| /
(2^(bits-1) - 1), times the int8 weight rows): every row alone equals itself in any batch
and thread count (the batch invariance exact methods need), pickling keeps the numbers, and
exact methods on a q8 model on this path emit its own autoregressive tokens. Runs on every
CPU oneDNN supports; the 8-bit activation path is checked exact where the CPU has an int8
dot product and shown to saturate where it has none (why 7 bits are used there).
"""

from __future__ import annotations

import pickle

import pytest
import torch
from test_quant import gguf_model, quantised
from test_speculative import prompts, run

from draftsman.errors import DraftsmanError
from draftsman.kernels.native import byte_records
from draftsman.models import weight_formats
from draftsman.models.int8_linear import Int8Matrix, OneDnnInt8Matrix, int8_rows
from draftsman.proposers.prompt_lookup import PromptLookupProposer
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.branches import BranchPlanner
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.speculative import Speculative
from draftsman.strategies.tree_speculative import TreeSpeculative

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="this PyTorch has no oneDNN")


def reference(x: torch.Tensor, m: OneDnnInt8Matrix) -> torch.Tensor:
    """float64 from the definitions, independent of the kernel."""
    top = 2 ** (m.bits - 1) - 1
    xd = x.double()
    s = xd.abs().amax(dim=1, keepdim=True) / top
    xq = torch.round(x.float() / s.float()).double()  # the rounding the path documents
    w = m.weight_int8.double() * m.scale.double()[:, None]
    return (xq @ w.T) * s


def matrix(n: int = 96, k: int = 320, bits: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    return OneDnnInt8Matrix(w, torch.float32, bits=bits), w


def test_int8_rows_stay_within_half_a_step():
    w = torch.randn(40, 64)
    q, scale = int8_rows(w)
    assert q.dtype == torch.int8 and int(q.min()) >= -127
    assert ((q.float() * scale[:, None] - w).abs() <= 0.5 * scale[:, None] + 1e-7).all()


@pytest.mark.parametrize("bits", [7, pytest.param(8, marks=pytest.mark.skipif(
    not weight_formats.has_int8_dot(), reason="8-bit activations need VNNI or AMX"))])
def test_matches_a_float64_reference(bits):
    m, w = matrix(bits=bits)
    x = torch.randn(9, 320, generator=torch.Generator().manual_seed(1))
    got = m(x).double()
    want = reference(x, m)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6 * float(want.abs().max()))
    # and close to the float product: the quantisation error is what it should be
    assert (got - (x @ w.T).double()).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.skipif(weight_formats.has_int8_dot(), reason="the CPU has an int8 dot product")
def test_8_bit_activations_saturate_without_an_int8_dot():
    """The negative control of the 7-bit rule: on vpmaddubsw, 8-bit activations against
    8-bit weights overflow the int16 pair sums and the answer is wrong."""
    k = 256
    w = torch.full((8, k), 1.0)
    m = OneDnnInt8Matrix(w, torch.float32, bits=8)
    x = torch.full((1, k), 1.0)  # every product 127 * 127, every pair far past int16
    assert (m(x) - reference(x, m)).abs().max() > 0.1 * reference(x, m).abs().max()
    assert weight_formats.activation_bits() == 7


@pytest.mark.parametrize("threads", [1, 2])
def test_every_row_is_the_same_alone_and_in_any_batch(threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        m, _ = matrix(n=200, k=512)
        x = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)) * 3
        x[5] *= 100  # a row with a much larger scale must not move the others
        full = m(x)
        for size in (1, 2, 3, 4, 7, 8, 16, 17, 33):
            for start in (0, 40 - size):
                assert torch.equal(m(x[start:start + size]), full[start:start + size]), size
    finally:
        torch.set_num_threads(old)
    # a per-tensor scale over the batch would fail this: row 0 with and without row 5
    assert torch.equal(m(x[:2]), full[:2]) and torch.equal(m(x[4:6])[1], full[5])


def test_bf16_in_and_out_and_pickle():
    m, _ = matrix()
    x = torch.randn(5, 320)
    y = m(x.bfloat16())
    assert y.dtype == torch.bfloat16
    back = pickle.loads(pickle.dumps(m))
    assert torch.equal(back(x), m(x)) and torch.equal(back.weight_int8, m.weight_int8)


def test_kernel_choice_is_declared_and_overridable(monkeypatch):
    monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", "onednn")
    assert weight_formats.int8_kernel() == "onednn"
    monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", "packed")
    assert weight_formats.int8_kernel() == "packed"
    monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", "mkl")
    with pytest.raises(DraftsmanError, match="onednn or packed"):
        weight_formats.int8_kernel()
    if byte_records():
        monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", "records")
        assert weight_formats.int8_kernel() == "records"
    monkeypatch.delenv("DRAFTSMAN_INT8_KERNEL")
    # the records kernel where it runs (AVX-512 VNNI, AMX or not: measured faster than
    # oneDNN's tiles up to 16 rows), else oneDNN where the CPU has an int8 dot product
    want = ("records" if byte_records()
            else "onednn" if weight_formats.has_int8_dot() else "packed")
    assert weight_formats.int8_kernel() == want


def test_records_are_refused_in_one_line_where_they_cannot_run(monkeypatch):
    monkeypatch.setattr("draftsman.kernels.native.byte_records", lambda: False)
    monkeypatch.setenv("DRAFTSMAN_INT8_KERNEL", "records")
    with pytest.raises(DraftsmanError, match="no AVX-512 VNNI records kernel"):
        weight_formats.int8_kernel()


@pytest.fixture(scope="module")
def q8_onednn():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTSMAN_INT8_KERNEL", "onednn")
        config, state, blocks = gguf_model("llama", seed=0, lm_scale=8.0)
        return quantised(config, state, blocks, kind="q8")


def assert_rows_match_one_token_steps(model) -> None:
    """A 10-token forward's rows against 10 one-token steps through the cache."""
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
    pos = torch.arange(10)[None]
    whole = model(ids, pos, model.new_cache(16)).logits
    cache = model.new_cache(16)
    steps = [model(ids[:, i:i + 1], pos[:, i:i + 1], cache, start=i).logits for i in range(10)]
    # attention over different key counts rounds differently: close, and the same argmax
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-4, atol=1e-4)


def assert_exact_methods_emit_its_own_tokens(model, tree: bool) -> None:
    """Speculative (or tree) decoding with prompt lookup emits the model's own greedy
    tokens, and accepts some guesses."""
    reference = Autoregressive(model)
    accepted = 0
    for prompt in prompts(3):
        spec = (TreeSpeculative(model, PromptLookupProposer(), make_policy(3, None),
                                BranchPlanner(2)) if tree else
                Speculative(model, PromptLookupProposer(), make_policy(4, None)))
        want, _ = run(reference, prompt, max_new=24)
        got, steps = run(spec, prompt, max_new=24)
        assert got == want
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0


def test_q8_model_runs_every_matrix_on_onednn(q8_onednn):
    kinds = {type(p) for m in q8_onednn.modules() if hasattr(m, "parts") for p in m.parts}
    assert kinds == {OneDnnInt8Matrix} and Int8Matrix not in kinds
    assert_rows_match_one_token_steps(q8_onednn)


@pytest.mark.parametrize("tree", [False, True])
def test_exact_methods_on_q8_onednn_emit_its_own_tokens(q8_onednn, tree):
    assert_exact_methods_emit_its_own_tokens(q8_onednn, tree)


def test_verbose_names_the_8bit_kernel(monkeypatch, capsys):
    from types import SimpleNamespace

    from draftsman.cli.generate_cmd import report_choices

    model = SimpleNamespace(quant_summary={"Q6_K -> int8 per row (requantised)": 3})
    engine = SimpleNamespace(backend="torch", backend_reason="asked for",
                             target=SimpleNamespace(model=model))
    for kernel, name in weight_formats.INT8_KERNEL_NAMES.items():
        monkeypatch.setattr("draftsman.cli.generate_cmd.int8_kernel", lambda k=kernel: k)
        report_choices(engine)
        assert f"kernel: 8-bit matrices on {name}" in capsys.readouterr().err
