"""The llama.cpp backend on the embedded GGUF models (SmolLM2 and the default Qwen pair).

Exactness here is measured against this backend's own autoregressive output: llama.cpp's
quantised kernels are not our bf16 ones, so the reference is llama.cpp decoding one token at
a time on the same GGUF. Bitwise mode must equal it on every prompt; fast mode (one batch per
verify) wherever the target's top-2 logit margin exceeds MARGIN_BOUND.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import draftsman
from draftsman.backends.llama_cpp import (
    LlamaCppLM,
    amx_kernels_built,
    exact_rows,
    install_dir,
    numerics_key,
    repack,
)
from draftsman.bench.contestants import Sampling
from draftsman.bench.peer_llama_cpp import LOOKUP_BINARY, LlamaCppLookupPeer, LlamaCppPlainPeer
from draftsman.engine import LoadedModel
from draftsman.errors import UnsupportedError
from draftsman.hardware import cpu_flags
from draftsman.models.base import LAST
from draftsman.profiling import measure_latency
from draftsman.store.resolve import ensure_model, resolve_gguf

pytestmark = pytest.mark.real

SMOL = "smollm2-135m-instruct"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, with a docstring.",
           "List three uses of a hash map and explain each in one sentence."]


@pytest.fixture(scope="module")
def smol():
    ensure_model(SMOL)
    return draftsman.load(SMOL, backend="llama.cpp", numerics="bitwise")


def skip_layers_gguf(src, dst, first: int, last: int) -> int:
    """Write a copy of GGUF `src` that keeps only its first `first` and last `last` blocks
    (renumbered), every other tensor and all metadata as they are: a layer-skipping draft of
    the same model (self-speculative decoding), a different network that agrees with the
    full one often but not always. Returns the number of blocks kept."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    total = reader.fields[f"{arch}.block_count"].contents()
    blocks = {old: new for new, old in enumerate(
        list(range(first)) + list(range(total - last, total)))}
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = len(blocks) if field.name == f"{arch}.block_count" else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    kept = []
    for t in reader.tensors:
        name = t.name
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            if int(index) not in blocks:
                continue
            name = f"blk.{blocks[int(index)]}.{rest}"
        kept.append((name, t))
    for name, t in kept:
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    return len(blocks)


SMOL_DRAFT = "smollm2-135m-skip-middle-6 (test)"


@pytest.fixture(scope="module")
def smol_draft(smol, tmp_path_factory):
    """A real draft for SmolLM2-135M, which has no smaller sibling in the catalogue: the
    model without its 6 middle blocks (24 of 30), on llama.cpp. Greedy, it agrees with the
    full model on roughly a third of the guesses on PROMPTS, so the accept and the reject
    paths both run. Registered on the engine under SMOL_DRAFT."""
    path = tmp_path_factory.mktemp("draft") / "smollm2-skip.gguf"
    layers = skip_layers_gguf(str(resolve_gguf(SMOL)), str(path), 12, 12)
    config = dataclasses.replace(smol.target.config, num_layers=layers)
    model = LlamaCppLM(str(path), config, numerics="bitwise")
    smol._models[SMOL_DRAFT] = LoadedModel(SMOL_DRAFT, smol.target.folder, model,
                                           smol.target.tokenizer)
    return SMOL_DRAFT


@pytest.fixture(scope="module")
def pair():
    ensure_model(TARGET)
    ensure_model(DRAFT)
    return draftsman.load(TARGET, draft=DRAFT, backend="llama.cpp", numerics="bitwise")


@pytest.fixture(scope="module")
def fast_pair():
    ensure_model(TARGET)
    ensure_model(DRAFT)
    return draftsman.load(TARGET, draft=DRAFT, backend="llama.cpp")


def test_model_follows_the_forward_contract(smol):
    model = smol.target.model
    assert isinstance(model, LlamaCppLM) and model.n_vocab == model.config.vocab_size
    ids = smol.encode_prompt(PROMPTS[0])
    cache = model.new_cache(len(ids) + 16)
    t = torch.tensor([ids])
    full = model(t, torch.arange(len(ids))[None], cache).logits  # [1, T, V]
    assert full.shape == (1, len(ids), model.n_vocab) and cache.length == len(ids)
    # rollback: drop the last 5 positions, feed them again, logits at the last row agree
    cache.truncate(len(ids) - 5)
    again = model(t[:, -5:], torch.arange(len(ids) - 5, len(ids))[None], cache,
                  logits_at=LAST).logits
    assert again.shape == (1, 1, model.n_vocab)
    assert torch.allclose(again[0, 0], full[0, -1], atol=1e-2, rtol=1e-3)
    assert int(again[0, 0].argmax()) == int(full[0, -1].argmax())
    # logits at chosen rows only, in the order asked for
    cache.truncate(len(ids) - 3)
    rows = model(t[:, -3:], torch.arange(len(ids) - 3, len(ids))[None], cache,
                 logits_at=torch.tensor([2, 0])).logits
    assert rows.shape == (1, 2, model.n_vocab)
    assert int(rows[0, 0].argmax()) == int(full[0, -1].argmax())
    assert int(rows[0, 1].argmax()) == int(full[0, -3].argmax())


def test_rows_are_batch_invariant_past_512_cached_tokens(smol):
    """Logits of a token must not depend on how many rows share its forward, also once the
    cache holds 512+ cells (where llama.cpp's one-row attention kernel changes): fed one at a
    time or in pieces of 2 and 5 rows, every row's logits are bit-identical."""
    model = smol.target.model
    words = " ".join(f"item{i} = {i * 7 % 13}" for i in range(120))
    ids = smol.encode_prompt(words)[:500]
    tail = smol.generate(ids, max_new_tokens=40).token_ids
    assert len(ids) + len(tail) > 512 + 8

    def run(rows: int) -> torch.Tensor:
        cache = model.new_cache(len(ids) + 64)
        model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, logits_at=LAST)
        out = []
        for lo in range(0, len(tail), rows):
            chunk = tail[lo:lo + rows]
            pos = torch.arange(len(ids) + lo, len(ids) + lo + len(chunk))[None]
            out.append(model(torch.tensor([chunk]), pos, cache).logits[0])
        return torch.cat(out)

    one = run(1)
    assert torch.equal(one, run(2)) and torch.equal(one, run(5))


def test_tree_forward_matches_each_branch_and_keep_folds_it(smol):
    """Two branches after a shared root, in one batch: each node's logits equal those of a
    linear forward over its own path, and keep(path) leaves exactly that path cached."""
    model = smol.target.model
    ids = smol.encode_prompt(PROMPTS[1])
    n = len(ids)
    a, b, c = 1000, 2000, 3000  # root a; branches a->b and a->c
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    cache = model.new_cache(n + 8)
    model(torch.tensor([ids]), torch.arange(n)[None], cache, logits_at=LAST)
    tree = model(torch.tensor([[a, b, c]]), torch.tensor([[n, n + 1, n + 1]]), cache,
                 mask=mask).logits[0]
    ref = model.new_cache(n + 8)
    model(torch.tensor([ids]), torch.arange(n)[None], ref, logits_at=LAST)
    for path, node in (([a, b], 1), ([a, c], 2)):
        ref.truncate(n)
        lin = model(torch.tensor([path]), torch.arange(n, n + 2)[None], ref).logits[0]
        assert torch.allclose(tree[node], lin[1], atol=5e-2, rtol=1e-2)
        assert int(tree[node].argmax()) == int(lin[1].argmax())
    cache.keep([n, n + 2], n)  # accept a, c
    assert cache.length == n + 2
    nxt = model(torch.tensor([[7]]), torch.tensor([[n + 2]]), cache).logits[0, 0]
    ref.truncate(n)
    want = model(torch.tensor([[a, c, 7]]), torch.arange(n, n + 3)[None], ref).logits[0, -1]
    ref.truncate(n)
    wrong = model(torch.tensor([[a, b, 7]]), torch.arange(n, n + 3)[None], ref).logits[0, -1]
    assert int(nxt.argmax()) == int(want.argmax())
    # llama.cpp's attention over the compacted cells is not bit-identical to a linear pass
    # (max |diff| ~0.5 here); attending to the wrong branch moves the logits ~10x more
    assert (nxt - want).abs().max() < 0.2 * (wrong - want).abs().max()


def check_exact(engine, runs, tokens: int) -> list[tuple[int, int]]:
    """Every run's tokens equal autoregressive decoding's on every prompt; returns each
    run's (accepted, drafted) guesses summed over the prompts."""
    counts = [(0, 0)] * len(runs)
    for prompt in PROMPTS:
        ref = engine.generate(prompt, max_new_tokens=tokens)
        assert ref.new_tokens > 8
        for i, (method, options) in enumerate(runs):
            got = engine.generate(prompt, max_new_tokens=tokens, method=method, **options)
            assert got.token_ids == ref.token_ids, (method, options)
            accepted, drafted = counts[i]
            counts[i] = (accepted + sum(s.accepted for s in got.steps),
                         drafted + sum(s.drafted for s in got.steps))
    return counts


def assert_accepted_and_rejected(runs, counts) -> None:
    """Identical output alone would also come from plain decoding: some guesses must have
    been kept (the accept path ran) and some refused (the recovery path ran)."""
    for (method, options), (accepted, drafted) in zip(runs, counts, strict=True):
        assert 0 < accepted < drafted, (method, options, accepted, drafted)


def test_every_exact_strategy_equals_autoregressive_on_smollm2(smol):
    runs = [
        ("speculative", {"draft": "ngram", "gamma": 3}),
        ("speculative", {"draft": "prompt-lookup", "gamma": "auto"}),
        ("speculative", {"draft": "prompt-lookup", "gamma": 4, "branches": 3}),
        ("speculative", {"draft": "ngram", "gamma": "auto", "branches": "auto"}),
    ]
    assert_accepted_and_rejected(runs, check_exact(smol, runs, tokens=48))


def test_every_draft_model_strategy_equals_autoregressive_on_smollm2(smol, smol_draft):
    """With a distinct draft (SmolLM2 without its middle blocks), not the target itself."""
    runs = [
        ("speculative", {"draft": smol_draft, "gamma": 4}),
        # γ adapting to the acceptance rate (the cost policy rightly drafts nothing here:
        # this draft costs ~0.8 of the target and agrees on ~1/3 of guesses, α < c)
        ("speculative", {"draft": smol_draft, "gamma": "auto", "gamma_policy": "acceptance"}),
        ("staged", {"draft": smol_draft, "subdraft": "ngram"}),
        # big-little keeps a checked small token while -log p_L(token) <= rollback: below
        # ln 2 that needs p_L > 1/2, so only the target's own argmax is kept (exact greedy)
        ("big-little", {"draft": smol_draft, "fallback": 0.5, "rollback": 0.6}),
    ]
    assert_accepted_and_rejected(runs, check_exact(smol, runs, tokens=24))


def test_exact_with_a_long_context(smol, smol_draft):
    """Past 512 cached tokens (a prompt of more than 512 tokens, 16 new ones), target and
    draft model both. On SmolLM2 (seconds); the default pair runs bitwise just below."""
    text = "Refactor this code:\n" + "\n".join(
        f"def f{i}(x):\n    return x * {i} + {i % 5}" for i in range(32))
    ids = smol.encode_prompt(text)
    assert len(ids) > 512
    ref = smol.generate(ids, max_new_tokens=16)
    for options in ({"draft": smol_draft, "gamma": 3},
                    {"draft": "prompt-lookup", "gamma": 4, "branches": 3}):
        got = smol.generate(ids, max_new_tokens=16, method="speculative", **options)
        assert got.token_ids == ref.token_ids, options


def test_draft_and_tree_equal_autoregressive_on_default_pair(pair):
    """The default pair, bitwise: its draft model and a tree. Every drafter, γ rule and the
    staged cascade (with a distinct draft model) run on SmolLM2 above, in seconds."""
    runs = [
        ("speculative", {"draft": DRAFT, "gamma": 4}),
        ("speculative", {"draft": "ngram", "gamma": 3, "branches": 3}),
    ]
    assert_accepted_and_rejected(runs, check_exact(pair, runs, tokens=24))


def test_tree_verification_keeps_later_branches_exact(smol):
    """Multi-branch trees on llama.cpp: a later branch's accepted nodes are fed again (its
    cells are out of order), and the output still equals autoregressive decoding."""
    text = "Repeat these lines exactly, then continue the pattern:\n" + "\n".join(
        f"x{i % 4} = y{i % 3} + z{i % 5}" for i in range(24))
    ref = smol.generate(text, max_new_tokens=64)
    got = smol.generate(text, max_new_tokens=64, method="speculative", draft="ngram",
                        gamma=4, branches=3)
    assert got.token_ids == ref.token_ids
    assert any(s.extra.get("branches", 0) > 1 for s in got.steps)
    assert any(s.extra.get("branch", 0) > 0 for s in got.steps)


def test_sampling_runs_and_is_seeded(smol, smol_draft):
    a = smol.generate(PROMPTS[0], max_new_tokens=24, method="speculative", draft=smol_draft,
                      temperature=0.8, seed=3)
    b = smol.generate(PROMPTS[0], max_new_tokens=24, method="speculative", draft=smol_draft,
                      temperature=0.8, seed=3)
    assert a.token_ids == b.token_ids and a.new_tokens > 0
    # a distinct draft: the seeded run went through both speculative sampling's accept and
    # its residual resampling, and the repeat took the same path
    accepted = sum(s.accepted for s in a.steps)
    assert 0 < accepted < sum(s.drafted for s in a.steps)
    assert [(s.accepted, s.drafted) for s in a.steps] == [(s.accepted, s.drafted)
                                                          for s in b.steps]


def test_methods_that_need_hidden_states_refuse_clearly(smol):
    for method, options in (("pipelined", {}), ("parallel-prompt", {}),
                            ("big-little", {"early_exit": 10})):
        with pytest.raises(UnsupportedError, match="--backend torch"):
            smol.generate(PROMPTS[0], max_new_tokens=4, method=method, **options)


def test_folder_and_unknown_backend_are_refused(tmp_path):
    folder = ensure_model(SMOL)
    with pytest.raises(draftsman.DraftsmanError, match="GGUF|gguf"):
        draftsman.load(str(folder), backend="llama.cpp")
    with pytest.raises(draftsman.DraftsmanError, match="unknown backend"):
        draftsman.load(SMOL, backend="onnx")


def test_verify_cost_profile_on_the_backend(smol):
    latency = measure_latency(smol.target.model, (1, 4, 16), context=32, repeats=2)
    assert set(latency) == {1, 4, 16} and all(v > 0 for v in latency.values())
    assert latency[16] > latency[1]  # more rows cost more on a CPU


def plain_peer_and_ours(engine, model: str, tokens: int = 32) -> tuple:
    """llama.cpp's own plain loop and our autoregressive decoding on the same prompt ids."""
    ids = engine.encode_prompt(PROMPTS[0])
    ref = engine.generate(ids, max_new_tokens=tokens)
    peer = LlamaCppPlainPeer(resolve_gguf(model), torch.get_num_threads(),
                             engine.target.tokenizer.eos_token_ids)
    return peer.run(ids, Sampling(max_new_tokens=tokens), seed=0), ref


def test_plain_peer_matches_our_autoregressive(smol):
    out, ref = plain_peer_and_ours(smol, SMOL)
    assert out.token_ids == ref.token_ids and out.seconds > 0


def test_concurrent_requests_on_one_model_stay_exact(smol):
    """The server runs requests in threads: each gets its own llama.cpp context, and the
    model's shared batch buffer is taken in turns."""
    import threading

    prompts = ["Write a haiku about the sea.", "List three colors.", "What is 2+2?"]
    ref = {p: smol.generate(p, max_new_tokens=24).token_ids for p in prompts}
    got: dict[str, list[int]] = {}

    def run(p: str) -> None:
        got[p] = smol.generate(p, max_new_tokens=24, method="speculative",
                               draft="prompt-lookup").token_ids

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ref


# Fast mode verifies k tokens in one batch, whose Q4_K GEMM rounds differently from k one-row
# steps: logits move by up to ~0.6 (see EXACT_ROWS in backends/llama_cpp.py), so two tokens
# can swap only where the target's top-2 margin is smaller than that.
MARGIN_BOUND = 0.6


def top2_margin(engine, prompt_ids: list[int], generated: list[int], at: int) -> float:
    """The target's top-2 logit margin after prompt + generated[:at], decoded the way
    autoregressive decoding does (the prompt in one forward, then one token per forward)."""
    model = engine.target.model
    cache = model.new_cache(len(prompt_ids) + at + 1)
    n = len(prompt_ids)
    logits = model(torch.tensor([prompt_ids]), torch.arange(n)[None], cache,
                   logits_at=LAST).logits[0, -1]
    for i, token in enumerate(generated[:at]):
        logits = model(torch.tensor([[token]]), torch.tensor([[n + i]]), cache).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def check_exact_above_margin(engine, runs, tokens: int) -> None:
    """Speculative output equals autoregressive output up to the first divergence, and the
    autoregressive run's top-2 margin there is below MARGIN_BOUND (a numerical near-tie)."""
    for prompt in PROMPTS:
        ids = engine.encode_prompt(prompt)
        ref = engine.generate(ids, max_new_tokens=tokens).token_ids
        assert len(ref) > 8
        for method, options in runs:
            got = engine.generate(ids, max_new_tokens=tokens, method=method,
                                  **options).token_ids
            if got == ref:
                continue
            at = next((i for i, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b),
                      min(len(ref), len(got)))
            assert at < min(len(ref), len(got)), (method, options, "length differs")
            margin = top2_margin(engine, ids, ref, at)
            assert margin < MARGIN_BOUND, (method, options, at, margin)


def test_fast_mode_is_the_default_and_declared():
    ensure_model(SMOL)
    model = draftsman.load(SMOL, backend="llama.cpp").target.model
    assert model.numerics == "fast" and model.capabilities.numerics == numerics_key("fast")
    assert model.piece_rows(8) > 8  # a verify goes in one llama_decode


def test_bitwise_mode_is_declared(smol):
    model = smol.target.model
    assert model.capabilities.numerics == numerics_key("bitwise")
    assert model.piece_rows(8) == exact_rows()
    # the AMX kernels take every matmul of 2+ rows onto their tiles; else up to 3 stay on GEMV
    assert exact_rows() == (1 if amx_kernels_built() and repack() else 3)


def test_fast_mode_is_exact_above_the_margin_bound(fast_pair):
    check_exact_above_margin(fast_pair, [
        ("speculative", {"draft": "prompt-lookup", "gamma": 4}),
        ("speculative", {"draft": DRAFT, "gamma": 4}),
    ], tokens=24)


def test_fast_plain_peer_matches_our_fast_autoregressive(fast_pair):
    """Fast mode runs on llama.cpp's defaults, like its own plain loop: token-identical."""
    out, ref = plain_peer_and_ours(fast_pair, TARGET)
    assert out.token_ids == ref.token_ids


@pytest.mark.skipif(not (install_dir() / "bin" / LOOKUP_BINARY).is_file(),
                    reason="llama-lookup is not built (scripts/build_llama_cpp.sh)")
def test_lookup_peer_real_run_matches_the_plain_loop(fast_pair):
    """llama-lookup on the 1.5B: its printed text is parsed back to the plain loop's tokens
    (a copy prompt, far from any tie), cut at the limit, with its acceptance recorded."""
    tokenizer = fast_pair.target.tokenizer
    ids = fast_pair.encode_prompt("Repeat exactly, nothing else: the quick brown fox jumps "
                                  "over the lazy dog; the quick brown fox jumps over the lazy "
                                  "dog.")
    eos = tokenizer.eos_token_ids
    plain = LlamaCppPlainPeer(resolve_gguf(TARGET), 2, eos).run(ids, Sampling(40), seed=0)
    lookup = LlamaCppLookupPeer(resolve_gguf(TARGET), 2, tokenizer, eos)
    out = lookup.run(ids, Sampling(40), seed=0)
    assert out.token_ids == plain.token_ids and out.finish == plain.finish == "eos"
    assert out.seconds > 0 and lookup.acceptance and lookup.acceptance[0] > 0.5
    short = lookup.run(ids, Sampling(8), seed=0)
    assert short.token_ids == plain.token_ids[:8] and short.finish == "length"


@pytest.mark.skipif("amx_int8" not in cpu_flags(), reason="no AMX on this CPU")
def test_amx_cpu_runs_the_mended_amx_kernels_on_repacked_weights():
    """On an AMX CPU `make setup` builds ggml's AMX kernels with their tile configuration
    mended (scripts/patch_llama_cpp.py; unmended, the first multi-row matmul segfaulted), and
    models load with extra buffer types on: the AMX buffer. Checked in a child process, since
    the crash is a segfault: the build has the AMX kernels, a model's weights go to the AMX
    buffer, a prompt of many rows (the tiles) and a decode run, and bitwise pieces are one
    row (two rows already take the tiles)."""
    assert amx_kernels_built() and repack() and exact_rows() == 1
    code = (
        "import draftsman\n"
        "import ctypes\n"
        "from draftsman.backends.llama_cpp import install_dir\n"
        "cpu = ctypes.CDLL(str(install_dir() / 'lib' / 'libggml-cpu.so'))\n"
        "assert cpu.ggml_cpu_has_amx_int8() == 1\n"
        f"e = draftsman.load({SMOL!r}, backend='llama.cpp')\n"
        "prompt = 'def fibonacci(n):\\n    ' * 8\n"
        "print(e.generate(prompt, max_new_tokens=24).new_tokens)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "DRAFTSMAN_LLAMA_CPP_VERBOSE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0
    assert "AMX model buffer" in done.stderr, done.stderr[-2000:]


@pytest.mark.skipif("amx_int8" not in cpu_flags(), reason="no AMX on this CPU")
def test_llama_cpp_amx_after_our_amx_kernels_in_one_process():
    """Our AMX kernels configure the tiles their way and release them in threads llama.cpp
    shares (the calling thread at least); ggml had loaded its configuration once per thread
    and met unconfigured tiles afterwards: SIGILL, as a bench with the llama.cpp backend and
    torch contestants in one process died. Mended, it configures on every call (the second
    mend of scripts/patch_llama_cpp.py). A child process, as the failure is a signal."""
    code = (
        "import draftsman\n"
        f"ll = draftsman.load({SMOL!r}, backend='llama.cpp')\n"
        "prompt = 'def fibonacci(n):\\n    ' * 8\n"
        "ll.generate(prompt, max_new_tokens=8)\n"
        f"t = draftsman.load({SMOL!r}, backend='torch', dtype='q8')\n"
        "t.generate(prompt * 4, max_new_tokens=4)\n"
        "print(ll.generate(prompt + 'x', max_new_tokens=8).new_tokens)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert int(done.stdout.split()[-1]) > 0


@pytest.mark.parametrize(("info", "key"), [
    ({"amx_kernels": False}, "llama.cpp-fast"),
    ({"amx_kernels": True, "amx_tile_config_mended": True}, "llama.cpp-fast-amx"),
    ({"amx_kernels": True}, "llama.cpp-fast-norepack"),
])
def test_cost_profiles_are_keyed_by_the_kernels_the_build_runs(monkeypatch, info, key):
    """A build on ggml's AMX tiles (or without repacked weights) verifies at another cost
    than the build before it: its forward-cost profile must not be the old one's."""
    monkeypatch.setattr("draftsman.backends.llama_cpp.build_info",
                        lambda: {"version": "0.3.36", **info})
    assert numerics_key("fast") == key
    assert numerics_key("bitwise") == key.replace("fast", "bitwise")
