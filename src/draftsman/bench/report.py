"""summary.md, summary.json, report.html and `--compare`, all rebuilt from results.jsonl.

Tables are built once as data (`Table`) and rendered to Markdown and HTML, so the two files
always show the same numbers. The HTML embeds every plot (base64) and links the PNG next to
it, so it reads offline on its own or inside the folder.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsman.bench.controller_report import controller_plots, controller_tables
from draftsman.bench.metrics import MethodSummary, datasets_of, summarise
from draftsman.bench.plots import make_plots
from draftsman.bench.results import ResultsFile, Row, invocations
from draftsman.bench.set_report import set_summaries, set_table
from draftsman.bench.tables import CSS, Table, num, pct, table_html, table_md, times
from draftsman.errors import InvalidArgumentError

SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"


# ----------------------------------------------------------------------------- formatting

def spread(value: float | None, low: float | None, high: float | None, repeats: int) -> str:
    if value is None:
        return "—"
    text = f"{value:.2f}×"
    if repeats > 1 and low is not None and high is not None:
        text += f" ({low:.2f}–{high:.2f})"
    return text


def margins(s: MethodSummary) -> str:
    if not s.divergence_margins:
        return "—"
    m = s.divergence_margins
    return f"{len(m)}: median {m[len(m) // 2]:.3f}, min {m[0]:.3f}"


# ----------------------------------------------------------------------------- tables

def speed_table(summaries: list[MethodSummary], title: str = "Speed") -> Table:
    rows = [[s.label, s.drafter or "—", num(s.gamma), num(s.alpha), num(s.tau),
             num(s.ms_per_token, 1), num(s.tokens_per_second),
             spread(s.speedup, s.speedup_min, s.speedup_max, s.repeats),
             times(s.speedup_median), times(s.predicted_speedup),
             times(s.predicted_speedup_hw), times(s.oracle_speedup)]
            for s in summaries]
    return Table(title, ["method", "drafter", "γ", "α", "τ", "ms/token", "tok/s", "speedup",
                         "median/prompt", "predicted", "predicted (this CPU)", "oracle"], rows,
                 "γ: mean tokens drafted per step; α: per-guess acceptance (MLE); τ: tokens "
                 "per target forward; speedup: autoregressive time per token / method time "
                 "per token summed over prompts (min–max over repeats); predicted: "
                 "(1−α^(γ+1))/((1−α)(γc+1)) with the measured α, γ, c (the paper's model: a "
                 "verify forward costs one token's); predicted (this CPU): the same with the "
                 "measured cost of a verify forward; oracle: section 3.5 bound on the "
                 "observed accepted runs.")


def time_table(summaries: list[MethodSummary]) -> Table:
    rows = [[s.label, num(s.target_forwards_per_token), num(s.draft_forwards_per_token),
             pct(s.draft_share), pct(s.verify_share), pct(s.other_share), num(s.guess_cost, 3),
             num(s.cost_ratio, 3), num(s.verify_cost), num(s.ttft_ms, 0),
             num(s.peak_rss_mb, 0)] for s in summaries]
    return Table("Where the time goes",
                 ["method", "target fwd/token", "draft fwd/token", "draft", "verify", "other",
                  "c", "c/forward", "verify cost", "TTFT ms", "peak RSS MB"], rows,
                 "Shares of wall time from the Steps' timers. c (used for the prediction): "
                 "drafting seconds per guess / seconds per target decode forward; verify cost: "
                 "a verify forward / autoregressive's one-token forward; c/forward: "
                 "per draft-model forward (the engine's cost_ratio, prefill included). Peak "
                 "RSS is the process high-water mark during the generation (all loaded "
                 "models included).")


def staged_table(summaries: list[MethodSummary]) -> Table | None:
    staged = [s for s in summaries if s.alpha_draft is not None]
    if not staged:
        return None
    rows = [[s.label, num(s.gamma), str(s.options.get("subgamma", "4")), num(s.alpha_draft),
             num(s.alpha), times(s.speedup), times(s.predicted_speedup)] for s in staged]
    return Table("Staged: α per stage", ["method", "γ", "subγ", "α_draft", "α_target",
                                         "speedup", "predicted"], rows,
                 "α_draft: the middle model accepting the sub-drafter's guesses; α_target: "
                 "the target accepting the middle model's.")


def quality_table(summaries: list[MethodSummary], greedy: bool) -> Table:
    rows = []
    for s in summaries:
        ident = (f"{pct(s.identical_rate)} of {s.identical_known}"
                 if s.identical_rate is not None else "—")
        rows.append([s.label, s.exactness or "—", ident, margins(s), num(s.rouge_l_ar, 3),
                     num(s.bleu_ar, 1), num(s.rouge_l_ref, 3), num(s.bleu_ref, 1),
                     pct(s.pass_at_1), pct(s.truncated_rate)])
    note = ("identical: outputs token-for-token equal to autoregressive decoding; margins: "
            "the target's top-1 minus top-2 logit at the first divergence (near 0: a "
            "numerical tie, large: a real difference). pass@1 counts an output cut at "
            "max-new-tokens as a failure: raise --max-new-tokens when most are cut.")
    if not greedy:
        note += " Sampling: identical outputs are not expected from exact methods."
    return Table("Exactness and quality",
                 ["method", "exactness", "identical", "margins at divergence",
                  "ROUGE-L vs AR", "BLEU vs AR", "ROUGE-L vs ref", "BLEU vs ref", "pass@1",
                  "cut at max tokens"],
                 rows, note)


def tables(rows: list[Row], baseline: str = "autoregressive") -> tuple[list[MethodSummary],
                                                                         list[Table]]:
    summaries = summarise(rows, baseline)
    greedy = all((r.get("settings") or {}).get("temperature", 0) == 0 for r in rows)
    out = [speed_table(summaries), time_table(summaries)]
    out += [t for t in (staged_table(summaries),) if t]
    out.append(quality_table(summaries, greedy))
    out += [t for t in (set_table(rows, baseline),) if t]
    return summaries, out


# ----------------------------------------------------------------------------- rendering

def context(rows: list[Row], config: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Run facts for the report header (from the rows, so a resumed run reports itself)."""
    first = rows[0] if rows else {}
    settings, env = first.get("settings") or {}, first.get("env") or {}
    prompts = len({r["prompt_key"] for r in rows})
    items = [
        ("target", str(settings.get("target"))),
        ("draft", str(settings.get("draft") or "default")),
        ("datasets", ", ".join(datasets_of(rows))),
        ("prompts (× turns)", str(prompts)),
        ("repeats", str(max((int(r["repeat"]) for r in rows), default=-1) + 1)),
        ("max new tokens", str(settings.get("max_new_tokens"))),
        ("temperature", str(settings.get("temperature"))),
        ("dtype", str(env.get("dtype"))),
        *([("numerics", str(settings["numerics"]))] if "numerics" in settings else []),
        ("CPU", f"{env.get('cpu')} ({env.get('cores')} cores, {env.get('threads')} threads)"),
        ("torch / transformers", f"{env.get('torch')} / {env.get('transformers')}"),
        ("commit", str(env.get("git_commit"))),
    ]
    if config and config.get("command"):
        items.append(("command", str(config["command"])))
        if config.get("resume"):
            items[-1] = ("command (last resume)", str(config["command"]))
    return items


def render_md(rows: list[Row], tbls: list[Table], config: dict[str, Any] | None,
              plots: list[Path]) -> str:
    parts = ["# draftsman benchmark", ""]
    parts += [f"- **{k}**: {v}" for k, v in context(rows, config)]
    parts.append("")
    parts += [table_md(t) for t in tbls]
    if plots:
        parts += ["### Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(parts) + "\n"


def render_html(rows: list[Row], tbls: list[Table], config: dict[str, Any] | None,
                plots: list[Path]) -> str:
    facts = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
                    for k, v in context(rows, config))
    figures = []
    for p in plots:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        figures.append(f"<figure><a href='{html.escape(p.name)}'><img alt='{html.escape(p.name)}'"
                       f" src='data:image/png;base64,{data}'></a>"
                       f"<figcaption>{html.escape(p.name)}</figcaption></figure>")
    body = "".join(table_html(t) for t in tbls)
    plot_section = "<h2>Plots</h2>" + "".join(figures) if figures else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>draftsman benchmark"
            f"</title><style>{CSS}</style></head><body><h1>draftsman benchmark</h1>"
            f"<dl>{facts}</dl>{body}{plot_section}</body></html>\n")


def write_report(out: str | Path, rows: list[Row] | None = None,
                 config: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write summary.md, summary.json, the plots and report.html into `out`."""
    out = Path(out)
    if rows is None:
        rows = ResultsFile(out).rows()
    if config is None:
        runs = invocations(out)
        config = runs[0] if runs else None  # the command that started the run
    summaries, tbls = tables(rows)
    tbls += controller_tables(out, rows, summaries)
    plots = make_plots(out, summaries) + controller_plots(out, rows, summaries)
    paths = {"summary": out / SUMMARY_MD, "json": out / SUMMARY_JSON, "html": out / REPORT_HTML}
    paths["summary"].write_text(render_md(rows, tbls, config, plots), encoding="utf-8")
    paths["json"].write_text(json.dumps({"context": dict(context(rows, config)),
                                         "methods": [s.as_dict() for s in summaries],
                                         "sets": set_summaries(rows)},
                                        indent=1), encoding="utf-8")
    paths["html"].write_text(render_html(rows, tbls, config, plots), encoding="utf-8")
    for p in plots:
        paths[p.stem] = p
    return paths


# ----------------------------------------------------------------------------- compare

def _delta(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "—"
    return f"{100 * (b - a) / a:+.1f}%"


def compare(a: str | Path, b: str | Path) -> str:
    """A Markdown diff of two result folders: per method, A vs B, plus changed settings."""
    rows_a, rows_b = ResultsFile(a).rows(), ResultsFile(b).rows()
    for folder, rows in ((a, rows_a), (b, rows_b)):
        if not rows:
            raise InvalidArgumentError(f"{folder} has no results.jsonl rows")
    sa = {s.label: s for s in summarise(rows_a)}
    sb = {s.label: s for s in summarise(rows_b)}
    labels = list(dict.fromkeys([*sa, *sb]))

    def pair(label: str, get: Callable[[MethodSummary], float | None],
             fmt: Callable[[float | None], str]) -> list[str]:
        x = get(sa[label]) if label in sa else None
        y = get(sb[label]) if label in sb else None
        return [fmt(x), fmt(y), _delta(x, y)]

    rows = [[lab,
             *pair(lab, lambda s: s.tokens_per_second, num),
             *pair(lab, lambda s: s.speedup, times),
             *pair(lab, lambda s: s.alpha, num),
             *pair(lab, lambda s: s.identical_rate, pct)] for lab in labels]
    table = Table(f"A = {a}, B = {b}",
                  ["method", "tok/s A", "tok/s B", "Δ", "speedup A", "speedup B", "Δ",
                   "α A", "α B", "Δ", "identical A", "identical B", "Δ"], rows)
    ctx_a, ctx_b = dict(context(rows_a, None)), dict(context(rows_b, None))
    changed = [f"- {k}: {ctx_a.get(k)} → {ctx_b.get(k)}" for k in ctx_a
               if ctx_a.get(k) != ctx_b.get(k)]
    text = table_md(table)
    if changed:
        text += "\nChanged between A and B:\n" + "\n".join(changed) + "\n"
    return text
