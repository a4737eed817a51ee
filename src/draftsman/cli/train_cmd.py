"""`draftsman train ...`: a thin dispatcher over the training modules.

Each module in `TRAIN_MODULES` lives in `draftsman.training` and exposes
`register(train_subparsers)`, which adds its sub-command and sets `func(args) -> int`.
A module that does not exist yet is skipped, so sub-commands can land independently.
"""

from __future__ import annotations

import argparse
import importlib

TRAIN_MODULES = (
    "draftsman.training.align",  # train align: BiLD prediction alignment of a small model
    "draftsman.training.exit_head",  # train exit-head: early-exit heads for pipelined
    "draftsman.training.prompt_tokens",  # train prompt-tokens: parallel prompt decoding
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", help="train small learned pieces (aligned drafts, exit heads, prompt tokens)",
        description="Training commands. Each is resumable and CPU-feasible at small scale.")
    train_subparsers = parser.add_subparsers(dest="train_command", metavar="WHAT")
    parser.set_defaults(func=lambda args: _help(parser))
    for name in TRAIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # not built yet
        module.register(train_subparsers)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
