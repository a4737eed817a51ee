"""The server with batching: requests decoded together give what each gives alone, the
steps are seen in /metrics, methods that cannot share a forward still run, and the KV
budget refuses with 429."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from test_server import AR, NAME, engine, model_dirs, reference, serving, total  # noqa: F401

from draftsman.server.batch_worker import BatchingScheduler
from draftsman.server.engine_thread import EngineThread
from draftsman.server.worker import Scheduler

PROMPTS = ["the quick brown fox jumps over the lazy dog the quick brown fox",
           "def add(a, b): return a + b def add(a, b): return",
           "one two three one two three one two",
           "speculative decoding drafts tokens and target checks them"]
LOOKUP = {"draftsman": {"method": "speculative", "draft": "prompt-lookup", "gamma": "auto"}}


def test_four_users_share_forwards_and_each_gets_its_own_text(engine):  # noqa: F811
    with serving(engine, parallel=4) as live:
        assert isinstance(live.app.state.server.scheduler, BatchingScheduler)
        client = live.client(timeout=120)

        def ask(prompt):
            return client.completions.create(model=NAME, prompt=prompt, max_tokens=40,
                                             temperature=0, extra_body=LOOKUP).choices[0].text

        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(ask, PROMPTS * 2))
        metrics = live.metrics()
    for prompt, text in zip(PROMPTS * 2, texts, strict=True):
        ref = reference(engine, prompt, max_new_tokens=40, method="speculative",
                        draft="prompt-lookup", gamma="auto")
        assert text == ref.text, prompt
    steps = total(metrics, "draftsman_batch_requests_count")
    assert steps > 0
    # more than one request per forward on average: they really were batched
    assert total(metrics, "draftsman_batch_requests_sum") > 1.2 * steps
    assert total(metrics, "draftsman_batch_committed_tokens_sum") == total(
        metrics, "draftsman_generation_tokens_total")


def test_a_method_that_cannot_share_a_forward_runs_beside_the_batch(engine):  # noqa: F811
    tree = {"draftsman": {"method": "speculative", "draft": "ngram", "branches": 2}}
    with serving(engine, parallel=2) as live:
        client = live.client(timeout=120)
        with ThreadPoolExecutor(3) as pool:
            jobs = [pool.submit(client.completions.create, model=NAME, prompt=p,
                                max_tokens=24, temperature=0, extra_body=body)
                    for p, body in ((PROMPTS[0], tree), (PROMPTS[1], AR), (PROMPTS[2], AR))]
            texts = [j.result().choices[0].text for j in jobs]
    assert texts[0] == reference(engine, PROMPTS[0], max_new_tokens=24, method="speculative",
                                 draft="ngram", branches=2).text
    for prompt, text in zip(PROMPTS[1:3], texts[1:], strict=True):
        assert text == reference(engine, prompt, max_new_tokens=24,
                                 method="autoregressive").text


def test_the_kv_budget_refuses_with_429_and_frees_on_finish(engine):  # noqa: F811
    with serving(engine, parallel=2, max_kv_tokens=200) as live:
        client = live.client(timeout=60)
        first = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=150,
                                          temperature=0, stream=True, extra_body=AR)
        next(iter(first))
        with pytest.raises(openai.RateLimitError, match="KV cache budget"):
            client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=100,
                                      temperature=0, extra_body=AR)
        first.close()
        r = None
        for _ in range(100):  # the cancelled stream's slots free at its next step
            try:
                r = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=100,
                                              temperature=0, extra_body=AR)
                break
            except openai.RateLimitError:
                import time
                time.sleep(0.05)
        assert r is not None and r.usage.completion_tokens > 0


def test_no_batch_keeps_one_worker_per_request(engine):  # noqa: F811
    with serving(engine, parallel=2, batch=False) as live:
        scheduler = live.app.state.server.scheduler
        assert type(scheduler) is Scheduler
        r = live.client().completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=8,
                                             temperature=0, extra_body=AR)
        assert r.choices[0].text == reference(engine, PROMPTS[2], max_new_tokens=8,
                                              method="autoregressive").text


def test_generate_many_gives_each_prompt_what_generate_gives(engine):  # noqa: F811
    kwargs = dict(max_new_tokens=20, temperature=0, method="speculative",
                  draft="prompt-lookup", gamma="auto", chat=False)
    results = engine.generate_many(PROMPTS + PROMPTS[:2], parallel=3, **kwargs)
    for prompt, result in zip(PROMPTS + PROMPTS[:2], results, strict=True):
        alone = engine.generate(prompt, **kwargs)
        assert result.token_ids == alone.token_ids and result.text == alone.text
        assert result.seconds > 0 and result.finish_reason == alone.finish_reason
    assert engine.generate_many([], parallel=2) == []


def test_the_engine_thread_runs_calls_in_order_and_hands_back_errors():
    engine_thread = EngineThread()
    assert engine_thread.call(threading.get_ident) == engine_thread.ident != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        engine_thread.call(lambda: 1 / 0)
    release, order = threading.Event(), []
    loop = engine_thread.hosted(lambda: (release.wait(10), order.append("loop")))
    assert not loop.is_alive()
    loop.start()
    assert loop.is_alive()
    later = engine_thread.submit(order.append, "after")  # queued behind the running loop
    release.set()
    loop.join(10)
    later.result(10)
    assert not loop.is_alive() and order == ["loop", "after"]


def test_the_batch_loop_runs_on_the_engine_thread(engine):  # noqa: F811
    """`draftsman serve` loads on its engine thread; the batch loop must decode there too
    (a forward on a second OpenMP team ran 30% slower: server/engine_thread.py)."""
    engine_thread = EngineThread()
    seen: set[int] = set()
    with serving(engine, parallel=2, engine_thread=engine_thread) as live:
        scheduler = live.app.state.server.scheduler
        on_step = scheduler.on_step
        scheduler.on_step = lambda report: (seen.add(threading.get_ident()), on_step(report))
        text = live.client(timeout=120).completions.create(
            model=NAME, prompt=PROMPTS[0], max_tokens=8, temperature=0,
            extra_body=AR).choices[0].text
    assert seen == {engine_thread.ident}
    assert text == reference(engine, PROMPTS[0], max_new_tokens=8,
                             method="autoregressive").text


def test_unbatched_worker_zero_runs_on_the_engine_thread(engine):  # noqa: F811
    """`serve --no-batch`: the first worker decodes on the engine thread, the others on
    threads of their own."""
    engine_thread = EngineThread()
    ran: list[int] = []
    with serving(engine, parallel=1, batch=False, engine_thread=engine_thread) as live:
        scheduler = live.app.state.server.scheduler
        assert not isinstance(scheduler, BatchingScheduler)
        run = scheduler._run
        scheduler._run = lambda job: (ran.append(threading.get_ident()), run(job))[1]
        text = live.client(timeout=120).completions.create(
            model=NAME, prompt=PROMPTS[1], max_tokens=8, temperature=0,
            extra_body=AR).choices[0].text
    assert ran == [engine_thread.ident]
    assert text == reference(engine, PROMPTS[1], max_new_tokens=8,
                             method="autoregressive").text


@pytest.mark.parametrize(("gather_ms", "first_step_requests"), [(400.0, 2), (0.0, 1)])
def test_requests_arriving_together_start_in_one_step(engine, gather_ms,  # noqa: F811
                                                      first_step_requests):
    """A request ready at an idle server while another is still being received (here: the
    first is held until the second is inside its preparation, slowed by 100 ms) waits for it
    up to --gather-ms, so both prompts are read in one forward; with 0 the first starts at
    once (the control)."""
    with serving(engine, parallel=2, gather_ms=gather_ms) as live:
        server = live.app.state.server
        reports, report = [], server.scheduler.on_step
        server.scheduler.on_step = lambda r: (reports.append(r), report(r))
        prepare = server.prepare

        def slow_second(body, *args):
            if body.prompt == PROMPTS[1]:
                threading.Event().wait(0.1)
            else:  # the first: until the second is being received too
                deadline = time.perf_counter() + 5
                while server.scheduler.arriving < 2 and time.perf_counter() < deadline:
                    threading.Event().wait(0.005)
            return prepare(body, *args)

        server.prepare = slow_second
        client = live.client(timeout=120)

        def ask(prompt):
            return client.completions.create(model=NAME, prompt=prompt, max_tokens=8,
                                             temperature=0, extra_body=AR).choices[0].text

        with ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(ask, PROMPTS[:2]))
    assert reports[0].requests == first_step_requests
    for prompt, text in zip(PROMPTS[:2], texts, strict=True):
        assert text == reference(engine, prompt, max_new_tokens=8,
                                 method="autoregressive").text


def test_a_lone_request_does_not_wait_to_gather(engine):  # noqa: F811
    """Nobody else being received: no wait. The control: a phantom request "being received"
    holds the first one back for the whole --gather-ms."""
    with serving(engine, parallel=2, gather_ms=1000.0) as live:
        client = live.client(timeout=120)

        def seconds() -> float:
            start = time.perf_counter()
            client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=4,
                                      temperature=0, extra_body=AR)
            return time.perf_counter() - start

        seconds()  # warm
        alone = seconds()
        with live.app.state.server.scheduler.arrival():  # someone else is on the way
            held = seconds()
    assert alone < 0.8 <= 1.0 <= held
