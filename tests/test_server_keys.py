"""API keys and the per-key drafting history of the server: 401s, scopes that never leak,
the history budget under a flood, and its gauges on /metrics."""

from __future__ import annotations

import argparse
import random
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest
from test_server import NAME, engine, model_dirs, serving, wait_until  # noqa: F401

from draftsman.cli import serve_cmd
from draftsman.proposers.history import HistoryStore
from draftsman.proposers.suffix import SuffixProposer
from draftsman.server.auth import scope_of

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"
SUFFIX = dict(method="speculative", options={"draft": "suffix"})


def post(url: str, key: str | None, prompt, max_tokens: int = 4) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/completions", headers=headers, timeout=30,
                      json={"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0})


def test_missing_or_wrong_key_is_401_right_key_200(engine):  # noqa: F811
    with serving(engine, **SUFFIX, api_keys=[KEY_A, KEY_B]) as live:
        for key in (None, "wrong-key", KEY_A[:-1]):
            r = post(live.url, key, "hello world")
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.json()["error"]["type"] == "invalid_request_error"
        r = httpx.get(f"{live.url}/v1/models", headers={"Authorization": "Basic " + KEY_A})
        assert r.status_code == 401
        for key in (KEY_A, KEY_B):
            assert post(live.url, key, "hello world").status_code == 200
            r = httpx.get(f"{live.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
        assert httpx.get(f"{live.url}/health").status_code == 200  # open, as in vLLM
        metrics = live.metrics()
        assert metrics["draftsman_requests_total"][
            (("endpoint", "completions"), ("method", "unknown"), ("status", "401"))] == 3


def test_no_keys_means_no_authentication(engine):  # noqa: F811
    with serving(engine, **SUFFIX) as live:
        assert post(live.url, None, "hello world").status_code == 200


@pytest.fixture
def seen(monkeypatch) -> list:
    """The history scope every suffix drafter in the server was given."""
    out: list = []
    use = SuffixProposer.use_history

    def spy(self, history):
        out.append(history)
        use(self, history)

    monkeypatch.setattr(SuffixProposer, "use_history", spy)
    return out


def drafted_after(scope, query: list[int]) -> list[list[int]]:
    """The branches a suffix drafter reading only `scope` guesses after `query`."""
    drafter = SuffixProposer()
    drafter.use_history(scope)
    drafter.start(query, 0)
    return [b.tokens for b in drafter.propose_branches(query, 3, 4, None)]


def test_one_keys_text_never_drafts_for_another(engine, seen):  # noqa: F811
    secret = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]  # A's text, in no other prompt
    query = [9, 10, 11] + secret[:3]
    fresh = [12, 13, 14] + secret[:3]  # checked offline: in no scope itself
    with serving(engine, **SUFFIX, api_keys=[KEY_A, KEY_B]) as live:
        history = live.app.state.server.history
        assert post(live.url, KEY_A, [7, 8] + secret, max_tokens=2).status_code == 200
        wait_until(lambda: history.tokens > 0)
        seen.clear()
        assert post(live.url, KEY_B, query).status_code == 200
        assert [s.name for s in seen] == [scope_of(KEY_B)]
        b_scope = seen[0]  # B's drafter cannot reach A's text
        assert all(secret[3] not in b for b in drafted_after(b_scope, fresh))
        assert not set(secret[3:]) & set(b_scope.window(0, b_scope.end))
        seen.clear()
        assert post(live.url, KEY_A, query).status_code == 200
        assert [s.name for s in seen] == [scope_of(KEY_A)]
        assert secret[3:6] in drafted_after(seen[0], fresh)  # A's drafter can
        assert KEY_A not in scope_of(KEY_A)  # scopes are hashes, not keys


def test_history_budget_holds_under_a_flood(engine):  # noqa: F811
    rng = random.Random(5)
    budget = 300
    with serving(engine, **SUFFIX, api_keys=[KEY_A, KEY_B], history_tokens=budget) as live:
        history = live.app.state.server.history
        prompts = [[rng.randrange(5, 60) for _ in range(rng.randrange(10, 40))]
                   for _ in range(40)]

        def send(i: int) -> int:
            return post(live.url, (KEY_A, KEY_B)[i % 2], prompts[i], max_tokens=3).status_code

        with ThreadPoolExecutor(4) as pool:
            for status in pool.map(send, range(len(prompts))):
                assert status == 200
                assert history.tokens <= budget
        wait_until(lambda: history.tokens > budget // 2)
        metrics = live.metrics()
        tokens = metrics["draftsman_history_tokens"][()]
        assert 0 < tokens <= budget
        assert metrics["draftsman_history_budget_tokens"][()] == budget
        assert metrics["draftsman_history_scopes"][()] in (1, 2)
        assert metrics["draftsman_history_bytes"][()] > tokens


def test_api_keys_from_flags_and_environment():
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--api-key", "k1", "--api-key", "k2",
                              "--history-tokens", "5000"])
    assert serve_cmd.api_keys(args, {"DRAFTSMAN_API_KEYS": "k3, k1,,"}) == ["k1", "k2", "k3"]
    assert serve_cmd.api_keys(parser.parse_args(["serve"]), {}) == []
    assert args.history_tokens == 5000


def test_python_api_drafts_from_and_remembers_a_history(engine, seen):  # noqa: F811
    store = HistoryStore(1000)
    prompt = "the quick brown fox jumps over lazy dog"
    plain = engine.generate(prompt, method="autoregressive", max_new_tokens=8)
    for _ in range(2):
        got = engine.generate(prompt, method="speculative", draft="suffix",
                              max_new_tokens=8, history=store, scope="me")
        assert got.token_ids == plain.token_ids
    assert [s.name for s in seen] == ["me", "me"]
    assert store.tokens == 2 * (got.prompt_tokens + 8)
    assert got.stats.drafted > 0  # the second call copies the first reply
