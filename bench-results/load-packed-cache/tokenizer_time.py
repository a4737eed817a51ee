"""Seconds a staged cascade's start spends on its tokenizers: the target's and the draft's
tokenizer.json, the vocabulary check between them, and the draft head's kept rows
(draft_vocab=32768). Run from a tree's root with PYTHONPATH=src to time that tree."""

import time
from pathlib import Path

from draftsman.models.draft_vocab import draft_head_rows
from draftsman.text.tokenizer import Tokenizer, check_same_vocabulary

home = Path.home() / ".cache/draftsman/models"
marks = [time.perf_counter()]
target = Tokenizer.from_folder(home / "qwen2.5-coder-1.5b-instruct")
marks.append(time.perf_counter())
draft = Tokenizer.from_folder(home / "qwen2.5-coder-0.5b-instruct")
marks.append(time.perf_counter())
check_same_vocabulary(target, draft, "target", "draft")
marks.append(time.perf_counter())
draft_head_rows(home / "qwen2.5-coder-0.5b-instruct", 32768)
marks.append(time.perf_counter())
steps = ["target tokenizer", "draft tokenizer", "vocabulary check", "draft head rows"]
print(", ".join(f"{s} {b - a:.3f}" for s, a, b in zip(steps, marks[:-1], marks[1:], strict=True))
      + f"; total {marks[-1] - marks[0]:.3f} s")
