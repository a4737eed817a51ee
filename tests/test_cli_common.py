"""The shared command-line helpers: comma-separated values, command groups, error lines."""

import argparse

import pytest

from draftsman.cli.common import add_group, csv_items, float_list, positive_ints
from draftsman.errors import InvalidArgumentError


def test_comma_separated_values():
    assert csv_items(" a, b,,c ") == ["a", "b", "c"]
    assert float_list("0.5, 1", "alpha") == [0.5, 1.0]
    assert positive_ints("3,1, 2", "k") == [3, 1, 2]
    with pytest.raises(InvalidArgumentError, match="--alpha wants numbers"):
        float_list("0.5,x", "alpha")
    with pytest.raises(InvalidArgumentError, match="--k wants integers separated by commas"):
        positive_ints("1,two", "k")
    with pytest.raises(InvalidArgumentError, match="--k must be positive integers"):
        positive_ints("0,1", "k")
    with pytest.raises(InvalidArgumentError, match="--k must be positive integers"):
        positive_ints("", "k")


def test_a_bare_group_prints_its_help(capsys):
    parser = argparse.ArgumentParser(prog="draftsman")
    group = add_group(parser.add_subparsers(dest="command"), "things", "VERB",
                      help="things", description="Manage things.")
    group.add_parser("list").set_defaults(func=lambda args: 0)
    args = parser.parse_args(["things"])
    assert args.func(args) == 2 and "Manage things." in capsys.readouterr().out
    args = parser.parse_args(["things", "list"])
    assert args.things_command == "list" and args.func(args) == 0


def test_the_command_line_starts_without_the_test_harness():
    """Every `draftsman` call (and each of a benchmark's subprocesses) builds the whole
    parser: the conformance harness and its scipy.stats (~0.7 s) load only for check-exact."""
    import subprocess
    import sys

    code = ("import sys; from draftsman.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in ('scipy', 'draftsman.testing') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == "[]"


def test_an_unknown_option_names_its_command_and_the_closest_option(capsys):
    from draftsman.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["generate", "hi", "--max-tokens", "5"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "usage: draftsman generate" in err
    assert "unrecognized arguments: --max-tokens 5 (did you mean --max-new-tokens for " \
        "--max-tokens?)" in err
    with pytest.raises(SystemExit):
        main(["models", "list", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "draftsman models: error: unrecognized arguments: --zzzzzz" in err
    assert "did you mean" not in err  # nothing close: no guess
