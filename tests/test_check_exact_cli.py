"""`draftsman check-exact`: the conformance harness as a command, on a real small model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from draftsman.store.resolve import ensure_model

pytestmark = pytest.mark.real

SMALL = "smollm2-135m-instruct"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsman.cli.main", "check-exact", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def small():
    ensure_model(SMALL)
    return SMALL


def test_prompt_lookup_passes_with_its_coverage(small):
    # at temperature 1 the lookup's guess holds ~97% of the target's mass: 40 seeded draws
    # covered a rejection only by luck; at 3, 60 draws reject it 9 times in 52 guesses
    out = cli("--target", small, "--draft", "prompt-lookup", "--gamma", "2", "--window", "3",
              "--temperature", "3", "--draws", "60", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["passed"] and not result["missing"]
    assert result["outcomes"] == 27  # top-k 3 over 3 tokens
    assert len(result["p_positions"]) == 3 and result["p_joint"] > 0.01 / 4
    assert result["coverage"]["accepted at 1"] > 0 and result["coverage"]["guesses"] > 0


def test_text_report_names_positions_and_paths(small):
    out = cli("--target", small, "--draft", "ngram", "--window", "3", "--draws", "20",
              "--require", "")
    assert out.returncode == 0, out.stderr
    for needle in ("chi-square p", "joint", "paths exercised", "false-alarm rate <= 0.01",
                   "PASSED"):
        assert needle in out.stdout


def test_a_required_path_that_never_ran_fails(small):
    out = cli("--target", small, "--draft", "prompt-lookup", "--window", "3", "--draws", "20",
              "--require", "branches >= 3", "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)["missing"] == ["branches >= 3"]


@pytest.mark.parametrize("args,needle", [
    (["--window", "2"], "--window must be >= 3"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--method", "autoregressive"], "name the method to check"),
    (["--method", "big-little", "--draft", SMALL], "lossy"),
    (["--top-k", "0", "--window", "4", "--draft", "ngram"], "smaller top-k"),
])
def test_bad_input_is_one_clear_line(small, args, needle):
    out = cli("--target", small, *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftsman: error:"), out.stderr
    assert needle in lines[0]
