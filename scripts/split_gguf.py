#!/usr/bin/env python3
"""Split a file (a pulled GGUF) into parts of at most PART_SIZE bytes, for carrying it to an
offline machine; `join_gguf.py` puts it back together there and checks every byte.

    scripts/split_gguf.py FILE PART_SIZE [--out-dir DIR]

PART_SIZE is bytes, or a number with K, M or G (powers of 1024): 500M, 2G. Writes
FILE.part000, FILE.part001, ... and FILE.parts.json, the manifest naming each part's size and
SHA-256 and the whole file's. The manifest is written last: parts without one are an
unfinished split. Needs only the Python standard library (it runs before draftsman is
installed, and where it never will be).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

CHUNK = 8 << 20
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MANIFEST_SUFFIX = ".parts.json"


def parse_size(text: str) -> int:
    """'500M' -> 524288000; raises ValueError on anything but a positive size."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    number = text[: len(text) - len(unit)]
    if not number.isdigit() or int(number) * UNITS[unit] < 1:
        raise ValueError(f"PART_SIZE must be a positive size like 500M or 2G, got {text!r}")
    return int(number) * UNITS[unit]


def part_name(file_name: str, index: int) -> str:
    return f"{file_name}.part{index:03d}"


def split(path: Path, part_size: int, out_dir: Path) -> Path:
    """Write the parts and the manifest into `out_dir`; returns the manifest's path.

    Refuses to overwrite an earlier split (stale parts of another split would be joined)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / (path.name + MANIFEST_SUFFIX)
    stale = sorted(out_dir.glob(f"{path.name}.part[0-9]*")) + (
        [manifest_path] if manifest_path.exists() else [])
    if stale:
        raise ValueError(f"{stale[0]} already exists; remove the earlier split first")
    whole = hashlib.sha256()
    parts = []
    with open(path, "rb") as src:
        index = 0
        while True:
            name = part_name(path.name, index)
            digest, written = hashlib.sha256(), 0
            with open(out_dir / name, "wb") as sink:
                while written < part_size:
                    chunk = src.read(min(CHUNK, part_size - written))
                    if not chunk:
                        break
                    digest.update(chunk)
                    whole.update(chunk)
                    sink.write(chunk)
                    written += len(chunk)
            if written == 0 and index > 0:  # the file ended exactly on a part boundary
                (out_dir / name).unlink()
                break
            parts.append({"name": name, "size": written, "sha256": digest.hexdigest()})
            print(f"{name}: {written} bytes", file=sys.stderr)
            index += 1
            if written < part_size:
                break
    manifest = {"file": path.name, "size": sum(p["size"] for p in parts),
                "sha256": whole.hexdigest(), "part_size": part_size, "parts": parts}
    tmp = manifest_path.with_name(manifest_path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, manifest_path)
    return manifest_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, metavar="FILE")
    parser.add_argument("part_size", metavar="PART_SIZE", help="bytes, or e.g. 500M, 2G")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where to write the parts (default: next to FILE)")
    args = parser.parse_args(argv)
    try:
        if not args.file.is_file():
            raise ValueError(f"{args.file}: no such file")
        manifest = split(args.file, parse_size(args.part_size), args.out_dir or args.file.parent)
    except (ValueError, OSError) as exc:
        print(f"split_gguf: error: {exc}", file=sys.stderr)
        return 2
    print(manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
