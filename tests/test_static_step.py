"""Static-shape steps (models/static_step.py): the same numbers as the dynamic forward.

On the CPU in fp32: decode, chain verify of every size (bucket sizes and padded ones), tree
verify, rollbacks and tree keeps followed by more steps (pad rows never leak), stale arena
contents, long prefills on the dynamic path, a sliding window, and greedy generation through
the strategies and the engine. The CUDA-graph cases are marked `gpu` and skip without CUDA.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from test_align import sharp_pair_folders
from tiny import assert_cache_holds, hf_model, ours_from_hf, tiny_pair

import draftsman
from draftsman.cli.generate_cmd import static_option
from draftsman.cli.main import build_parser
from draftsman.core import GenerationConfig
from draftsman.errors import InvalidArgumentError, UnsupportedError
from draftsman.models import static_step
from draftsman.models.static_step import StaticConfig, StaticModel, step_inputs
from draftsman.profiling import model_kind
from draftsman.proposers.ngram import NGramProposer
from draftsman.sampling import SamplingConfig
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.gamma import make_policy
from draftsman.strategies.speculative import Speculative

CUDA = torch.cuda.is_available()
TOL = dict(rtol=1e-5, atol=1e-5)


def pair(model, capacity: int = 160, **options):
    """(dynamic cache, static model, static cache) for `model`."""
    static = StaticModel(model, StaticConfig(**options))
    return model.new_cache(capacity), static, static.new_cache(capacity)


def step_both(model, static, dyn, sta, tokens: list[int], *, mask=None, offsets=None):
    """Run the same forward on both paths from the caches' lengths; check the logits."""
    assert dyn.length == sta.length
    start = dyn.length
    ids = torch.tensor([tokens])
    pos = (torch.arange(len(tokens)) if offsets is None else offsets)[None] + start
    a = model(ids, pos, dyn, mask=mask).logits
    b = static(ids, pos, sta, mask=mask).logits
    assert b.shape == a.shape
    torch.testing.assert_close(b, a, **TOL)
    assert sta.length == dyn.length == start + len(tokens)
    return a


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_decode_and_chain_verify_match_dynamic(family: str, monkeypatch) -> None:
    model = tiny_pair(family)[1]
    dyn, static, sta = pair(model)
    buckets = []  # every step here runs static, none falls back to the dynamic forward
    real = static_step.static_forward
    monkeypatch.setattr(static_step, "static_forward",
                        lambda m, k, v, inp: buckets.append(inp.tokens.shape[1]) or
                        real(m, k, v, inp))
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 97, (20,), generator=g).tolist()
    step_both(model, static, dyn, sta, text)  # a 20-row prefill, padded to 32
    for rows in (1, 1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 33, 64, 1):
        new = torch.randint(0, 97, (rows,), generator=g).tolist()
        step_both(model, static, dyn, sta, new)
        text += new
        if rows > 2:  # reject the last guesses, as a verify does
            keep = len(text) - rows // 2
            dyn.truncate(keep)
            sta.truncate(keep)
            del text[keep:]
    assert_cache_holds(sta, model, text)
    assert buckets == [32, 1, 1, 2, 4, 4, 8, 8, 8, 16, 16, 32, 64, 64, 1]


def tree_mask() -> tuple[torch.Tensor, torch.Tensor]:
    """root; a, b children of root; c child of a; d child of b; e child of c."""
    parent = [-1, 0, 0, 1, 2, 3]
    n = len(parent)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
        depth[i] = 0 if parent[i] < 0 else depth[parent[i]] + 1
    return mask, depth


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_tree_verify_and_keep_match_dynamic(family: str) -> None:
    model = tiny_pair(family)[1]
    dyn, static, sta = pair(model)
    text = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    step_both(model, static, dyn, sta, text)
    mask, depth = tree_mask()
    nodes = [38, 46, 26, 43, 38, 32]
    for path in ([0, 1, 3, 5], [0, 2], [0, 2, 4], [0]):
        start = dyn.length
        step_both(model, static, dyn, sta, nodes, mask=mask, offsets=depth)
        for cache in (dyn, sta):
            cache.keep([start + r for r in path], start)
        text += [nodes[r] for r in path]
        step_both(model, static, dyn, sta, [7])  # a decode right after the keep
        text.append(7)
    assert_cache_holds(sta, model, text)


def test_pad_rows_and_stale_slots_never_leak() -> None:
    """Garbage in every slot past the live length (as a reused arena or pad writes leave
    it) changes nothing; a second cache reuses the first's buffers once it is gone."""
    model = tiny_pair("llama")[1]
    dyn, static, sta = pair(model)
    with torch.no_grad():
        sta.k.normal_(0, 100)
        sta.v.normal_(0, 100)
    text = list(range(10, 40))
    step_both(model, static, dyn, sta, text)
    for rows in (3, 1, 6):
        step_both(model, static, dyn, sta, list(range(rows)))
        text += list(range(rows))
    buffer = sta.k.data_ptr()
    assert sta.capacity >= 160 + 64 and sta.capacity % StaticConfig().round_to == 0
    del sta
    again = static.new_cache(100)
    assert again.k.data_ptr() == buffer and again.length == 0  # stale, and never seen
    dyn = model.new_cache(160)
    step_both(model, static, dyn, again, [1, 2, 3])
    other = static.new_cache(100)  # `again` is alive: fresh buffers
    assert other.k.data_ptr() != buffer


def test_long_prefill_runs_dynamically_then_steps_are_static() -> None:
    model = tiny_pair("qwen2")[1]
    dyn, static, sta = pair(model, capacity=200)
    text = [(7 * i) % 97 for i in range(70)]  # past the largest bucket
    step_both(model, static, dyn, sta, text)
    for rows in (1, 5, 1):
        step_both(model, static, dyn, sta, list(range(rows)))
        text += list(range(rows))
    assert_cache_holds(sta, model, text)


def test_sliding_window_matches_dynamic() -> None:
    model = tiny_pair("mistral", sliding_window=8, use_sliding_window=True)[1]
    assert model.config.sliding_window == 8
    dyn, static, sta = pair(model)
    step_both(model, static, dyn, sta, [5, 6, 7])
    for rows in (1, 4, 1, 9, 2, 1):
        step_both(model, static, dyn, sta, [(11 * i + rows) % 97 for i in range(rows)])


def test_step_inputs_pad_layout() -> None:
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    inp = step_inputs(torch.tensor([[4, 5, 6]]), torch.tensor([[9, 10, 10]]), 9, tree, 4, None)
    assert inp.tokens.tolist() == [[4, 5, 6, 0]]
    assert inp.positions.tolist() == [[9, 10, 10, 10]]  # pad rows at the last real position
    assert inp.rows[:3, :3].equal(tree) and inp.rows[3].all()  # pads see every earlier row
    assert not inp.rows[:3, 3].any()  # no real row sees a pad row
    assert inp.floor.tolist() == [-1] * 4 and inp.start.tolist() == [9]


def test_static_model_refuses_what_it_does_not_run() -> None:
    model = tiny_pair("llama")[1]
    static = StaticModel(model)
    caps = static.capabilities
    assert not caps.layer_ranges and caps.input_embeddings and caps.exact_tree_keep
    assert static.config is model.config and static.device == model.device
    cache = static.new_cache(16)
    with pytest.raises(UnsupportedError, match="whole-model"):
        static(torch.tensor([[1]]), torch.tensor([[0]]), cache, layers=range(1))
    with pytest.raises(UnsupportedError, match="batch 1"):
        static.new_cache(16, batch=2)
    assert not static.graphs  # a CPU model: eager static steps


def test_input_embeddings_match_dynamic() -> None:
    """Rows fed as embeddings (parallel prompt decoding's prompt tokens) with a tree mask:
    the static step's logits equal the dynamic forward's, pad rows included in the bucket."""
    model = tiny_pair("llama")[1]
    dyn, static, sta = pair(model)
    step_both(model, static, dyn, sta, [3, 9, 4, 7, 1])
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, 5, model.config.hidden_size, generator=gen)
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                         [1, 0, 1, 0, 1]], dtype=torch.bool)
    pos = torch.tensor([[5, 6, 6, 7, 7]])
    a = model(None, pos, dyn, mask=tree, inputs_embeds=embeds, logits_at=slice(1, 4)).logits
    b = static(None, pos, sta, mask=tree, inputs_embeds=embeds, logits_at=slice(1, 4)).logits
    torch.testing.assert_close(b, a, **TOL)
    assert sta.length == dyn.length == 10
    step_both(model, static, dyn, sta, [2, 8])  # the next step sees the fed rows' keys
    with pytest.raises(ValueError, match="token ids or input embeddings"):
        static(None, pos, sta)


def test_compiled_steps_run_the_compiled_forward(monkeypatch) -> None:
    """`--static --compile`: the step that runs (and is captured) is torch.compile's; its
    profiles are kept apart. torch.compile stubbed here (inductor takes minutes on the CPU);
    the compiled numbers are checked by the CUDA test below."""
    compiled = []

    def fake_compile(fn, **kwargs):
        def run(*args):
            compiled.append(args[3].tokens.shape[1])
            return fn(*args)
        return run

    monkeypatch.setattr(static_step.torch, "compile", fake_compile)
    model = tiny_pair("llama")[1]
    dyn, static, sta = pair(model, compile=True)
    assert static.capabilities.backend == "torch --static --compile"
    assert model_kind(static, "fp32").endswith("-static-compiled")
    assert model_kind(StaticModel(model), "fp32").endswith("-static")
    step_both(model, static, dyn, sta, [3, 9, 4])
    step_both(model, static, dyn, sta, [5])
    assert compiled == [4, 1]


def test_warm_up_compiles_every_bucket_before_any_request() -> None:
    """The real inductor on the CPU: after `warm_up`, requests of any length and verify
    size compile nothing more (on an H200, a prefill bucket met first inside a timed run
    compiled for 28 s), and the compiled steps decode what the plain static ones do."""
    from torch._dynamo.utils import counters

    model = tiny_pair("llama")[1]
    options = dict(buckets=(1, 2, 4), round_to=64)
    compiled = StaticModel(model, StaticConfig(compile=True, **options))
    compiled.warm_up()
    graphs = counters["stats"]["unique_graphs"]
    plain = StaticModel(model, StaticConfig(**options))
    for prompt in ([5, 17, 42, 8, 9, 11] * 4, [3, 4, 5]):
        for static in (plain, compiled):
            spec = Speculative(static, NGramProposer(order=2), make_policy(2, None))
            assert greedy(spec, prompt, 12) == greedy(Autoregressive(plain), prompt, 12)
        assert greedy(Autoregressive(compiled), prompt, 12) == \
            greedy(Autoregressive(plain), prompt, 12)
    assert counters["stats"]["unique_graphs"] == graphs


def test_compile_needs_static() -> None:
    args = build_parser().parse_args(["generate", "hi", "--compile"])
    with pytest.raises(InvalidArgumentError, match="add --static"):
        static_option(args)
    args = build_parser().parse_args(["generate", "hi", "--static", "--compile"])
    assert static_option(args) == StaticConfig(compile=True)
    assert static_option(build_parser().parse_args(["generate", "hi", "--static"])) is True


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_compiled_graphs_match_eager_on_cuda(target) -> None:
    prompt = [5, 17, 42, 8, 9, 11, 5, 17, 42, 8, 30, 31]
    model = copy.deepcopy(target).to("cuda")  # the fixture stays on the CPU for the others
    reference = greedy(Autoregressive(StaticModel(model)), prompt, 24)
    compiled = StaticModel(model, StaticConfig(compile=True))
    assert greedy(Autoregressive(compiled), prompt, 24) == reference
    spec = Speculative(compiled, NGramProposer(order=2), make_policy(4, None))
    assert greedy(spec, prompt, 24) == reference


def greedy(strategy, prompt: list[int], max_new: int = 40) -> list[int]:
    config = GenerationConfig(max_new, SamplingConfig(), frozenset())
    return [t for s in strategy.generate(prompt, config) for t in s.tokens]


@pytest.fixture(scope="module")
def target():
    model = ours_from_hf(hf_model("llama", seed=0))
    with torch.no_grad():  # peakier distributions: greedy choices with clear margins
        model.lm_head.weight.mul_(8)
    return model


def test_greedy_generation_is_identical(target) -> None:
    prompt = [5, 17, 42, 8, 9, 11, 5, 17, 42, 8, 30, 31]
    static = StaticModel(target)
    reference = greedy(Autoregressive(target), prompt)
    assert greedy(Autoregressive(static), prompt) == reference
    for gamma in (2, 5):
        spec = Speculative(static, NGramProposer(order=2), make_policy(gamma, None))
        assert greedy(spec, prompt) == reference, gamma


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    return sharp_pair_folders(tmp_path_factory.mktemp("static"))


PROMPT = [5, 17, 42, 8, 9, 11, 5, 17]
EXACT = [("autoregressive", {}), ("speculative", {"gamma": 3}),
         ("speculative", {"draft": "ngram", "gamma": 3, "branches": 2}),
         ("staged", {"subdraft": "ngram", "gamma": 3})]


def engine_tokens(engine, method: str, options: dict, draft: Path) -> list[int]:
    if method in ("speculative", "staged") and "draft" not in options:
        options = {**options, "draft": str(draft)}
    return engine.generate(PROMPT, method=method, max_new_tokens=24, **options).token_ids


def exact_methods_agree(folders, device: str) -> None:
    target, draft = folders
    plain = draftsman.load(str(target), dtype="fp32", device="cpu", backend="torch")
    static = draftsman.load(str(target), dtype="fp32", device=device, static=True)
    assert static.backend == "torch" and isinstance(static.target.model, StaticModel)
    reference = engine_tokens(plain, "autoregressive", {}, draft)
    for method, options in EXACT:
        assert engine_tokens(static, method, options, draft) == reference, method
    assert isinstance(static.model(str(draft)).model, StaticModel)


def test_engine_static_flag(folders) -> None:
    exact_methods_agree(folders, "cpu")
    for command in (["generate", "hi"], ["serve"]):
        assert build_parser().parse_args(command + ["--static"]).static
        assert not build_parser().parse_args(command).static
    with pytest.raises(InvalidArgumentError, match="--static needs --backend torch"):
        draftsman.load(str(folders[0]), backend="llama.cpp", static=True)


def test_a_static_engine_refuses_early_exit_saying_how_to_run_it(folders) -> None:
    """On a GPU static steps are the default: a layer-range method loaded without being named
    is refused with the way out (found on an H200: the message said `--backend torch`, which
    the engine already was)."""
    engine = draftsman.load(str(folders[0]), dtype="fp32", device="cpu", static=True)
    with pytest.raises(UnsupportedError, match=r"--no-static.*methods="):
        engine.generate("hi", method="big-little", early_exit=1, max_new_tokens=4)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_graph_replay_equals_eager_step() -> None:
    model = tiny_pair("llama")[1].cuda()
    eager = StaticModel(model, StaticConfig(graphs=False))
    graphed = StaticModel(model)
    assert graphed.graphs
    a, b = eager.new_cache(160), graphed.new_cache(160)
    mask, depth = tree_mask()
    for rows in ([1, 2, 3, 4, 5], [6], [7, 8, 9], [10], [11], [12, 13, 14]):
        ids = torch.tensor([rows])
        pos = torch.arange(a.length, a.length + len(rows))[None]
        torch.testing.assert_close(graphed(ids, pos, b).logits, eager(ids, pos, a).logits,
                                   rtol=1e-5, atol=1e-5)
    start = a.length
    ids, pos = torch.tensor([[38, 46, 26, 43, 38, 32]]), (depth + start)[None]
    torch.testing.assert_close(graphed(ids, pos, b, mask=mask).logits,
                               eager(ids, pos, a, mask=mask).logits, rtol=1e-5, atol=1e-5)
    arena = graphed._arenas[0]
    assert set(arena.graphs) == {1, 4, 8}  # captured once per bucket, then replayed


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graphs_generate_what_the_cpu_does(folders) -> None:
    exact_methods_agree(folders, "cuda")


def test_static_steps_are_the_default_where_they_are_the_fast_path(folders) -> None:
    """`static=None` (the CLI's default): on for a CUDA device on torch when the methods run
    the whole model, off on the CPU (where they only cost) and for layer-range methods."""
    from draftsman.strategies.registry import runs_static

    assert runs_static([("default", {}), ("autoregressive", {}), ("speculative", {}),
                        ("big-little", {})])
    assert not runs_static([("autoregressive", {}), ("big-little", {"early_exit": 1})])
    assert not runs_static([("pipelined", {})])
    engine = draftsman.load(str(folders[0]), backend="torch", dtype="fp32", device="cpu")
    assert not engine.static and not isinstance(engine.target.model, StaticModel)
    for command in (["generate", "hi"], ["serve"], ["bench"]):
        assert build_parser().parse_args(command).static is None
        assert build_parser().parse_args(command + ["--no-static"]).static is False


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_a_gpu_gets_static_steps_unless_a_method_needs_layer_ranges(folders) -> None:
    on = draftsman.load(str(folders[0]), backend="torch", dtype="fp32", device="cuda")
    assert on.static and isinstance(on.target.model, StaticModel)
    off = draftsman.load(str(folders[0]), backend="torch", dtype="fp32", device="cuda",
                         methods=[("big-little", {"early_exit": 1})])
    assert not off.static and not isinstance(off.target.model, StaticModel)
