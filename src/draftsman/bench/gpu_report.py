"""The GPU check's report: what `scripts/gpu_check.py` measured, in one summary.md.

It reads the check's work folder (each file is optional: a check cut off reports what it
has) and writes the tables the GPU issue asks for, each naming the device:
  ceilings.json              copy bandwidth and bf16 matrix rate (bench/device_ceilings.py)
  test-gpu.log               `pytest -m gpu`
  profile-<model>-<mode>.json  forward cost over 1..64 rows (`draftsman profile --json`)
  bench-<name>/results.jsonl  interleaved decoding runs (`draftsman bench`)
and predicts what the real default pair would gain on this GPU from the acceptance measured
on a CPU with real weights (`accepted_runs`, `gammas` of each step) and the cost curve
measured here on random weights of the same shapes. A prediction is labelled as one.

    python -m draftsman.bench.gpu_report WORK [--acceptance CPU_RESULTS_FOLDER]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from draftsman.bench.batch_rates import table as batch_table
from draftsman.bench.device_ceilings import floor_seconds
from draftsman.bench.metrics import summarise
from draftsman.bench.results import ResultsFile
from draftsman.profiling import interpolate

AR, AR_EAGER, HF, HF_COMPILED = "autoregressive", "autoregressive:engine=torch-bf16", "hf", \
    "hf:compiled"
AR_FUSED = "autoregressive:engine=torch-bf16+compiled"  # --static --compile
CONTEXT = 512  # cached tokens the floor and the profiles are taken at


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def latency(work: Path, model: str, mode: str) -> dict[int, float]:
    data = read_json(work / f"profile-{model}-{mode}.json")
    return {int(k): float(v) for k, v in (data or {}).get("latency", {}).items()}


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def tests_section(work: Path) -> list[str]:
    log = work / "test-gpu.log"
    if not log.is_file():
        return ["## `make test-gpu`", "", "not run", ""]
    text = log.read_text()
    tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    failed = [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return ["## `make test-gpu`", "", f"`{tail[-1].strip('= ')}`" if tail else "no summary line "
            "(cut off?)", "", *[f"- {line}" for line in failed], ""]


def curve_section(work: Path, device: str) -> list[str]:
    out: list[str] = []
    for model in ("1.5b", "0.5b", "smollm2"):
        modes = {mode: latency(work, model, mode) for mode in ("eager", "static")}
        rows = sorted(set().union(*modes.values()))
        if not rows:
            continue
        weights = "real" if model == "smollm2" else "random"
        out += [f"### Forward cost, {model} bf16, {CONTEXT} cached tokens ({device}; weights: "
                f"{weights})", "", "| rows | eager ms | eager v(k) | static ms | static v(k) |",
                "|---|---|---|---|---|"]
        for k in rows:
            cells = []
            for mode in ("eager", "static"):
                lat = modes[mode]
                ms = lat.get(k)
                cells += [fmt(ms and ms * 1e3), fmt(ms and lat.get(1) and ms / lat[1])]
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        out.append("")
    return (["## Forward cost curve", "", *out] if out else [])


def bandwidth_floor_ms(work: Path, ceilings: dict[str, Any] | None) -> float | None:
    """The 1.5B's floor from its random folder, kept in WORK/floor.json beside the results
    (the weights stay on the GPU machine: a summary rebuilt from returned files reads it)."""
    saved = work / "floor.json"
    folder = work / "models" / "random-1.5b"
    if ceilings and (folder / "config.json").is_file():
        ms = floor_seconds(folder, CONTEXT, ceilings["copy_gbps"]) * 1e3
        saved.write_text(json.dumps({"floor_ms": ms, "context": CONTEXT}) + "\n")
        return ms
    return json.loads(saved.read_text())["floor_ms"] if saved.is_file() else None


def batched_section(work: Path, device: str) -> list[str]:
    """The batched stage's rates (bench/batch_rates.py), when it ran."""
    path = work / "batch-rates.json"
    if not path.is_file():
        return []
    rows = json.loads(path.read_text())["rows"]
    n = rows[0]["prompts"] if rows else 0
    return [f"## Many requests at once: Engine.generate_many, 1.5B shapes ({device}; weights: "
            "random)", "",
            f"_{n} prompts, each level generating for all of them; tok/s = new tokens over the "
            "call's wall time, prefills included (eager engine: the ragged batched forward has "
            "no static form yet)._", "", batch_table(rows), ""]


def bench_table(rows: list[dict[str, Any]], title: str, floor_ms: float | None) -> list[str]:
    summaries = summarise(rows)
    by_label = {s.label: s for s in summaries}
    ar = by_label.get(AR)
    lines = [f"### {title}", "", "| method | tok/s | ms/token | × AR (static) | τ | identical "
             "| largest margin at a divergence |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        mine = [r for r in rows if r["label"] == s.label]
        same = [r["identical"] for r in mine if r.get("identical") is not None]
        share = f"{sum(same)}/{len(same)}" if same else "–"
        margins = [r["divergence_margin"] for r in mine if r.get("divergence_margin") is not None]
        lines.append(f"| {s.label} | {fmt(s.tokens_per_second, '.1f')} | "
                     f"{fmt(s.ms_per_token)} | {fmt(s.speedup)} | {fmt(s.tau)} | {share} | "
                     f"{fmt(max(margins) if margins else None, '.3f')} |")
    lines += ["", "_identical: output equal to our static AR's; the margin is the target's top-1 "
              "minus top-2 logit where two outputs part (bf16 logits of magnitude 16-32 are "
              "spaced 0.125-0.25 apart: a margin that small is a numerical tie, not a bug)._"]
    if floor_ms and ar and ar.ms_per_token:
        lines += ["", f"Bandwidth floor {floor_ms:.3f} ms/token: AR is "
                      f"{ar.ms_per_token / floor_ms:.2f}× the floor."]
    return lines + [""]


def goals(rows: list[dict[str, Any]], floor_ms: float | None) -> list[str]:
    """The issue's GPU goals on the random-weight 1.5B run."""
    by = {s.label: s for s in summarise(rows)}
    ar = by.get(AR)
    if ar is None or not ar.ms_per_token:
        return []

    def ratio(label: str) -> float | None:
        s = by.get(label)
        return s.ms_per_token / ar.ms_per_token if s and s.ms_per_token else None

    out = ["| goal | measured | met |", "|---|---|---|"]
    checks = [("AR within 2.5× the bandwidth floor",
               floor_ms and ar.ms_per_token / floor_ms, lambda x: x <= 2.5, "×"),
              ("AR ≥ 3× transformers eager", ratio(HF), lambda x: x >= 3.0, "×"),
              ("AR ≥ 1.0× transformers static cache + compile", ratio(HF_COMPILED),
               lambda x: x >= 1.0, "×")]
    fused = by.get(AR_FUSED)
    if fused and fused.ms_per_token and floor_ms:
        checks.insert(1, ("AR with --compile within 2.5× the bandwidth floor",
                          fused.ms_per_token / floor_ms, lambda x: x <= 2.5, "×"))
    for name, value, ok, unit in checks:
        out.append(f"| {name} | {fmt(value)}{unit if value else ''} | "
                   f"{'–' if value is None else ('yes' if ok(value) else 'no')} |")
    return out + [""]


def predicted_speedup(row: dict[str, Any], target: dict[int, float],
                      draft: dict[int, float]) -> float | None:
    """AR time / predicted time of the steps `row` took on the CPU, each step costed on
    this GPU: a verify of g+1 rows, plus g one-row draft forwards when a model drafts."""
    gammas = row.get("gammas")
    if not gammas or not target or 1 not in target:
        return None
    model_draft = bool(row.get("draft_forwards"))
    if model_draft and 1 not in draft:
        return None
    cost = sum(interpolate(target, int(g) + 1) + (g * draft[1] if model_draft else 0.0)
               for g in gammas)
    return row["new_tokens"] * target[1] / cost if cost else None


def prediction_section(acceptance: list[dict[str, Any]], target: dict[int, float],
                       draft: dict[int, float], device: str) -> list[str]:
    by_label: dict[str, list[float]] = {}
    for row in acceptance:
        s = predicted_speedup(row, target, draft)
        if s is not None:
            by_label.setdefault(row["label"], []).append(s)
    if not by_label:
        return []
    best = max(by_label, key=lambda k: sum(by_label[k]) / len(by_label[k]))
    lines = ["## Predicted: the real Qwen2.5-Coder 1.5B + 0.5B pair on this GPU", "",
             f"_Prediction, not a measurement: each step the CPU run took with real weights "
             f"(bf16, greedy, HumanEval + MT-Bench) costed with the static forward curve "
             f"measured on {device} with random weights of the same shapes; prefill left "
             "out._", "", "| method | prompts | predicted × AR |", "|---|---|---|"]
    for label, values in sorted(by_label.items(), key=lambda kv: -sum(kv[1]) / len(kv[1])):
        lines.append(f"| {label} | {len(values)} | {sum(values) / len(values):.2f} |")
    return lines + ["", f"Best predicted: {best}.", ""]


def device_of(rows: Iterable[dict[str, Any]], ceilings: dict[str, Any] | None) -> str:
    if ceilings:
        return str(ceilings["device"])
    for row in rows:
        gpu = (row.get("env") or {}).get("gpu")
        if gpu:
            return str(gpu)
    return "unknown device"


def report(work: Path, acceptance: Path | None = None) -> str:
    ceilings = read_json(work / "ceilings.json")
    random_rows = ResultsFile(work / "bench-random").rows()
    real_rows = ResultsFile(work / "bench-smollm2").rows()
    device = device_of([*random_rows, *real_rows], ceilings)
    env = next((r.get("env") for r in [*random_rows, *real_rows]), None) or {}
    lines = [f"# GPU check on {device}", "",
             f"torch {env.get('torch', '?')}, transformers {env.get('transformers', '?')}, "
             f"draftsman {env.get('git_commit', '?')}; bf16, greedy, 128 new tokens.", ""]
    if ceilings:
        lines += [f"Measured ceilings: device copy {ceilings['copy_gbps']:.0f} GB/s (read + "
                  f"write), bf16 matrix product {ceilings['bf16_tflops']:.0f} TFLOP/s.", ""]
    lines += tests_section(work) + curve_section(work, device)
    floor_ms = bandwidth_floor_ms(work, ceilings)
    if random_rows:
        lines += ["## Decoding, Qwen2.5-Coder-1.5B shapes (weights: random)", "",
                  *bench_table(random_rows, f"1.5B bf16 + 0.5B draft, {device}, weights: random"
                               " (acceptance meaningless: costs only)", floor_ms),
                  *goals(random_rows, floor_ms)]
    lines += batched_section(work, device)
    if real_rows:
        by = {s.label: s for s in summarise(real_rows)}
        exact = [s for s in by.values() if s.kind == "draftsman" and s.exactness == "exact"
                 and s.speedup]
        best = max(exact, key=lambda s: s.speedup, default=None)
        weights = (real_rows[0].get("env") or {}).get("weights", "real")
        lines += [f"## Decoding, SmolLM2-135M-Instruct (weights: {weights})", "",
                  *bench_table(real_rows, f"SmolLM2-135M bf16, {device}, weights: {weights}",
                               None)]
        if best:
            lines += [f"Best exact method: {best.label}, {best.speedup:.2f}× our AR "
                      f"(goal ≥ 2×: {'met' if best.speedup >= 2 else 'not met'}).", ""]
    for path in sorted(work.glob("breakdown-*.md")):
        lines += ["#" + path.read_text(), ""]  # its title one level down
    if acceptance:
        lines += prediction_section(ResultsFile(acceptance).rows(), latency(work, "1.5b", "static"),
                                    latency(work, "0.5b", "static"), device)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write the GPU check's summary.md")
    p.add_argument("work", type=Path)
    p.add_argument("--acceptance", type=Path, default=None,
                   help="a CPU results folder of the real pair (steps' gammas) to predict from")
    args = p.parse_args(argv)
    text = report(args.work, args.acceptance)
    (args.work / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
