"""A load generator for OpenAI-compatible servers: ours, llama.cpp's `llama-server`, any.

A round runs `concurrency` clients against one server, closed-loop: each client streams a
chat completion, and as soon as it ends takes the next prompt, until every prompt of the
round is answered. From the chunk arrival times it reports what a user feels and what an
operator pays for:
- aggregate tokens/s: completion tokens of the round / its wall time;
- TTFT: request sent -> first content chunk (p50, p99), queue time included;
- ITL: the gap between consecutive content chunks (p50, p99); a speculative server sends
  several tokens per chunk, so its gaps are fewer and longer: TPOT ((end - first) / (tokens
  - 1), mean) is the per-token figure comparable across servers.
Contestants are timed interleaved: for each concurrency, one round per server in turn,
repeated `rounds` times, so drift in the machine hits every server alike. `run_arrivals`
is the open-loop variant: requests arrive as a seeded Poisson process, whatever is running.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from queue import Empty, Queue
from typing import Any


@dataclass
class Reply:
    """One streamed request, timed by the client."""

    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival of each content chunk
    tokens: int = 0  # completion tokens (usage, else content chunks)
    text: str = ""
    error: str | None = None
    done: float = 0.0

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] - self.sent if self.chunks else None

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2 or not self.chunks:
            return None
        return (self.chunks[-1] - self.chunks[0]) / (self.tokens - 1)


def stream_chat(url: str, messages: list[dict[str, str]], max_tokens: int,
                model: str | None = None, extra: dict[str, Any] | None = None,
                timeout: float = 600.0) -> Reply:
    """POST url/v1/chat/completions with stream=True; time every content chunk."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    if model is not None:  # servers of one model take any name or none
        body["model"] = model
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    reply = Reply(sent=time.perf_counter())
    usage = None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):  # the server failed mid-stream: an error object
                    error = chunk["error"]
                    reply.error = str(error.get("message", error) if isinstance(error, dict)
                                      else error)
                    break
                if chunk.get("usage"):
                    usage = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        reply.chunks.append(time.perf_counter())
                        reply.text += content
    except Exception as exc:  # noqa: BLE001 - recorded per request; the round goes on
        reply.error = f"{type(exc).__name__}: {exc}"
    reply.done = time.perf_counter()
    reply.tokens = usage if usage is not None else len(reply.chunks)
    return reply


@dataclass
class Round:
    """One server at one concurrency over the round's prompts."""

    server: str
    concurrency: int | str  # clients at once, or "R/s" for Poisson arrivals
    seconds: float
    replies: list[Reply]

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.replies if r.error is None]
        tokens = sum(r.tokens for r in ok)
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        gaps = [g for r in ok for g in r.gaps]
        tpots = [r.tpot for r in ok if r.tpot is not None]
        return {"server": self.server, "concurrency": self.concurrency,
                "requests": len(self.replies), "errors": len(self.replies) - len(ok),
                "tokens": tokens, "seconds": self.seconds,
                "tokens_per_second": tokens / self.seconds if self.seconds else 0.0,
                "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
                "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
                "tpot_mean": statistics.fmean(tpots) if tpots else None}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile by linear interpolation (None when empty)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_round(name: str, url: str, prompts: Sequence[list[dict[str, str]]],
              concurrency: int, max_tokens: int, extra: dict[str, Any] | None = None,
              on_reply: Callable[[Reply], None] | None = None) -> Round:
    """`concurrency` closed-loop clients over `prompts` against the server at `url`."""
    work: Queue[tuple[int, list[dict[str, str]]]] = Queue()
    for i, messages in enumerate(prompts):
        work.put((i, messages))
    replies: list[Reply | None] = [None] * len(prompts)

    def client() -> None:
        while True:
            try:
                i, messages = work.get_nowait()
            except Empty:
                return
            reply = stream_chat(url, messages, max_tokens, extra=extra)
            replies[i] = reply
            if on_reply is not None:
                on_reply(reply)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Round(name, concurrency, time.perf_counter() - t0,
                 [r for r in replies if r is not None])


def run_arrivals(name: str, url: str, prompts: Sequence[list[dict[str, str]]], rate: float,
                 max_tokens: int, extra: dict[str, Any] | None = None, seed: int = 0) -> Round:
    """Open loop: the prompts arrive as a Poisson process of `rate` requests per second
    (seeded: every server sees the same arrival times), each streamed on its own thread
    whatever is still running."""
    rng = random.Random(seed)
    replies: list[Reply | None] = [None] * len(prompts)

    def client(i: int) -> None:
        replies[i] = stream_chat(url, prompts[i], max_tokens, extra=extra)

    t0 = time.perf_counter()
    at, threads = 0.0, []
    for i in range(len(prompts)):
        at += rng.expovariate(rate) if i else 0.0
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        thread = threading.Thread(target=client, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return Round(name, f"{rate:g}/s", time.perf_counter() - t0,
                 [r for r in replies if r is not None])


def reply_record(reply: Reply) -> dict[str, Any]:
    row = asdict(reply)
    row.pop("chunks")
    row.update(ttft=reply.ttft, tpot=reply.tpot, chunks=len(reply.chunks))
    return row


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Medians over rounds per server and concurrency, as a Markdown table."""
    import statistics

    keys = ("tokens_per_second", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_mean")
    groups: dict[tuple[int | str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["concurrency"], r["server"]), []).append(r)
    lines = ["| users | server | tok/s | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) | TPOT (ms) "
             "| errors |", "|---|---|---|---|---|---|---|"]
    for (level, name), group in sorted(groups.items(), key=lambda g: (
            isinstance(g[0][0], str), g[0][0])):
        med = {k: statistics.median([g[k] for g in group if g[k] is not None] or [0.0])
               for k in keys}
        lines.append(
            f"| {level} | {name} | {med['tokens_per_second']:.1f} | {med['ttft_p50']:.2f} / "
            f"{med['ttft_p99']:.2f} | {1000 * med['itl_p50']:.0f} / {1000 * med['itl_p99']:.0f}"
            f" | {1000 * med['tpot_mean']:.0f} | {sum(g['errors'] for g in group)} |")
    return "\n".join(lines)


def plot_load(rows: list[dict[str, Any]], path: Any) -> bool:
    """load.png: aggregate tokens/s and p99 inter-chunk latency against concurrent users,
    one line per server (closed-loop rounds; medians over rounds). False without them."""
    from matplotlib.figure import Figure

    closed = [r for r in rows if isinstance(r["concurrency"], int)]
    if not closed:
        return False
    fig = Figure(figsize=(10, 4))
    speed, latency = fig.subplots(1, 2)
    for name in dict.fromkeys(r["server"] for r in closed):
        levels = sorted({r["concurrency"] for r in closed if r["server"] == name})
        def median(key: str, level: int, name: str = name) -> float:
            values = [r[key] for r in closed if r["server"] == name
                      and r["concurrency"] == level and r[key] is not None]
            return statistics.median(values) if values else float("nan")
        speed.plot(levels, [median("tokens_per_second", n) for n in levels], "o-", label=name)
        latency.plot(levels, [1000 * median("itl_p99", n) for n in levels], "o-", label=name)
    speed.set(xlabel="concurrent users", ylabel="aggregate tokens/s", title="throughput")
    latency.set(xlabel="concurrent users", ylabel="ms", title="p99 gap between chunks")
    speed.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True
