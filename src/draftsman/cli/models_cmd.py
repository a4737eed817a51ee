"""`draftsman models ...`: list, pull, verify, path, rm and convert model weights.

Messages go to stderr; stdout carries only results (`path` prints just the path), so
`$(draftsman models path NAME)` works in scripts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftsman.cli.common import add_group
from draftsman.errors import InvalidArgumentError
from draftsman.store.catalogue import CATALOGUE, get_entry
from draftsman.store.home import draftsman_home, gguf_path
from draftsman.store.integrity import sha256_file
from draftsman.store.pull import install_converted, pull_model, remove_model
from draftsman.store.resolve import resolve_gguf, resolve_model
from draftsman.store.status import model_status, verify_model

_DTYPE_CHOICES = ("bfloat16", "float16", "float32")


def register(subparsers: argparse._SubParsersAction) -> None:
    verbs = add_group(
        subparsers, "models", "VERB",
        help="manage model weights (catalogue, pull, verify, convert)",
        description="Manage the model store ($DRAFTSMAN_HOME, default ~/.cache/draftsman).")

    p = verbs.add_parser("list", help="catalogue models, their size and whether pulled")
    p.set_defaults(func=cmd_list)

    p = verbs.add_parser("pull", help="download, verify and convert catalogue models")
    p.add_argument("names", nargs="+", metavar="NAME", help="catalogue name(s), or 'all'")
    p.add_argument("--dtype", choices=_DTYPE_CHOICES, default=None,
                   help="dtype of the converted weights (default: bfloat16, or as installed)")
    p.add_argument("--force", action="store_true", help="convert again even if pulled")
    p.add_argument("--from-gguf", type=Path, default=None, metavar="FILE",
                   help="install NAME from this local GGUF file instead of downloading it "
                        "(offline machines); refused unless it has the pinned SHA-256")
    p.set_defaults(func=cmd_pull)

    p = verbs.add_parser("verify", help="re-hash a pulled model (GGUF and converted folder)")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_verify)

    p = verbs.add_parser("path", help="print the converted folder of a model")
    p.add_argument("name", metavar="SPEC",
                   help="catalogue name, model folder, .gguf file or hf:owner/name")
    p.add_argument("--gguf", action="store_true", help="print the GGUF file instead")
    p.set_defaults(func=cmd_path)

    p = verbs.add_parser("rm", help="delete a pulled model (GGUF and converted folder)")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_rm)

    p = verbs.add_parser(
        "random", help="a folder with another model's architecture and random weights",
        description="Write OUT_DIR: LIKE's config and tokenizer with random weights, for "
                    "timing an architecture without its weights (every bench row timed on it "
                    "says weights: random).")
    p.add_argument("like", metavar="LIKE", help="catalogue name or model folder")
    p.add_argument("out", type=Path, metavar="OUT_DIR", help="must not exist yet")
    p.add_argument("--dtype", choices=_DTYPE_CHOICES, default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the random weights are drawn")
    p.set_defaults(func=cmd_random)

    p = verbs.add_parser("convert", help="convert any GGUF file into a Hugging Face folder")
    p.add_argument("gguf", type=Path, metavar="FILE.gguf")
    p.add_argument("out", type=Path, metavar="OUT_DIR", help="must not exist yet")
    p.add_argument("--dtype", choices=_DTYPE_CHOICES, default="bfloat16")
    p.set_defaults(func=cmd_convert)


def cmd_list(args: argparse.Namespace) -> int:
    rows = [("NAME", "SIZE", "ROLE", "STATUS", "DESCRIPTION")]
    for entry in CATALOGUE.values():
        status = model_status(entry.name)
        rows.append((entry.name, f"{entry.size / 1e9:.2f} GB", entry.role, status.describe(),
                     entry.description))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
              + "  " + row[4])
    print(f"\nstore: {draftsman_home()}", file=sys.stderr)
    print(packed_usage(), file=sys.stderr)
    return 0


def packed_usage() -> str:
    """One line on the packed-weight entries (models/packed_cache.py): where, how many, how
    much of the budget."""
    from draftsman.models.packed_cache import budget_bytes, entries, packed_dir

    kept = entries()
    used = sum(size for _, size in kept.values())
    return (f"packed weights: {len(kept)} entr{'y' if len(kept) == 1 else 'ies'}, "
            f"{used / 1e9:.1f} of {budget_bytes() / 1e9:.0f} GB in {packed_dir()}")


def cmd_pull(args: argparse.Namespace) -> int:
    names = list(CATALOGUE) if args.names == ["all"] else args.names
    for name in names:
        get_entry(name)  # fail on a typo before downloading anything
    if args.from_gguf is not None and len(names) != 1:
        raise InvalidArgumentError("--from-gguf installs one model: give exactly one NAME")
    for name in names:
        result = pull_model(name, dtype=args.dtype, force=args.force, source=args.from_gguf)
        if not result.did_nothing:
            steps = ", ".join(f"{step} {secs:.1f} s" for step, secs in result.seconds.items())
            print(f"{name}: pulled ({steps}) -> {result.folder}", file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    problems = verify_model(args.name, progress=True)
    if problems:
        for line in problems:
            print(f"CORRUPTED {line}")
        print(f"{args.name}: verification failed; run: draftsman models pull {args.name} "
              "--force (or rm, then pull)", file=sys.stderr)
        return 1
    print(f"{args.name}: OK")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    path = resolve_gguf(args.name, pull=False) if args.gguf else resolve_model(args.name,
                                                                                 pull=False)
    print(path)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from draftsman.models.packed_cache import remove_entries

    entries = remove_entries(gguf_path(args.name)) if args.name in CATALOGUE else 0
    if entries:
        print(f"removed {entries} packed-weight entr{'y' if entries == 1 else 'ies'} of "
              f"{args.name}", file=sys.stderr)
    if remove_model(args.name):
        print(f"removed {args.name}", file=sys.stderr)
    else:
        print(f"{args.name} was not pulled; nothing to remove", file=sys.stderr)
    return 0


def cmd_random(args: argparse.Namespace) -> int:
    from draftsman.device import resolve_device
    from draftsman.store.random_weights import write_random_folder

    like = Path(args.like)
    folder = like if (like / "config.json").is_file() else resolve_model(args.like)
    out = write_random_folder(folder, args.out, dtype=args.dtype, seed=args.seed,
                              device=resolve_device(args.device))
    print(out)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    if not args.gguf.is_file():
        raise InvalidArgumentError(f"{args.gguf}: no such file")
    if args.out.exists():
        raise InvalidArgumentError(f"{args.out}: already exists; choose a new folder")
    sha = sha256_file(args.gguf, progress=True)
    install_converted(args.gguf.resolve(), args.out.resolve(), source_sha256=sha,
                      dtype=args.dtype, extra={"gguf": str(args.gguf.resolve())})
    print(args.out.resolve())
    return 0
