"""`draftsman` command line: one sub-command module per verb.

Each module in `draftsman.cli` exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. Errors meant for the user (`DraftsmanError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from draftsman.cli.common import register_modules
from draftsman.errors import DraftsmanError

COMMAND_MODULES = (
    "draftsman.cli.generate_cmd",
    "draftsman.cli.models_cmd",
    "draftsman.cli.theory_cmd",
    "draftsman.cli.bench_cmd",
    "draftsman.cli.serve_cmd",
    "draftsman.cli.loadtest_cmd",
    "draftsman.cli.train_cmd",
    "draftsman.cli.analyze_cmd",
    "draftsman.cli.profile_cmd",
    "draftsman.cli.check_exact_cmd",
    "draftsman.cli.pipelined_worker_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftsman",
        description=(
            "Faster LLM generation without changing what is generated: a cheap guesser "
            "proposes tokens, the target model checks them in one forward pass."
        ),
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_modules(COMMAND_MODULES, subparsers)
    parser.commands = subparsers.choices  # name -> its parser, for main's error lines
    return parser


def unrecognized(extra: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's line for arguments nobody took, with the closest option of `parser` for a
    mistyped one (--max-tokens: did you mean --max-new-tokens?)."""
    options = [o for a in parser._actions for o in a.option_strings]
    hints = [f"{close[0]} for {name}" for name in (a.split("=")[0] for a in extra)
             if name.startswith("--")
             for close in [difflib.get_close_matches(name, options, n=1)] if close]
    return (f"unrecognized arguments: {' '.join(extra)}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else ""))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage, not the top level's
        command = parser.commands.get(args.command) if args.command else None
        (command or parser).error(unrecognized(extra, command or parser))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except DraftsmanError as exc:
        print(f"draftsman: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftsman: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
