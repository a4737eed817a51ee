"""Output quality and agreement: ROUGE-L, BLEU, HumanEval pass@1, first divergence.

- ROUGE-L is the F-measure of `rouge-score` (stemming on); BLEU comes from `sacrebleu`.
  A row stores BLEU's sufficient statistics so a summary can compute *corpus* BLEU by
  summing them (`corpus_bleu`), which is what papers report, not a mean of sentence BLEUs.
- pass@1 runs the extracted program and the dataset's `check(entry_point)` in a separate
  Python process (isolated mode, own session, memory limit, timeout). A timeout or any
  non-zero exit is a failure.
- The logit margin at a divergence is the target's top-1 minus top-2 logit after the common
  prefix: near 0 means the two outputs split on a numerical tie, a large margin means the
  method emitted a token the target would not have.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from draftsman.models.base import LAST

BleuStats = list[float]  # 4 correct counts, 4 totals, hypothesis length, reference length


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, reference: str) -> float:
    return float(_rouge().score(reference, prediction)["rougeL"].fmeasure)


def bleu_stats(prediction: str, reference: str) -> BleuStats:
    from sacrebleu.metrics import BLEU

    score = BLEU().corpus_score([prediction], [[reference]])
    return [*score.counts, *score.totals, score.sys_len, score.ref_len]


def corpus_bleu(stats: list[BleuStats]) -> float | None:
    """BLEU (0-100) of a corpus from per-sentence statistics (exponential smoothing)."""
    if not stats:
        return None
    from sacrebleu.metrics import BLEU

    total = [sum(s[i] for s in stats) for i in range(10)]
    correct, totals = [int(x) for x in total[:4]], [int(x) for x in total[4:8]]
    return float(BLEU.compute_bleu(correct, totals, int(total[8]), int(total[9]),
                                   smooth_method="exp").score)


# ----------------------------------------------------------------------------- agreement


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, len of the shorter if one is a prefix of the
    other (and the lengths differ), None when identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Margin:
    margin: float  # top-1 minus top-2 logit
    top1: int
    top2: int


def logit_margin(model: Any, ids: list[int]) -> Margin:
    """The target's top-2 logit margin for the token after `ids` (one untimed forward)."""
    cache = model.new_cache(len(ids) + 1)
    tokens = torch.tensor([ids], dtype=torch.long)
    positions = torch.arange(len(ids), dtype=torch.long)[None]
    logits = model(tokens, positions, cache, logits_at=LAST).logits[0, -1].float()
    top = logits.topk(2)
    return Margin(float(top.values[0] - top.values[1]), int(top.indices[0]),
                  int(top.indices[1]))


# ----------------------------------------------------------------------------- HumanEval

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The code in a model's answer: the first fenced block that defines `entry_point`, else
    the first fenced block (an unclosed fence runs to the end), else the whole answer."""
    blocks = [m.group(2) for m in _FENCE.finditer(answer)]
    if not blocks:
        return answer
    if entry_point:
        for block in blocks:
            if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", block, re.M):
                return block
    return blocks[0]


def humaneval_program(answer: str, metadata: dict[str, Any]) -> str:
    """A runnable test program: the prompt (imports, helpers), the completion, the tests.

    A completion that defines the entry point replaces the prompt's stub (it is defined
    later); one that does not is taken as the body that continues the prompt.
    """
    entry = metadata["entry_point"]
    code = extract_code(answer, entry)
    prompt = metadata.get("prompt") or ""
    defines = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M) is not None
    body = prompt.rstrip("\n") + "\n    pass\n\n" + code if defines else prompt + code
    return f"{body}\n\n{metadata['test']}\n\ncheck({entry})\n"


def _limit_memory() -> None:  # runs in the child before exec
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    except (ImportError, ValueError, OSError):
        pass


def run_program(program: str, timeout: float = 10.0) -> tuple[bool, str]:
    """Run `program` in a fresh isolated interpreter; (passed, last lines of output)."""
    with tempfile.TemporaryDirectory(prefix="draftsman-pass1-") as tmp:
        path = os.path.join(tmp, "candidate.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program)
        proc = subprocess.Popen(
            [sys.executable, "-I", path], cwd=tmp, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=_limit_memory,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"},
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.communicate()
            return False, f"timeout after {timeout:g} s"
    return proc.returncode == 0, "\n".join(out.strip().splitlines()[-3:])


def pass_at_1(answer: str, metadata: dict[str, Any], timeout: float = 10.0) -> bool:
    """Does the answer pass the HumanEval problem's tests (one sample: pass@1)?"""
    passed, _ = run_program(humaneval_program(answer, metadata), timeout)
    return passed
