"""scripts/install_by_rename.sh: how the llama.cpp build installs its libraries. A running
process that mapped the old file must keep it intact: an unchanged file is left alone, a
changed one replaced by rename (a new inode), never rewritten in place."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_by_rename.sh"


def install(src: Path, dest: Path) -> None:
    subprocess.run(["bash", "-c", f'source "{SCRIPT}" && install_file "$0" "$1"', src, dest],
                   check=True)


def test_unchanged_files_stay_and_changed_ones_are_replaced_by_rename(tmp_path):
    build, lib = tmp_path / "build", tmp_path / "lib"
    build.mkdir()
    lib.mkdir()
    (build / "libggml.so").write_bytes(b"v1")
    (build / "libggml.so.1").symlink_to("libggml.so")
    install(build / "libggml.so", lib)
    install(build / "libggml.so.1", lib)
    first = (lib / "libggml.so").stat().st_ino
    assert (lib / "libggml.so").read_bytes() == b"v1"
    assert (lib / "libggml.so.1").readlink() == Path("libggml.so")
    held = (lib / "libggml.so").open("rb")  # a process holding the old file
    install(build / "libggml.so", lib)
    assert (lib / "libggml.so").stat().st_ino == first  # unchanged: not touched
    (build / "libggml.so").write_bytes(b"v2")
    install(build / "libggml.so", lib)
    assert (lib / "libggml.so").read_bytes() == b"v2"
    assert (lib / "libggml.so").stat().st_ino != first  # a new file, renamed over the old
    assert held.read() == b"v1"  # what the holder mapped is intact
    held.close()
    assert sorted(p.name for p in lib.iterdir()) == ["libggml.so", "libggml.so.1"]  # no temps
