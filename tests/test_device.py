"""`--device`: the resolver, the flag on every command, and the CPU path left as it was.

The CUDA cases are marked `gpu` and skip where torch sees no GPU (`make test-gpu` runs them
on a GPU machine); the resolver's GPU branches are tested here with torch.cuda patched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from devices import devices
from test_align import sharp_pair_folders

import draftsman
from draftsman.cli.main import build_parser, main
from draftsman.device import resolve_device
from draftsman.engine import pick_device
from draftsman.errors import DeviceError, UnsupportedError
from draftsman.sampling import Sampler, SamplingConfig, inverse_cdf_draw

CUDA = torch.cuda.is_available()


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Pretend this machine has `n` CUDA devices (0: none, is_available False)."""
    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return set_count


def test_resolver_without_cuda(gpus) -> None:
    gpus(0)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("CPU") == torch.device("cpu")
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(DeviceError) as info:
            resolve_device(spec)
        assert str(info.value) == (f"--device {spec}: no CUDA device here "
                                   "(torch.cuda.is_available() is False)")
    for spec in ("gpu", "cuda:", "cuda:x", "cuda:-1", "mps"):
        with pytest.raises(DeviceError, match="auto, cpu, cuda or cuda:N"):
            resolve_device(spec)


def test_resolver_with_two_gpus(gpus) -> None:
    gpus(2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError) as info:
        resolve_device("cuda:2")
    assert str(info.value) == "--device cuda:2: this machine has 2 CUDA device(s), " \
                              "cuda:0 to cuda:1"


def test_cpu_only_callers(gpus) -> None:
    gpus(1)
    # llama.cpp and int8 run on the CPU: auto means the CPU, an explicit GPU is refused
    assert pick_device("auto", "llama.cpp") == torch.device("cpu")
    assert pick_device("auto", "torch", "int8") == torch.device("cpu")
    assert pick_device("auto", "torch", "bf16") == torch.device("cuda", 0)
    with pytest.raises(UnsupportedError, match="--device cuda: --backend llama.cpp"):
        pick_device("cuda", "llama.cpp")
    with pytest.raises(UnsupportedError, match="int8 runs on the CPU"):
        pick_device("cuda:0", "torch", "int8")
    gpus(0)  # a GPU that is not there is that error first
    with pytest.raises(DeviceError, match="no CUDA device"):
        pick_device("cuda", "llama.cpp")


COMMANDS = [
    ["generate", "hi"], ["serve"], ["bench"], ["profile"],
    ["analyze", "match-rate"], ["analyze", "pipelined-latency"], ["analyze", "parallel-prompt"],
    ["train", "align", "--out", "x"], ["train", "exit-head", "--layer", "1"],
    ["train", "prompt-tokens"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_takes_device(argv: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(argv).device == "auto"
    assert parser.parse_args([*argv, "--device", "cuda:1"]).device == "cuda:1"


@pytest.mark.parametrize("argv", [["generate", "--target", "no-such-model", "hi"],
                                  ["profile", "--target", "no-such-model"],
                                  ["train", "exit-head", "--model", "no-such-model",
                                   "--layer", "1"]], ids=lambda a: a[0])
def test_missing_cuda_is_one_line_before_any_model(argv: list[str], gpus, capsys) -> None:
    gpus(0)
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["draftsman: error: --device cuda: no CUDA device here "
                   "(torch.cuda.is_available() is False)"]


def test_training_accepts_a_gpu(gpus, capsys) -> None:
    # a GPU that is there passes the device check: the run gets as far as the model
    gpus(1)
    assert main(["train", "exit-head", "--model", "no-such-model", "--layer", "1",
                 "--device", "cuda"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_cpu_sampler_draws_from_its_seeded_generator() -> None:
    # The CPU generator is seeded as before devices existed and gives one uniform a draw
    # (inverse_cdf_draw; torch.multinomial before: 2.7 ms a 151,936-token draw), then the
    # verify's uniforms, in order.
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=7))
    probs = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0)), -1)
    reference = torch.Generator().manual_seed(7)
    assert [sampler.draw(probs) for _ in range(20)] == [
        int(inverse_cdf_draw(probs, torch.rand((), generator=reference))) for _ in range(20)]
    assert torch.equal(sampler.uniform(5), torch.rand(5, generator=reference))
    assert sampler.uniform(3, device=torch.device("cpu")).device.type == "cpu"


# ------------------------------------------------------------------ tiny models end to end


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    return sharp_pair_folders(tmp_path_factory.mktemp("device"))


PROMPT = [5, 17, 42, 8, 9, 11, 5, 17]
EXACT = [("autoregressive", {}), ("speculative", {"gamma": 3}),
         ("speculative", {"draft": "prompt-lookup", "gamma": 3}),
         ("speculative", {"draft": "ngram", "gamma": 3, "branches": 2}),
         ("staged", {"subdraft": "ngram", "gamma": 3})]


def _tokens(engine: draftsman.Engine, method: str, options: dict, draft: Path, **kw) -> list:
    if method in ("speculative", "staged") and "draft" not in options:
        options = {**options, "draft": str(draft)}
    return engine.generate(PROMPT, method=method, max_new_tokens=24, **options, **kw).token_ids


def test_cpu_device_is_the_default_path_here(folders) -> None:
    target, draft = folders
    if CUDA:
        pytest.skip("auto is the GPU on this machine")
    auto = draftsman.load(str(target), dtype="fp32")
    cpu = draftsman.load(str(target), dtype="fp32", device="cpu")
    assert auto.device == cpu.device == torch.device("cpu")
    assert auto.target.model.device == torch.device("cpu")
    reference = _tokens(cpu, "autoregressive", {}, draft)
    for method, options in EXACT:
        assert _tokens(auto, method, options, draft) == reference, method


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_generates_what_the_cpu_does(folders) -> None:
    target, draft = folders
    cpu = draftsman.load(str(target), dtype="fp32", device="cpu")
    gpu = draftsman.load(str(target), dtype="fp32", device="cuda")
    assert gpu.target.model.device.type == "cuda"
    reference = _tokens(cpu, "autoregressive", {}, draft)
    for method, options in EXACT:
        assert _tokens(gpu, method, options, draft) == reference, method
    assert gpu.model(str(draft)).model.device.type == "cuda"
    # sampling draws on the GPU with its own seeded generator: reproducible there. A draw
    # may end at EOS (first run on an H200: 12 tokens), so the length alone proves nothing
    runs = [gpu.generate(PROMPT, method="speculative", max_new_tokens=24, draft=str(draft),
                         gamma=3, temperature=0.8, seed=5) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].finish_reason == ("length" if len(runs[0].token_ids) == 24 else "eos")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("options", [{"fallback": 0.5}, {"early_exit": 1}],
                         ids=["two-models", "early-exit"])
def test_big_little_on_the_device_decodes_what_the_cpu_does(folders, device: str,
                                                            options: dict) -> None:
    # found on the first H200 run: the rollback distance gathered with a host index
    target, draft = folders
    runs = []
    kw = options if "early_exit" in options else {**options, "draft": str(draft)}
    for where in ("cpu", device):
        # named, so that a GPU loads what early exit needs rather than static steps
        engine = draftsman.load(str(target), dtype="fp32", device=where,
                                methods=[("big-little", kw)])
        runs.append(engine.generate(PROMPT, method="big-little", max_new_tokens=24,
                                    **kw).token_ids)
    assert runs[0] == runs[1] and len(runs[0]) > 0


def cudnn_attention_ops(run) -> list[str]:
    """The cuDNN attention ops and kernels the profiler saw while `run()` ran on CUDA."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages()
            if "cudnn" in e.key.lower() and ("sdpa" in e.key.lower() or "attention" in e.key)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_growing_forwards_keep_attention_off_cudnn() -> None:
    """cuDNN's SDPA builds a plan per key length, and a dynamic decode meets a new length every
    token: on an H200 our eager AR took 77 ms a token in the benchmark over a 20-28 ms
    forward. The control is the same SDPA call left to PyTorch's choice (cuDNN where this
    GPU and build prefer it); ours must not take cuDNN whichever way the control goes."""
    from tiny import tiny_pair

    model = tiny_pair("llama")[1].to("cuda", torch.bfloat16)
    cache = model.new_cache(64)
    model(torch.arange(1, 9)[None], torch.arange(8)[None], cache)

    def decode() -> None:
        for at in range(8, 12):
            model(torch.tensor([[at]]), torch.tensor([[at]]), cache)

    q = torch.randn(1, 12, 1, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 40, 128, device="cuda", dtype=torch.bfloat16)
    control = cudnn_attention_ops(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, kv, kv, enable_gqa=True))
    print(f"PyTorch's own choice took cuDNN: {bool(control)}")
    assert cudnn_attention_ops(decode) == []
