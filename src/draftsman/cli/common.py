"""Helpers shared by the sub-command modules: comma-separated values, --device, sub-command
registration and the command line a results folder records.

Every parser raises `InvalidArgumentError` naming the flag, so a bad value prints one line.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Iterable

from draftsman.device import DEVICE_HELP
from draftsman.errors import InvalidArgumentError


def command_line() -> str:
    """This process's command as a user would type it again: `draftsman ARGS`, shell-quoted."""
    return shlex.join(["draftsman", *sys.argv[1:]])


def csv_items(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [x.strip() for x in str(text).split(",") if x.strip()]


def float_list(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in csv_items(text)]
    except ValueError:
        raise InvalidArgumentError(f"--{flag} wants numbers separated by commas") from None


def positive_ints(text: str, flag: str) -> list[int]:
    """Integers >= 1 in the order given; at least one."""
    try:
        out = [int(x) for x in csv_items(text)]
    except ValueError:
        raise InvalidArgumentError(
            f"--{flag} wants integers separated by commas: {text!r}") from None
    if not out or min(out) < 1:
        raise InvalidArgumentError(f"--{flag} must be positive integers")
    return out


def register_modules(names: Iterable[str], subparsers: argparse._SubParsersAction) -> None:
    """Import each module and call its `register(subparsers)`. A module that does not exist
    is skipped, so sub-commands can land independently; an import error inside one is not."""
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)


def add_group(subparsers: argparse._SubParsersAction, name: str, metavar: str, *, help: str,
              description: str) -> argparse._SubParsersAction:
    """A sub-command that only holds sub-commands (`draftsman models VERB`); run bare, it
    prints its help and exits 2. Returns the subparsers to add its sub-commands to; the one
    chosen is in `args.<name>_command`."""
    parser = subparsers.add_parser(name, help=help, description=description)
    group = parser.add_subparsers(dest=f"{name}_command", metavar=metavar)
    parser.set_defaults(func=lambda args: _print_help(parser))
    return group


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    """`--device auto|cpu|cuda|cuda:N` (checked by draftsman.device.resolve_device)."""
    parser.add_argument("--device", default="auto", metavar="DEVICE", help=DEVICE_HELP)
