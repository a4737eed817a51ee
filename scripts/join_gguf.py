#!/usr/bin/env python3
"""Join the parts written by `split_gguf.py` back into the original file, checking each
part's SHA-256 and then the whole file's against the manifest.

    scripts/join_gguf.py FILE.parts.json [--out PATH]

The parts are read from the manifest's folder. The file is assembled under a temporary name
next to PATH (default: the manifest's folder / the original name) and renamed into place
only when every hash matched: a missing, short or corrupted part stops with a one-line
error naming it, and leaves no output. Standard library only, like `split_gguf.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

CHUNK = 8 << 20


def join(manifest_path: Path, out: Path | None = None) -> Path:
    """Assemble and verify; returns the output path. ValueError names the first problem."""
    manifest = json.loads(manifest_path.read_text())
    folder = manifest_path.parent
    out = out or folder / Path(manifest["file"]).name  # names only: never outside the folder
    if out.exists():
        raise ValueError(f"{out} already exists; remove it or pass --out")
    partial = out.with_name(f".{out.name}.joining-{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with open(partial, "wb") as sink:
            for part in manifest["parts"]:
                path = folder / Path(part["name"]).name
                if not path.is_file():
                    raise ValueError(f"{path}: missing part")
                if path.stat().st_size != part["size"]:
                    raise ValueError(f"{path}: {path.stat().st_size} bytes, expected "
                                     f"{part['size']}")
                digest = hashlib.sha256()
                with open(path, "rb") as src:
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        whole.update(chunk)
                        sink.write(chunk)
                if digest.hexdigest() != part["sha256"]:
                    raise ValueError(f"{path}: corrupted part, SHA-256 expected "
                                     f"{part['sha256']}, got {digest.hexdigest()}")
            sink.flush()
            os.fsync(sink.fileno())
        if whole.hexdigest() != manifest["sha256"]:
            raise ValueError(f"{out.name}: joined SHA-256 expected {manifest['sha256']}, "
                             f"got {whole.hexdigest()}")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, metavar="FILE.parts.json")
    parser.add_argument("--out", type=Path, default=None,
                        help="output file (default: the original name, next to the manifest)")
    args = parser.parse_args(argv)
    try:
        out = join(args.manifest, args.out)
    except (ValueError, OSError, KeyError) as exc:
        print(f"join_gguf: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
