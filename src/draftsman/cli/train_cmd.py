"""`draftsman train ...`: a thin dispatcher over the training modules.

Each module in `TRAIN_MODULES` lives in `draftsman.training` and exposes
`register(train_subparsers)`, which adds its sub-command and sets `func(args) -> int`.
A module that does not exist yet is skipped, so sub-commands can land independently.
"""

from __future__ import annotations

import argparse

from draftsman.cli.common import add_group, register_modules

TRAIN_MODULES = (
    "draftsman.training.align",  # train align: BiLD prediction alignment of a small model
    "draftsman.training.exit_head",  # train exit-head: early-exit heads for pipelined
    "draftsman.training.prompt_tokens",  # train prompt-tokens: parallel prompt decoding
)


def register(subparsers: argparse._SubParsersAction) -> None:
    train_subparsers = add_group(
        subparsers, "train", "WHAT",
        help="train small learned pieces (aligned drafts, exit heads, prompt tokens)",
        description="Training commands. Each is resumable and CPU-feasible at small scale.")
    register_modules(TRAIN_MODULES, train_subparsers)
