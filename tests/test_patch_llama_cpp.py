"""scripts/patch_llama_cpp.py: the mend of ggml's AMX tile configuration that the llama.cpp
build applies (without it GCC 12 drops the configuration's stores and the first multi-row AMX
matmul segfaults)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from draftsman.backends.llama_cpp import install_dir

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "patch_llama_cpp.py"
SPEC = importlib.util.spec_from_file_location("patch_llama_cpp", SCRIPT)
patch = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(patch)

# the function as the pinned llama.cpp writes it (ggml-cpu/amx/mmq.cpp), shortened
CONFIG_INIT = """inline void ggml_tile_config_init(void) {
    static thread_local bool done = false;

    if (done) {
        return;
    }

    alignas(64) tile_config_t tc = {};
    tc.rows[0] = 8;   tc.colsb[0] = 64;
    tc.rows[7] = 16;  tc.colsb[7] = 64;

    _tile_loadconfig(&tc);
    done = true;
}
"""


def source_tree(tmp_path: Path, text: str) -> Path:
    path = tmp_path / patch.MMQ
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return tmp_path


def test_the_barrier_goes_right_before_the_load_and_the_load_runs_every_call(tmp_path):
    src = source_tree(tmp_path, CONFIG_INIT)
    assert patch.mend(src)
    text = (src / patch.MMQ).read_text()
    lines = text.splitlines()
    load = lines.index(patch.LOAD.rstrip("\n"))
    assert lines[load - 1] == patch.BARRIER.rstrip("\n")
    assert "tc.rows[7] = 16;" in lines[load - 3]  # the stores stay where they were
    assert "done" not in text  # no once-per-thread shortcut
    assert lines[load + 1] == "}"
    assert not patch.mend(src)  # idempotent: a second build leaves it as it is
    assert (src / patch.MMQ).read_text() == text
    assert text.count("__asm__") == 1


def test_a_source_with_the_first_mend_only_gets_the_second(tmp_path):
    """A tree mended before the second mend existed (one build on the AMX Xeon)."""
    first = CONFIG_INIT.replace(patch.LOAD, patch.BARRIER + patch.LOAD)
    src = source_tree(tmp_path, first)
    assert patch.mend(src)
    assert (src / patch.MMQ).read_text() == patch_all(CONFIG_INIT)


def patch_all(text: str) -> str:
    for _, vendored, mended in patch.MENDS:
        text = text.replace(vendored, mended)
    return text


def test_a_source_it_was_not_written_for_is_refused(tmp_path):
    src = source_tree(tmp_path, CONFIG_INIT.replace("_tile_loadconfig(&tc);", "load(&tc);"))
    with pytest.raises(SystemExit, match="does not hold"):
        patch.mend(src)
    twice = source_tree(tmp_path / "two", CONFIG_INIT + CONFIG_INIT)
    with pytest.raises(SystemExit, match="does not hold"):
        patch.mend(twice)


def test_command_line(tmp_path):
    src = source_tree(tmp_path, CONFIG_INIT)
    run = [sys.executable, str(SCRIPT), str(src)]
    first = subprocess.run(run, capture_output=True, text=True, check=True)
    again = subprocess.run(run, capture_output=True, text=True, check=True)
    assert "mended" in first.stdout and "already mended" in again.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert bad.returncode != 0 and "usage" in bad.stderr


def test_the_built_source_is_mended():
    """The source `make setup` built from holds the mend (where it has been built here)."""
    trees = list((install_dir() / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))
    if not trees:
        pytest.skip("llama.cpp has not been built here (scripts/build_llama_cpp.sh)")
    for tree in trees:
        text = (tree / patch.MMQ).read_text()
        assert all(mended in text for _, _, mended in patch.MENDS)
