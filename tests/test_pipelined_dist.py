"""Pipelined decoding over torch.distributed: real processes, the real gloo transport.

Rank 0 is this test process; the workers are spawned processes (or, torchrun-style, a
`draftsman pipelined-worker` process joined through RANK / WORLD_SIZE / MASTER_*). Output
must equal autoregressive decoding with guesses really adopted; a stuck or killed worker must
end the request with a one-line-headed error within the timeout, never a hang.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_pipelined import confident_model, deadline, prompts, reference, run

import draftsman
from draftsman.sampling import SamplingConfig
from draftsman.strategies.pipelined import Pipelined, PipelinedConfig, close_pools
from draftsman.strategies.pipelined_worker import PipelinedWorkerError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model():
    yield confident_model()
    close_pools()


@pytest.mark.parametrize("workers", [1, 2])
def test_greedy_equals_autoregressive_with_guesses_adopted(model, workers: int) -> None:
    with deadline(120):
        strat = Pipelined(model, PipelinedConfig(workers=workers, transport="distributed",
                                                 timeout=30))
        adopted = 0
        for prompt in prompts():
            out, steps = run(strat, prompt)
            assert out == reference(model, prompt)
            adopted += sum(s.accepted for s in steps)
        assert adopted > 10  # the workers' passes were used, not just the main worker's
        close_pools()


def test_seeded_sampling_draws_what_autoregressive_draws(model) -> None:
    sampling = SamplingConfig(temperature=0.9, top_k=20, seed=7)
    with deadline(120):
        strat = Pipelined(model, PipelinedConfig(workers=2, transport="distributed",
                                                 timeout=30))
        prompt = prompts()[2]
        assert run(strat, prompt, sampling=sampling)[0] == reference(model, prompt,
                                                                     sampling=sampling)
        close_pools()


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_lost_worker_is_a_clear_error_not_a_hang(model, how: str) -> None:
    with deadline(120):
        strat = Pipelined(model, PipelinedConfig(workers=1, transport="distributed",
                                                 timeout=4))
        run(strat, prompts()[0])  # the pool works
        pid = strat.pool.pids[0]
        os.kill(pid, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(PipelinedWorkerError, match="sub-worker rank 1") as info:
            run(strat, prompts()[1])
        assert time.monotonic() - t0 < 30
        assert str(info.value).splitlines()[0].endswith("was aborted") or "is gone" in str(
            info.value)
        if how == "stopped":
            assert "sent nothing for 4 s" in str(info.value)
        assert not any(p.is_alive() for p in strat.pool.processes)
        close_pools()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_style_worker_command(tmp_path: Path, monkeypatch) -> None:
    from test_align import sharp_pair_folders

    target, _ = sharp_pair_folders(tmp_path)
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    worker = subprocess.Popen(
        [sys.executable, "-m", "draftsman", "pipelined-worker", "--target", str(target),
         "--dtype", "fp32", "--device", "cpu", "--timeout", "60"],
        env={**os.environ, **env, "RANK": "1", "PYTHONPATH": str(ROOT / "src")},
        stderr=subprocess.PIPE, text=True)
    try:
        with deadline(180):
            for key, value in {**env, "RANK": "0"}.items():
                monkeypatch.setenv(key, value)
            engine = draftsman.load(str(target), dtype="fp32", device="cpu")
            prompt = [5, 17, 42, 8, 9, 11, 5, 17]
            reference_ids = engine.generate(prompt, method="autoregressive",
                                            max_new_tokens=16).token_ids
            got = engine.generate(prompt, method="pipelined", max_new_tokens=16,
                                  transport="distributed", workers=1, exit_layer=None)
            assert got.token_ids == reference_ids
            close_pools()
            assert worker.wait(30) == 0, worker.stderr.read()
    finally:
        worker.kill()


def test_worker_command_refuses_without_torchrun_variables(capsys, monkeypatch) -> None:
    from draftsman.cli.main import main

    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert main(["pipelined-worker", "--target", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RANK and WORLD_SIZE" in err[0]
