"""Prometheus metrics of one server, in its own registry (several apps can share a process).

Counters are labelled by `method` (a registered strategy name, or "unknown" when the request
failed before a valid method was known, so label values stay bounded). Every request to a
generation endpoint is counted exactly once in `draftsman_requests_total`, with the HTTP
status it got (499 when a non-streamed client went away; a cancelled stream keeps its 200
and is counted in `draftsman_finished_requests_total{reason="cancelled"}`).

Acceptance gauges are lifetime ratios of the counters next to them, so a scrape shows
α, acceptance rate and τ per method directly, and PromQL can still take windowed ratios of
the counters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from draftsman.batching.scheduler import StepReport
from draftsman.core import Stats
from draftsman.proposers.history import HistoryStore

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
TAU_BUCKETS = (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12)
COUNT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)


@dataclass
class _Totals:
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    tokens: int = 0
    target_forwards: int = 0


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._totals: dict[str, _Totals] = {}
        self.requests = Counter("draftsman_requests", "Generation requests by outcome",
                                ["endpoint", "method", "status"], registry=r)
        self.finished = Counter("draftsman_finished_requests",
                                "Generations by how they ended (eos, length, stop, cancelled, "
                                "error)", ["method", "reason"], registry=r)
        self.prompt_tokens = Counter("draftsman_prompt_tokens", "Prompt tokens processed",
                                     ["method"], registry=r)
        self.generation_tokens = Counter("draftsman_generation_tokens",
                                         "Tokens generated (sent or cut by cancellation)",
                                         ["method"], registry=r)
        self.drafted = Counter("draftsman_drafted_tokens", "Guesses proposed to the target",
                               ["method"], registry=r)
        self.accepted = Counter("draftsman_accepted_tokens", "Guesses the target kept",
                                ["method"], registry=r)
        self.target_forwards = Counter("draftsman_target_forwards",
                                       "Target model forward passes", ["method"], registry=r)
        self.acceptance_rate = Gauge("draftsman_acceptance_rate",
                                     "accepted / drafted since start", ["method"], registry=r)
        self.alpha = Gauge("draftsman_alpha", "per-guess acceptance probability since start "
                           "(accepted / (accepted + rejections))", ["method"], registry=r)
        self.tau = Gauge("draftsman_tau", "tokens per target forward since start",
                         ["method"], registry=r)
        self.request_tau = Histogram("draftsman_request_tau", "tokens per target forward, per "
                                     "request", ["method"], buckets=TAU_BUCKETS, registry=r)
        self.queue_depth = Gauge("draftsman_queue_depth", "Requests waiting for a worker",
                                 registry=r)
        self.running = Gauge("draftsman_requests_running", "Requests being generated",
                             registry=r)
        self.queue_capacity = Gauge("draftsman_queue_capacity",
                                    "Requests admitted at most (parallel + max queue)",
                                    registry=r)
        self.latency = Histogram("draftsman_request_duration_seconds",
                                 "Time from request to last byte", ["endpoint", "method"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("draftsman_queue_wait_seconds",
                                    "Time admitted requests waited for a worker", ["method"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("draftsman_time_to_first_token_seconds",
                              "Time from request to the first generated token", ["method"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_per_second = Histogram("draftsman_tokens_per_second",
                                           "Generation speed per request (after the queue)",
                                           ["method"], buckets=RATE_BUCKETS, registry=r)
        self.batch_requests = Histogram("draftsman_batch_requests", "Requests sharing "
                                        "one target forward", buckets=COUNT_BUCKETS,
                                        registry=r)
        self.batch_rows = Histogram("draftsman_batch_rows", "Rows in one batched forward "
                                    "(pending tokens, guesses, prompt chunks)",
                                    buckets=COUNT_BUCKETS, registry=r)
        self.batch_gamma = Histogram("draftsman_batch_gamma", "Guesses verified per "
                                     "decoding request in a batched step",
                                     buckets=COUNT_BUCKETS, registry=r)
        self.batch_committed = Histogram("draftsman_batch_committed_tokens", "Tokens one "
                                         "batched step committed, over its requests",
                                         buckets=COUNT_BUCKETS, registry=r)
        self.batch_seconds = Histogram("draftsman_batch_step_seconds", "Wall time of one "
                                       "batched forward", buckets=LATENCY_BUCKETS,
                                       registry=r)

    def batch_step(self, report: StepReport) -> None:
        """One step of the batch scheduler: how full it was and what it committed."""
        self.batch_requests.observe(report.requests)
        self.batch_rows.observe(report.rows)
        for gamma in report.gammas:
            self.batch_gamma.observe(gamma)
        self.batch_committed.observe(report.committed)
        self.batch_seconds.observe(report.seconds)

    def watch_history(self, store: HistoryStore) -> None:
        """The cross-request history store's size, read at scrape time."""
        r = self.registry
        Gauge("draftsman_history_tokens", "Tokens of earlier prompts and replies kept for "
              "drafting", registry=r).set_function(lambda: store.tokens)
        Gauge("draftsman_history_bytes", "Estimated memory of the history store, its index "
              "included", registry=r).set_function(lambda: store.bytes)
        Gauge("draftsman_history_scopes", "API-key scopes with history", registry=r
              ).set_function(lambda: store.scopes)
        Gauge("draftsman_history_budget_tokens", "Most tokens the history store keeps",
              registry=r).set(store.budget)

    def watch_queue(self, waiting: Callable[[], int], running: Callable[[], int],
                    capacity: int) -> None:
        """Read queue depth and running count at scrape time."""
        self.queue_depth.set_function(waiting)
        self.running.set_function(running)
        self.queue_capacity.set(capacity)

    def request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        """Count one request to a generation endpoint (exactly once per request)."""
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint, method).observe(seconds)

    def generation(self, method: str, *, prompt_tokens: int, steps: Stats, reason: str,
                   queue_seconds: float, ttft: float | None, run_seconds: float) -> None:
        """Record one generation that reached a worker (or was cancelled while queued)."""
        self.finished.labels(method, reason).inc()
        self.prompt_tokens.labels(method).inc(prompt_tokens)
        self.queue_wait.labels(method).observe(queue_seconds)
        if not steps.steps:
            return
        self.generation_tokens.labels(method).inc(steps.new_tokens)
        self.drafted.labels(method).inc(steps.drafted)
        self.accepted.labels(method).inc(steps.accepted)
        self.target_forwards.labels(method).inc(steps.target_forwards)
        if ttft is not None:
            self.ttft.labels(method).observe(ttft)
        if run_seconds > 0:
            self.tokens_per_second.labels(method).observe(steps.new_tokens / run_seconds)
        if steps.tau is not None:
            self.request_tau.labels(method).observe(steps.tau)
        self._update_ratios(method, steps)

    def _update_ratios(self, method: str, s: Stats) -> None:
        with self._lock:
            t = self._totals.setdefault(method, _Totals())
            t.drafted += s.drafted
            t.accepted += s.accepted
            t.rejections += s.rejections
            t.tokens += s.new_tokens
            t.target_forwards += s.target_forwards
            if t.drafted:
                self.acceptance_rate.labels(method).set(t.accepted / t.drafted)
            if t.accepted + t.rejections:
                self.alpha.labels(method).set(t.accepted / (t.accepted + t.rejections))
            if t.target_forwards:
                self.tau.labels(method).set(t.tokens / t.target_forwards)

    def render(self) -> bytes:
        return generate_latest(self.registry)
