"""Benchmark numbers, all derived from Step events (per row) and from rows (per method).

Per row (`step_metrics`): the engine's `Stats` over the row's Steps plus what the benchmark
adds: staged per-stage counts and the accepted run lengths (for the oracle bound).

Per method (`summarise`), over the prompts both it and the baseline measured:
- each (prompt, turn) contributes the **median over repeats** of its seconds and new tokens;
- tokens/s = Σ tokens / Σ seconds; time per token is its inverse;
- speedup = baseline time per token / method time per token over those sums. For exact
  methods the token counts are equal and this is the ratio of summed times; normalising by
  tokens keeps it fair when a lossy method (or a bf16 tie) stops at a different length;
- `speedup_median` is the median over prompts of the same per-prompt ratio, and the spread
  (`speedup_min`, `speedup_max`) is over repeats, each repeat summed over all prompts;
- α, τ, γ, c are pooled over every Step of every row (sums of counts, then ratios), and the
  predicted speedup is `theory.expected_speedup(α, γ, c)` with those measured values.

c for the prediction (`guess_cost`) is the drafting time per *guess* over the target's time
per *decode* forward (prefill excluded): the paper's c for a draft model (one forward per
guess), and still meaningful for drafters without forwards (n-gram: c ≈ 0) and for cascades
(a middle-model forward yields several guesses). `cost_ratio` stays the engine's per-forward
`Stats.cost_ratio`.

The paper's model assumes a verify forward over γ+1 tokens costs one one-token forward. Beside
it, `predicted_speedup_hw` uses this machine's measured costs in units of the baseline's
one-token decode forward: `verify_cost` (the method's mean verify forward) and `draft_cost`
(drafting per guess), with `theory.expected_speedup_with_verify_cost`, and with the share f
of decode steps that drafted at all (a prompt-lookup drafter often finds nothing to propose;
such a step commits one token): tokens per step f·E[tokens | γ] + (1 − f), cost per step
f·γ·c + verify_cost. What remains between that and the measured speedup is overhead outside
drafting and verifying.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from draftsman.bench.quality import corpus_bleu
from draftsman.core import Stats, Step
from draftsman.theory.speculative import (
    expected_speedup,
    expected_speedup_with_verify_cost,
    expected_tokens_per_step,
    oracle_speedup_from_runs,
)

Row = dict[str, Any]

# counts a row stores so that methods can be pooled by summing
COUNTS = ("new_tokens", "seconds", "steps", "target_forwards", "draft_forwards", "drafted",
          "accepted", "rejections", "drafting_steps", "draft_seconds", "verify_seconds",
          "other_seconds", "sub_drafted", "sub_accepted", "sub_rejections",
          "decode_verify_seconds", "decode_target_forwards", "decode_steps")


def step_metrics(steps: Sequence[Step]) -> dict[str, Any]:
    """Everything a row records about its Steps (counts plus the per-row ratios)."""
    stats = Stats.from_steps(list(steps))
    out = stats.as_dict()
    decode = [s for s in steps if not s.prefill]
    out["decode_verify_seconds"] = sum(s.verify_seconds for s in decode)
    out["decode_target_forwards"] = sum(s.target_forwards for s in decode)
    out["decode_steps"] = len(decode)
    out["guess_cost"] = guess_cost(stats.draft_seconds, stats.drafted,
                                   out["decode_verify_seconds"], out["decode_target_forwards"])
    out["predicted_speedup"] = predicted(stats.alpha, stats.mean_gamma, out["guess_cost"])
    sub = {k: sum(int(s.extra.get(k, 0)) for s in steps)
           for k in ("sub_drafted", "sub_accepted", "sub_rejections")}
    out.update(sub)
    out["alpha_draft"] = ratio(sub["sub_accepted"], sub["sub_accepted"] + sub["sub_rejections"])
    out["accepted_runs"] = [s.accepted for s in steps if s.drafted]
    out["gammas"] = [int(s.extra["gamma"]) for s in steps if "gamma" in s.extra]
    return out


def guess_cost(draft_seconds: float, drafted: float, verify_seconds: float,
               forwards: float) -> float | None:
    """Seconds per drafted guess / seconds per target decode forward."""
    if not drafted or not forwards or not verify_seconds:
        return None
    return (draft_seconds / drafted) / (verify_seconds / forwards)


def predicted_on_hardware(alpha: float, gamma: float, draft_cost: float, verify_cost: float,
                          drafting_share: float = 1.0) -> float:
    """Speedup over one-token decoding when a share `drafting_share` of steps drafts γ guesses
    (costs in one-token target forwards); equals the paper's model for share 1, verify 1."""
    f = min(max(drafting_share, 0.0), 1.0)
    if f == 1.0:
        return expected_speedup_with_verify_cost(alpha, gamma, draft_cost, verify_cost)
    tokens = f * expected_tokens_per_step(alpha, gamma) + (1.0 - f)
    return tokens / (f * gamma * draft_cost + verify_cost)


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def predicted(alpha: float | None, gamma: float | None, cost: float | None) -> float | None:
    if alpha is None or not gamma or cost is None:
        return None
    return expected_speedup(alpha, gamma, cost)


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


@dataclass
class Pooled:
    """Sums over rows and the ratios that follow from them (α, τ, γ, c, splits)."""

    sums: dict[str, float] = field(default_factory=dict)
    runs: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, rows: Iterable[Row]) -> Pooled:
        sums: dict[str, float] = defaultdict(float)
        runs: list[int] = []
        for row in rows:
            for k in COUNTS:
                sums[k] += float(row.get(k) or 0)
            if "decode_steps" not in row and row.get("steps"):
                sums["decode_steps"] += row["steps"] - 1  # rows written before it was stored
            runs.extend(row.get("accepted_runs") or [])
        return cls(dict(sums), runs)

    def __getitem__(self, key: str) -> float:
        return self.sums.get(key, 0.0)

    @property
    def alpha(self) -> float | None:
        return ratio(self["accepted"], self["accepted"] + self["rejections"])

    @property
    def alpha_draft(self) -> float | None:
        return ratio(self["sub_accepted"], self["sub_accepted"] + self["sub_rejections"])

    @property
    def tau(self) -> float | None:
        return ratio(self["new_tokens"], self["target_forwards"])

    @property
    def gamma(self) -> float | None:
        return ratio(self["drafted"], self["drafting_steps"])

    @property
    def cost_ratio(self) -> float | None:
        if not (self["draft_forwards"] and self["target_forwards"] and self["verify_seconds"]):
            return None
        return (self["draft_seconds"] / self["draft_forwards"]) / (
            self["verify_seconds"] / self["target_forwards"])

    @property
    def guess_cost(self) -> float | None:
        return guess_cost(self["draft_seconds"], self["drafted"],
                          self["decode_verify_seconds"], self["decode_target_forwards"])

    @property
    def predicted_speedup(self) -> float | None:
        return predicted(self.alpha, self.gamma, self.guess_cost)

    @property
    def oracle_speedup(self) -> float | None:
        c = self.guess_cost
        return oracle_speedup_from_runs(self.runs, c) if self.runs and c is not None else None

    @property
    def decode_forward_seconds(self) -> float | None:
        return ratio(self["decode_verify_seconds"], self["decode_target_forwards"])

    def share(self, key: str) -> float | None:
        return ratio(self[key], self["seconds"])


@dataclass
class MethodSummary:
    label: str
    method: str
    kind: str  # "baseline", "draftsman" or "peer"
    exactness: str
    drafter: str | None
    prompts: int
    rows: int
    repeats: int
    new_tokens: float
    seconds: float
    tokens_per_second: float | None
    ms_per_token: float | None
    tokens_per_second_min: float | None
    tokens_per_second_max: float | None
    speedup: float | None
    speedup_median: float | None
    speedup_min: float | None
    speedup_max: float | None
    ttft_ms: float | None
    alpha: float | None
    alpha_draft: float | None
    acceptance_rate: float | None
    tau: float | None
    gamma: float | None
    cost_ratio: float | None
    guess_cost: float | None
    predicted_speedup: float | None
    verify_cost: float | None  # mean verify forward / the baseline's one-token forward
    predicted_speedup_hw: float | None  # with this machine's verify and draft costs
    oracle_speedup: float | None
    target_forwards_per_token: float | None
    draft_forwards_per_token: float | None
    draft_share: float | None
    verify_share: float | None
    other_share: float | None
    peak_rss_mb: float | None
    identical_rate: float | None
    identical_known: int
    divergence_margins: list[float]
    rouge_l_ar: float | None
    bleu_ar: float | None
    rouge_l_ref: float | None
    bleu_ref: float | None
    pass_at_1: float | None
    truncated_rate: float | None  # share of outputs cut at max_new_tokens (finish "length")
    options: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _by_prompt(rows: Iterable[Row]) -> dict[str, dict[int, Row]]:
    out: dict[str, dict[int, Row]] = defaultdict(dict)
    for row in rows:
        out[row["prompt_key"]][int(row["repeat"])] = row
    return out


def _tpt(seconds: float, tokens: float) -> float | None:
    return seconds / tokens if tokens else None


def _mean(values: Iterable[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarise_label(rows: list[Row], baseline: list[Row]) -> MethodSummary:
    """One method's summary, compared with the baseline on the prompts both measured."""
    mine, base = _by_prompt(rows), _by_prompt(baseline)
    shared = sorted(set(mine) & set(base)) if base else sorted(mine)
    seconds = tokens = base_seconds = base_tokens = 0.0
    per_prompt: list[float] = []
    for key in shared:
        s = median(r["seconds"] for r in mine[key].values()) or 0.0
        n = median(r["new_tokens"] for r in mine[key].values()) or 0.0
        seconds, tokens = seconds + s, tokens + n
        if base:
            bs = median(r["seconds"] for r in base[key].values()) or 0.0
            bn = median(r["new_tokens"] for r in base[key].values()) or 0.0
            base_seconds, base_tokens = base_seconds + bs, base_tokens + bn
            mt, bt = _tpt(s, n), _tpt(bs, bn)
            if mt and bt:
                per_prompt.append(bt / mt)
    mine_tpt, base_tpt = _tpt(seconds, tokens), _tpt(base_seconds, base_tokens)
    speedup = base_tpt / mine_tpt if base and mine_tpt and base_tpt else None

    # spread over repeats: each repeat summed over the shared prompts it has
    repeats = sorted({int(r["repeat"]) for r in rows})
    rep_tps: list[float] = []
    rep_speedup: list[float] = []
    for rep in repeats:
        keys = [k for k in shared if rep in mine[k]]
        ms = sum(mine[k][rep]["seconds"] for k in keys)
        mn = sum(mine[k][rep]["new_tokens"] for k in keys)
        if ms > 0:
            rep_tps.append(mn / ms)
        bkeys = [k for k in keys if rep in base.get(k, {})]
        if bkeys and base:
            bs = sum(base[k][rep]["seconds"] for k in bkeys)
            bn = sum(base[k][rep]["new_tokens"] for k in bkeys)
            ms2 = sum(mine[k][rep]["seconds"] for k in bkeys)
            mn2 = sum(mine[k][rep]["new_tokens"] for k in bkeys)
            if bn and mn2 and ms2:
                rep_speedup.append((bs / bn) / (ms2 / mn2))

    used = [r for k in shared for r in mine[k].values()]
    pooled = Pooled.of(used)
    unit = Pooled.of(r for k in shared for r in base.get(k, {}).values()).decode_forward_seconds
    verify_cost = hw = None
    if unit and pooled.decode_forward_seconds:
        verify_cost = pooled.decode_forward_seconds / unit
        if pooled.alpha is not None and pooled.gamma and pooled["decode_steps"]:
            hw = predicted_on_hardware(
                pooled.alpha, pooled.gamma, pooled["draft_seconds"] / pooled["drafted"] / unit,
                verify_cost, pooled["drafting_steps"] / pooled["decode_steps"])
    first = rows[0]
    n_tok = pooled["new_tokens"]
    identical = [r["identical"] for r in used if r.get("identical") is not None]
    margins = [r["divergence_margin"] for r in used if r.get("divergence_margin") is not None]
    has_steps = pooled["target_forwards"] > 0
    bleu_ar = [r["bleu_ar_stats"] for r in used if r.get("bleu_ar_stats")]
    bleu_ref = [r["bleu_ref_stats"] for r in used if r.get("bleu_ref_stats")]
    return MethodSummary(
        label=first["label"],
        method=first.get("method", first["label"]),
        kind=first.get("kind", "draftsman"),
        exactness=first.get("exactness", ""),
        drafter=first.get("drafter"),
        prompts=len(shared),
        rows=len(used),
        repeats=len(repeats),
        new_tokens=tokens,
        seconds=seconds,
        tokens_per_second=ratio(tokens, seconds),
        ms_per_token=1000 * mine_tpt if mine_tpt else None,
        tokens_per_second_min=min(rep_tps) if rep_tps else None,
        tokens_per_second_max=max(rep_tps) if rep_tps else None,
        speedup=speedup,
        speedup_median=median(per_prompt),
        speedup_min=min(rep_speedup) if rep_speedup else None,
        speedup_max=max(rep_speedup) if rep_speedup else None,
        ttft_ms=(1000 * t if (t := median(r.get("ttft_seconds") for r in used)) else None),
        alpha=pooled.alpha,
        alpha_draft=pooled.alpha_draft,
        acceptance_rate=ratio(pooled["accepted"], pooled["drafted"]),
        tau=pooled.tau,
        gamma=pooled.gamma,
        cost_ratio=pooled.cost_ratio,
        guess_cost=pooled.guess_cost,
        predicted_speedup=pooled.predicted_speedup,
        verify_cost=verify_cost,
        predicted_speedup_hw=hw,
        oracle_speedup=pooled.oracle_speedup,
        target_forwards_per_token=ratio(pooled["target_forwards"], n_tok) if has_steps else None,
        draft_forwards_per_token=ratio(pooled["draft_forwards"], n_tok) if has_steps else None,
        draft_share=pooled.share("draft_seconds") if has_steps else None,
        verify_share=pooled.share("verify_seconds") if has_steps else None,
        other_share=pooled.share("other_seconds") if has_steps else None,
        peak_rss_mb=max((r["peak_rss_mb"] for r in used if r.get("peak_rss_mb")), default=None),
        identical_rate=_mean(identical),
        identical_known=len(identical),
        divergence_margins=sorted(margins),
        rouge_l_ar=_mean(r.get("rouge_l_ar") for r in used),
        bleu_ar=corpus_bleu(bleu_ar),
        rouge_l_ref=_mean(r.get("rouge_l_ref") for r in used),
        bleu_ref=corpus_bleu(bleu_ref),
        pass_at_1=_mean(r.get("pass_at_1") for r in used),
        truncated_rate=_mean(r.get("finish") == "length" for r in used if r.get("finish")),
        options=dict(first.get("options") or {}),
    )


def summarise(rows: list[Row], baseline_label: str = "autoregressive") -> list[MethodSummary]:
    """Per-method summaries in first-measured order, the baseline first."""
    by_label: dict[str, list[Row]] = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row)
    baseline = by_label.get(baseline_label, [])
    order = sorted(by_label, key=lambda lab: lab != baseline_label)
    return [summarise_label(by_label[lab], baseline) for lab in order]


def datasets_of(rows: Iterable[Row]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.setdefault(row.get("dataset", ""), None)
    return list(seen)
