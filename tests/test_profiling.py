"""Forward-cost profiles measure only the lengths a caller reads, once."""

from __future__ import annotations

import pytest
import torch

from draftsman import profiling
from draftsman.kernels.native import kquant_available


@pytest.fixture
def measured(monkeypatch, tmp_path) -> list[list[int]]:
    """Every measure_latency call's lengths; a fake forward costs 1 + n/10 ms."""
    calls: list[list[int]] = []

    def fake(model, lengths, context=256, repeats=3, warmup=1):
        calls.append(list(lengths))
        return {n: 1e-3 * (1 + n / 10) for n in lengths}

    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path))
    monkeypatch.setenv("DRAFTSMAN_PROFILES", str(tmp_path / "profiles"))
    monkeypatch.setattr(profiling, "measure_latency", fake)
    monkeypatch.setattr(profiling, "engine_kind", lambda engine: "fp32")
    return calls


def test_a_single_request_measures_to_16_rows_and_a_batch_adds_the_rest(measured):
    assert profiling.wanted_lengths(5) == (1, 2, 3, 4, 6, 8, 12, 16)
    assert profiling.wanted_lengths(40)[-1] == 48 and profiling.wanted_lengths(999)[-1] == 64
    one = profiling.latency_profile(None, "m", None, rows=5)
    assert measured == [[1, 2, 3, 4, 6, 8, 12, 16]] and max(one) == 16
    profiling.latency_profile(None, "m", None, rows=16)  # cached: nothing measured again
    assert len(measured) == 1
    many = profiling.latency_profile(None, "m", None, rows=64)
    assert measured[1] == [17, 24, 32, 33, 48, 64]  # only what the first run did not measure
    assert many == {n: pytest.approx(1e-3 * (1 + n / 10)) for n in profiling.PROFILE_LENGTHS}
    profiling.latency_profile(None, "m", None, rows=64)
    assert len(measured) == 2  # the merged file is read back whole


def test_processes_starting_together_measure_one_at_a_time(measured, monkeypatch):
    """Two servers started together must not time each other's forwards into their saved
    curves: the second waits for the first's measurement and reads it."""
    import threading
    import time

    slow = profiling.measure_latency

    def measuring(*args, **kwargs):
        time.sleep(0.2)  # long enough for the other thread to arrive meanwhile
        return slow(*args, **kwargs)

    monkeypatch.setattr(profiling, "measure_latency", measuring)
    got: list[dict[int, float]] = []
    threads = [threading.Thread(target=lambda: got.append(
        profiling.latency_profile(None, "m", None, rows=4))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(measured) == 1 and got[0] == got[1]


def test_a_profile_that_covers_the_rows_is_kept(measured):
    path = profiling.profile_path("m", "fp32", profiling.torch.get_num_threads())
    profiling.save_profile(path, {1: 0.01, 4: 0.02, 32: 0.05}, {"model": "m"})
    assert profiling.latency_profile(None, "m", None, rows=16) == {1: 0.01, 4: 0.02, 32: 0.05}
    assert measured == []
    profiling.latency_profile(None, "m", None, rows=64)
    assert measured == [[33, 48, 64]]


def test_a_profile_measured_on_other_kernels_is_measured_again(measured):
    """A changed kernel changes the curve: a profile records the kernels' build and is
    stale under another one (the theory command still reads it, `any_build`)."""
    path = profiling.profile_path("m", "fp32", profiling.torch.get_num_threads())
    profiling.save_profile(path, {n: 0.5 for n in profiling.wanted_lengths(16)}, {"model": "m"})
    data = profiling.json.loads(path.read_text())
    assert data["kernels"] == profiling.build_key()
    path.write_text(profiling.json.dumps({**data, "kernels": "0123456789ab"}))
    assert profiling.load_profile(path) is None
    assert profiling.load_profile(path, any_build=True)[1] == 0.5
    assert profiling.latency_profile(None, "m", None, rows=16)[1] == pytest.approx(1.1e-3)
    assert measured == [list(profiling.wanted_lengths(16))]


class _ClockedModel:
    """A fake model whose forward advances a fake clock by 1 + n/10 ms, plus 5 ms on the
    calls in `slow` (a slow spell of the machine, counted in forwards)."""

    def __init__(self, clock: list[float], slow: range) -> None:
        self.config = type("Config", (), {"vocab_size": 50})()
        self.clock, self.slow, self.calls = clock, slow, []

    def new_cache(self, capacity: int):
        return type("Cache", (), {"truncate": lambda self, n: None})()

    def __call__(self, tokens, positions, cache, mask=None):
        n = tokens.shape[1]
        self.calls.append(n)
        self.clock[0] += 1e-3 * (1 + n / 10) + (5e-3 if len(self.calls) - 1 in self.slow
                                                else 0.0)


def test_latency_is_timed_in_rounds_after_every_length_is_warm(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: clock[0])
    # calls: 1 prefill, 3 warm-ups, then rounds; a spell over three consecutive forwards
    model = _ClockedModel(clock, slow=range(5, 8))
    latency = profiling.measure_latency(model, [1, 4, 16], context=8, repeats=5)
    assert model.calls[:4] == [8, 1, 4, 16]  # every length warm before any is timed
    assert model.calls[4:] == [1, 4, 16] * 5  # then one of each per round
    # one slow forward per length at most: the medians keep the true costs (one after
    # another, 4 rows would have taken all three slow calls and reported 6.4 ms)
    assert latency == {n: pytest.approx(1e-3 * (1 + n / 10)) for n in (1, 4, 16)}


def test_profiles_go_where_draftsman_profiles_says_else_under_the_home(monkeypatch, tmp_path):
    """The suite keeps its own profiles (conftest): curves measured under its load must never
    replace the ones a user's cost model reads from the store."""
    from draftsman.profiling import profile_path
    from draftsman.store.home import draftsman_home

    assert not str(profile_path("m", "q4", 2)).startswith(str(draftsman_home() / "profiles"))
    monkeypatch.setenv("DRAFTSMAN_PROFILES", str(tmp_path / "mine"))
    assert profile_path("a/qwen", "q4", 2) == tmp_path / "mine" / "qwen-q4-t2.json"
    monkeypatch.delenv("DRAFTSMAN_PROFILES")
    monkeypatch.setenv("DRAFTSMAN_HOME", str(tmp_path / "home"))
    assert profile_path("qwen", "bf16", 1) == tmp_path / "home" / "profiles" / "qwen-bf16-t1.json"


@pytest.mark.skipif(not kquant_available(), reason="the native kernels do not load here")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_memory_probe_reads_every_word_of_its_buffer(threads):
    """stream_read's wrapping sum of 64-bit words is torch's, every word counted once over the
    threads' shares (a length no share count divides), and a flipped bit changes it."""
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.randint(0, 256, ((1 << 20) + 24,), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(3))
        read = torch.ops.draftsman.stream_read
        assert read(buf).item() == buf.view(torch.int64).sum().item()
        before = read(buf).item()
        buf[-1] ^= 1  # in the last word, past every share's whole 8 words
        assert read(buf).item() != before
        with pytest.raises(RuntimeError, match="whole 8-byte words"):
            read(buf[:13])
        assert profiling.memory_stream_gbs(mib=4, repeats=1) > 0
    finally:
        torch.set_num_threads(was)


def test_the_memory_probe_is_none_without_the_kernels(monkeypatch):
    monkeypatch.setattr(profiling, "kquant_available", lambda: False)
    assert profiling.memory_stream_gbs(mib=1) is None


def test_round_ratios_pair_each_rounds_forwards():
    rounds = {1: [10.0, 20.0, 10.0], 16: [13.0, 24.0, 14.0]}
    assert profiling.round_ratios(rounds, 1) == {1: [1.0, 1.0, 1.0], 16: [1.3, 1.2, 1.4]}


def test_measure_rounds_times_every_length_once_a_round():
    """One forward of each length per round, in the lengths' order, the medians being
    measure_latency's figures."""
    calls: list[int] = []

    class Model:
        config = type("Config", (), {"vocab_size": 50})

        def new_cache(self, size):
            return type("Cache", (), {"truncate": lambda self, n: None})()

        def __call__(self, tokens, pos, cache, mask=None):
            calls.append(tokens.shape[1])

    rounds = profiling.measure_rounds(Model(), [1, 4], context=8, repeats=3, warmup=1)
    assert calls == [8, 1, 4, 1, 4, 1, 4, 1, 4]  # the context, the warm-up, 3 rounds
    assert {n: len(t) for n, t in rounds.items()} == {1: 3, 4: 3}


def test_greedy_rounds_read_each_forwards_tokens_and_the_cli_refuses_without_them(monkeypatch):
    """`draftsman profile --greedy` times forwards that give greedy tokens, read back as a
    greedy verify reads them; a backend that does not declare greedy_head is refused."""
    asked = []

    class Tokens:
        def __init__(self, n: int) -> None:
            self.n = n

        def tolist(self) -> list[int]:
            asked.append(self.n)
            return [0] * self.n

    class GreedyModel(_ClockedModel):
        def __call__(self, tokens, positions, cache, mask=None, greedy=False):
            super().__call__(tokens, positions, cache, mask)
            return type("Out", (), {"tokens": Tokens(tokens.shape[1]) if greedy else None})()

    model = GreedyModel([0.0], slow=range(0))
    profiling.measure_rounds(model, [1, 4], context=8, repeats=2, greedy=True)
    assert asked == [1, 4] * 3  # the warm-ups and both rounds, each read

    from draftsman.cli import profile_cmd
    from draftsman.errors import InvalidArgumentError
    from draftsman.models.protocol import Capabilities

    caps = Capabilities(backend="llama.cpp", layer_ranges=False, input_embeddings=False,
                        hidden_states=False, exact_tree_keep=False, max_tree_rows=None,
                        device="cpu", numerics="q4_k")
    bundle = type("Bundle", (), {"model": type("M", (), {"capabilities": caps})()})()
    monkeypatch.setattr(profile_cmd, "load_bundle", lambda *a, **k: bundle)
    args = profile_cmd.argparse.Namespace(threads=None, lengths="1,2", target="t", dtype="q4",
                                          backend="llama.cpp", numerics=None, device=None,
                                          static=False, compile=False, greedy=True)
    monkeypatch.setattr(profile_cmd, "static_option", lambda a: False)
    with pytest.raises(InvalidArgumentError, match="greedy_head"):
        profile_cmd.run(args)
