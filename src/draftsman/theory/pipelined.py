"""The latency-compute model of predictive pipelined decoding, and a timeline simulator.

Yang et al., "Predictive Pipelined Decoding", section 4. Units: one "time unit" is one
transformer layer on one compute unit; a d-layer forward costs d units. The main worker
reads the top-k guesses at layer d̄ (d̄ >= d/2); k sub-workers then run the first d - d̄
layers of the next token, one per guess, while the main worker runs layers d̄+1..d. If the
final token is one of the guesses, the main worker continues that sub-worker's pass from
layer d - d̄ + 1 (Algorithm 2), so a token costs d̄ units instead of d.

A run is a maximal stretch of tokens whose every token after the first was guessed. A run of
X tokens takes T_X = d + (X - 1) d̄ units. With matches i.i.d. with probability p, the number
of runs in ℓ tokens is N = 1 + Bin(ℓ - 1, 1 - p), hence (Theorem 4.1)

    E[latency] = d ℓ - (d - d̄)(ℓ - 1) p
    E[compute] = d ℓ - (d - d̄)(ℓ - 1) p + k (d - d̄) ℓ

(compute: the main worker is always busy; the k sub-workers run d - d̄ layers per token).
For ℓ >> 1, per token and in units of d:

    latency / (d ℓ)  ≈ 1 - (1 - d̄/d) p                  (= 1 - p/2 at d̄ = d/2: eq. 3)
    compute / latency ≈ 1 + k (1 - d̄/d) / (1 - (1 - d̄/d) p)
                                                        (= (k + 2 - p)/(2 - p): eq. 5)
    compute / (d ℓ)  ≈ 1 - (1 - d̄/d) p + k (1 - d̄/d)  (= (2 + k - p)/2: eq. 6)

The simulator plays Algorithm 2 layer by layer on a given match sequence (synthetic, or
replayed from a real generation's early predictions) and counts the same two quantities.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftsman.errors import InvalidArgumentError


def check(d: int, d_bar: int, k: int = 1) -> None:
    if d < 2 or not d / 2 <= d_bar < d:
        raise InvalidArgumentError(f"need d >= 2 and d/2 <= d̄ < d (Theorem 4.1), got d={d}, "
                                   f"d̄={d_bar}")
    if k < 0:
        raise InvalidArgumentError(f"k must be >= 0, got {k}")


# ----------------------------------------------------------------------------- Theorem 4.1


def expected_latency(d: int, d_bar: int, length: int, p_correct: float) -> float:
    """Theorem 4.1: E[latency] for ℓ tokens, in layer-time units."""
    return d * length - (d - d_bar) * (length - 1) * p_correct


def expected_compute(d: int, d_bar: int, length: int, p_correct: float, k: int) -> float:
    """Theorem 4.1: E[total compute units] with k sub-workers."""
    return expected_latency(d, d_bar, length, p_correct) + k * (d - d_bar) * length


# ----------------------------------------------------------------------------- approximations


def latency_per_token(p_correct: float, d_bar_fraction: float = 0.5) -> float:
    """Per-token latency in units of d for ℓ >> 1 (eq. 3 at d̄ = d/2: 1 - p/2)."""
    return 1.0 - (1.0 - d_bar_fraction) * p_correct


def compute_per_time(p_correct: float, k: int, d_bar_fraction: float = 0.5) -> float:
    """Average busy compute units per time unit (eq. 5 at d̄ = d/2: (k + 2 - p)/(2 - p))."""
    s = 1.0 - d_bar_fraction
    return 1.0 + k * s / (1.0 - s * p_correct)


def compute_per_token(p_correct: float, k: int, d_bar_fraction: float = 0.5) -> float:
    """Average compute per token in units of d (eq. 6 at d̄ = d/2: (2 + k - p)/2)."""
    s = 1.0 - d_bar_fraction
    return 1.0 - s * p_correct + k * s


# ----------------------------------------------------------------------------- simulator


@dataclass(frozen=True)
class Interval:
    worker: int  # 0 = main, 1..k = sub-workers
    token: int  # 1-based token index the work belongs to
    start: int  # time units
    end: int
    layers: tuple[int, int]  # 1-based inclusive layer span
    kept: bool = True  # False: a sub-worker pass that was discarded


@dataclass
class Simulation:
    latency: int
    compute: int
    runs: list[int]
    timeline: list[Interval] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(self.runs)


def simulate(matches: Sequence[bool | int], d: int, d_bar: int, k: int = 1,
             keep_timeline: bool = False) -> Simulation:
    """Play Algorithm 2 on ℓ = len(matches) tokens.

    Pass i (0-based) is the forward producing token i + 1. `matches[i]` says whether pass i
    starts from a sub-worker's state, i.e. whether token i (produced by pass i - 1) was among
    the k guesses read at layer d̄ during pass i - 1; `matches[0]` is ignored (the first
    pass starts from the prompt). An int names the sub-worker (1..k) whose guess it was
    (True = 1), for the timeline. `replay_matches` builds this from measured ranks.

    Timeline per token (s = the time the previous token was decided):
      - guessed:  the main worker runs layers d-d̄+1..d̄ in [s, s + 2d̄ - d) on the matching
                  sub-worker's state (its layers 1..d-d̄ ran in [s - (d-d̄), s));
        not:      the main worker runs layers 1..d̄ in [s, s + d̄);
      - then it distributes k guesses and runs layers d̄+1..d while k sub-workers run layers
        1..d-d̄ of the next token: d - d̄ units on k + 1 workers.
    Every token distributes guesses (the last one too: the theorem counts k(d-d̄)ℓ), so
    compute = latency + k (d - d̄) ℓ.
    """
    check(d, d_bar, k)
    s_sub = d - d_bar  # layers a sub-worker runs
    t = 0
    compute = 0
    runs: list[int] = []
    timeline: list[Interval] = []
    for i in range(len(matches)):
        guessed = i > 0 and bool(matches[i])
        first = s_sub + 1 if guessed else 1
        head = d_bar - first + 1  # layers before the early prediction
        if keep_timeline and head > 0:
            timeline.append(Interval(0, i + 1, t, t + head, (first, d_bar)))
        t += head
        compute += head
        if keep_timeline:
            timeline.append(Interval(0, i + 1, t, t + s_sub, (d_bar + 1, d)))
            nxt = int(matches[i + 1]) if i + 1 < len(matches) else 0
            for w in range(1, k + 1):
                timeline.append(Interval(w, i + 2, t, t + s_sub, (1, s_sub), kept=w == nxt))
        t += s_sub
        compute += (k + 1) * s_sub
        if guessed:
            runs[-1] += 1
        else:
            runs.append(1)
    return Simulation(t, compute, runs, timeline)


def replay_matches(ranks: Sequence[int], k: int) -> list[int]:
    """Simulator input from a real generation: `ranks[t]` is the rank of generated token t
    (0-based) among the early logits of the pass that produced it (negative: unknown).
    Pass t + 1 is pipelined iff ranks[t] < k, by sub-worker ranks[t] + 1."""
    return [0] + [r + 1 if 0 <= r < k else 0 for r in ranks[:-1]]


def iid_matches(length: int, p_correct: float, rng: random.Random) -> list[bool]:
    return [False] + [rng.random() < p_correct for _ in range(length - 1)]


def monte_carlo(d: int, d_bar: int, length: int, p_correct: float, k: int, trials: int,
                seed: int = 0) -> tuple[float, float]:
    """Mean simulated (latency, compute) over `trials` i.i.d. match sequences."""
    rng = random.Random(seed)
    lat = comp = 0.0
    for _ in range(trials):
        sim = simulate(iid_matches(length, p_correct, rng), d, d_bar, k)
        lat += sim.latency
        comp += sim.compute
    return lat / trials, comp / trials


# ----------------------------------------------------------------------------- plots


Point = tuple[int, float, float, float]  # k, compute/time unit, compute/token, latency/token


def tradeoff_points(p_hat: dict[str, dict[int, float] | float], ks: Sequence[int] = (1, 3, 5),
                    d_bar_fraction: float = 0.5) -> dict[str, list[Point]]:
    """label -> [(k, compute per time unit, compute per token, latency per token)].

    `p_hat[label]` maps to a dict k -> p̂ or one p̂ used for every k."""
    out: dict[str, list[Point]] = {}
    for label, value in p_hat.items():
        pts = []
        for k in ks:
            p = value.get(k) if isinstance(value, dict) else value
            if p is None:
                continue
            pts.append((k, compute_per_time(p, k, d_bar_fraction),
                        compute_per_token(p, k, d_bar_fraction),
                        latency_per_token(p, d_bar_fraction)))
        out[label] = pts
    return out


def plot_tradeoff(p_hat: dict[str, dict[int, float]], path: Path, title: str,
                  d_bar_fraction: float = 0.5) -> list[Path]:
    """Figures 3 and 4 of the paper: normalised per-token latency against average compute
    per time unit (Figure 3) and per token (Figure 4), one curve per (task, head) over k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = tradeoff_points(p_hat, sorted({k for v in p_hat.values() for k in v}),
                          d_bar_fraction)
    written = []
    for fig_no, (xi, xlabel) in enumerate(
            [(1, "average compute units per time unit"),
             (2, "average compute per token (units of d)")], start=3):
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for label, rows in pts.items():
            if not rows:
                continue
            xs = [r[xi] for r in rows]
            ys = [r[3] for r in rows]
            style = "--" if label.endswith("tr") else "-"
            line, = ax.plot(xs, ys, style, marker="o", label=label)
            for r in rows:
                ax.annotate(f"k={r[0]}", (r[xi], r[3]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=line.get_color())
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("per-token latency / greedy")
        ax.set_title(f"{title} (Figure {fig_no} layout, d̄ = {d_bar_fraction:.2f} d)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        out = path.with_name(f"{path.stem}-fig{fig_no}{path.suffix or '.png'}")
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)
    return written

