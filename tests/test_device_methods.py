"""Methods on a device: parallel prompt decoding keeps its tensors on the model's device and
commits exactly what autoregressive decoding does there; speculative sampling's rule runs
on tensors and draws what the per-token rule drew. CPU always; CUDA marked `gpu`."""

from __future__ import annotations

import pytest
import torch
from devices import devices
from test_parallel_prompt import PROMPT, SHAPES, run, sharp_model
from tiny import tiny_pair

from draftsman.core import GenerationConfig
from draftsman.models.prompt_tokens import PromptTokens
from draftsman.models.static_step import StaticModel
from draftsman.proposers.draft_model import DraftModelProposer
from draftsman.sampling import Sampler, SamplingConfig
from draftsman.state import ModelState
from draftsman.strategies.autoregressive import Autoregressive
from draftsman.strategies.parallel_prompt import ParallelPrompt
from draftsman.trees.layout import TreeSpec, layout
from draftsman.verification.chain import Verdict, verify_sampling
from draftsman.verification.prompt_tree import TreeDecoder


def test_layout_moves_whole() -> None:
    lay = layout(TreeSpec.build([((), 2), ((0,), 1), ((1,), 0)]), 2, prefix=3)
    assert lay.to(torch.device("cpu")) is lay
    meta = lay.to(torch.device("meta"))
    assert meta.mask.device.type == "meta" and meta.prompt_rows.device.type == "meta"
    assert meta.spec == lay.spec and meta.prefix == 3 and meta.offsets.shape == lay.offsets.shape


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", ["chain", "dynamic-24", "random-20"])
def test_parallel_prompt_exact_on_the_device(device: str, shape: str) -> None:
    model = sharp_model()
    ref = run(Autoregressive(model), n=24)
    model = model.to(device)
    prompts = PromptTokens.from_vocabulary(model, 3, 1, seed=1)
    assert prompts.embeddings.device.type == "cpu"  # a host object; the decoder moves it
    decoder = TreeDecoder(model, prompts, SHAPES[shape](3))
    assert decoder.embeds.device.type == device
    assert run(ParallelPrompt(decoder), n=24) == ref
    cache = model.new_cache(64)
    out = decoder.step(cache, [5, 17, 3], None)
    assert out.guesses is not None and out.guesses.device.type == device
    assert all(isinstance(t, int) for t in [*out.accepted, out.next_token])


@pytest.mark.parametrize("device", devices())
def test_parallel_prompt_exact_on_static_steps(device: str) -> None:
    """Prompt-token embeddings fed through `--static` steps (CUDA graphs on a GPU): on the
    H200 parallel prompt decoding ran the eager path at 83 ms/token, the static path not
    taking input embeddings."""
    model = sharp_model()
    ref = run(Autoregressive(model), n=24)
    static = StaticModel(model.to(device))
    assert static.capabilities.input_embeddings
    prompts = PromptTokens.from_vocabulary(static, 3, 1, seed=1)
    assert run(ParallelPrompt(TreeDecoder(static, prompts, SHAPES["dynamic-24"](3))),
               n=24) == ref


@pytest.mark.parametrize("device", devices())
def test_parallel_prompt_sampling_reproducible_on_the_device(device: str) -> None:
    model = sharp_model().to(device)
    prompts = PromptTokens.from_vocabulary(model, 3, 1, seed=1)
    strategy = ParallelPrompt(TreeDecoder(model, prompts, SHAPES["dynamic-8"](3)))
    runs = [run(strategy, n=20, temperature=0.8, seed=3) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 20


def _per_token_rule(drafts, q, p, sampler) -> Verdict:
    """The rule as written before it ran on tensors: the reference for seeded draws."""
    gamma = len(drafts)
    if gamma:
        rows, idx = torch.arange(gamma), torch.tensor(drafts)
        q_x = q[rows, idx] if q is not None else torch.ones(gamma)
        rejected = (sampler.uniform(gamma) * q_x >= p[rows, idx]).nonzero()
        if rejected.numel():
            n = int(rejected[0, 0])
            if q is not None:
                residual = (p[n] - q[n]).clamp_min(0)
            else:
                residual = p[n].clone()
                residual[drafts[n]] = 0.0
            total = residual.sum()
            return Verdict(n, sampler.draw(residual / total if total > 0 else p[n]), True)
    return Verdict(gamma, sampler.draw(p[gamma]), False)


@pytest.mark.parametrize("one_hot_q", [False, True])
def test_tensor_rule_draws_what_the_per_token_rule_did(one_hot_q: bool) -> None:
    g = torch.Generator().manual_seed(0)
    verdicts = set()
    for trial in range(300):
        gamma = trial % 5
        p = torch.softmax(torch.randn(gamma + 1, 7, generator=g) * 2, -1)
        q = None if one_hot_q else torch.softmax(torch.randn(gamma, 7, generator=g) * 2, -1)
        if q is not None and trial % 7 == 0:
            q[:] = p[:gamma]  # p == q: nothing is ever rejected
        drafts = torch.randint(0, 7, (gamma,), generator=g).tolist()
        got = verify_sampling(drafts, q, p, Sampler(SamplingConfig(1.0, seed=trial)))
        want = _per_token_rule(drafts, q, p, Sampler(SamplingConfig(1.0, seed=trial)))
        assert got == want
        verdicts.add((got.accepted == gamma, got.rejected))
    assert verdicts == {(True, False), (False, True)}  # both outcomes were exercised


@pytest.mark.parametrize("device", devices())
def test_tensor_rule_is_seeded_per_device(device: str) -> None:
    p = torch.softmax(torch.randn(4, 11, generator=torch.Generator().manual_seed(1)), -1)
    q = torch.softmax(torch.randn(3, 11, generator=torch.Generator().manual_seed(2)), -1)
    p, q = p.to(device), q.to(device)
    runs = [[verify_sampling([1, 2, 3], q, p, Sampler(SamplingConfig(1.0, seed=s)))
             for s in range(20)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert all(0 <= v.accepted <= 3 and 0 <= v.next_token < 11 for v in runs[0])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_draft_on_the_device_drafts_what_the_host_loop_did(device: str,
                                                           temperature: float) -> None:
    # stop_below=0.0 takes the host loop (a threshold is read per token) and never stops
    _, model = tiny_pair("llama", seed=2)
    model = model.to(device)
    committed = [5, 17, 3, 44, 12]
    got = []
    for stop_below in (None, 0.0):
        proposer = DraftModelProposer(model)
        proposer.start(committed, 64)
        sampler = Sampler(SamplingConfig(temperature, seed=4))
        first = proposer.propose(committed, 4, sampler, stop_below)
        proposer.commit(committed + first.tokens[:2])
        second = proposer.propose(committed + first.tokens[:2] + [9], 3, sampler, stop_below)
        assert proposer.state.unread == 0 and first.forwards == 4 and second.forwards == 3
        got.append((first, second))
    (a1, a2), (b1, b2) = got
    assert a1.tokens == b1.tokens and a2.tokens == b2.tokens
    if temperature:
        torch.testing.assert_close(a1.q, b1.q)
        torch.testing.assert_close(a2.q, b2.q)
    state = ModelState(model, 16)
    state.feed([1, 2])
    state.feed_unread(torch.tensor([3], device=device))
    with pytest.raises(RuntimeError, match="not settled"):
        state.sync([1, 2, 3])
    state.settle([3])
    assert state.sync([1, 2, 3, 4]) == [4] and state.cache.length == 3


def steps_of(strategy, n: int, eos: frozenset[int] = frozenset(), **sampling) -> list:
    config = GenerationConfig(n, SamplingConfig(**sampling), eos)
    return list(strategy.generate(PROMPT, config))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 5}])
def test_ahead_decodes_what_one_sync_per_token_does(device: str, sampling: dict) -> None:
    """The host one step ahead of the device (the default on a GPU) commits the same tokens
    and finish as the loop that reads each token before queuing the next step, by count
    and at EOS, where the one step queued past it is counted."""
    model = sharp_model().to(device)
    sync, ahead = Autoregressive(model, ahead=False), Autoregressive(model, ahead=True)
    assert Autoregressive(model).ahead == (device != "cpu")
    ref = steps_of(sync, 24, **sampling)
    assert [s.tokens for s in steps_of(ahead, 24, **sampling)] == [s.tokens for s in ref]
    assert steps_of(ahead, 24, **sampling)[-1].finish == "length"
    eos = frozenset({ref[10].tokens[0]})  # a token first met at step 10 or before
    stopped_ref, stopped = steps_of(sync, 24, eos, **sampling), steps_of(ahead, 24, eos,
                                                                        **sampling)
    assert [s.tokens for s in stopped] == [s.tokens for s in stopped_ref]
    assert stopped[-1].finish == stopped_ref[-1].finish == "eos"
    assert sum(s.target_forwards for s in stopped) == len(stopped) + 1


def test_ahead_queues_the_next_step_before_reading_a_token(monkeypatch) -> None:
    """What makes `ahead` pay: the forward that feeds token t is queued before the host
    waits for token t, and none is queued past the last token a budget allows."""
    from draftsman.strategies import autoregressive

    events: list[str] = []
    feed_unread, get = ModelState.feed_unread, autoregressive.HostRead.get
    monkeypatch.setattr(ModelState, "feed_unread",
                        lambda self, *a, **k: events.append("queue") or feed_unread(self, *a, **k))
    monkeypatch.setattr(autoregressive.HostRead, "get",
                        lambda self: events.append("read") or get(self))
    steps_of(Autoregressive(sharp_model(), ahead=True), 4)
    assert events == ["queue", "read"] * 3 + ["read"]
