"""A model folder with the architecture of another and random weights: for timing.

A forward's cost depends on the shapes and dtype of the weights, never on their values, so a
GPU timing of a 1.5B model needs its config.json, not its 3 GB of weights. The folder written
here loads like any other (our loader and transformers'), and says what it is: its
`draftsman-weights.json` holds `{"weights": "random", ...}`, which the bench copies into every
row it times (`env.weights`), so a random-weight time is never read as a real model's.

Random weights decide nothing about acceptance (a random draft agrees with a random target
about 1/vocab of the time): only costs measured on such a folder mean anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from draftsman.errors import InvalidArgumentError

MARKER = "draftsman-weights.json"
COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def weights_label(folder: str | Path | None) -> str:
    """"random" for a folder written by `write_random_folder`, else "real"."""
    if folder is None:
        return "real"
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return "real"
    return str(json.loads(marker.read_text()).get("weights", "real"))


def write_random_folder(like: str | Path, out: str | Path, *, dtype: str = "bfloat16",
                        seed: int = 0, device: str | torch.device = "cpu") -> Path:
    """Write `out`: `like`'s config and tokenizer files, random weights in `dtype`.

    `like` is a folder holding at least config.json (tokenizer files are copied when there).
    `device` is where the random tensors are drawn (a GPU draws 1.5B weights in a second).
    Invariant: `out` appears whole or not at all (written beside it, then renamed)."""
    import transformers

    like, out = Path(like), Path(out)
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"--dtype {dtype}: choose {', '.join(DTYPES)}")
    if not (like / "config.json").is_file():
        raise InvalidArgumentError(f"{like}: no config.json to take the architecture from")
    if out.exists():
        raise InvalidArgumentError(f"{out} already exists; choose a new folder")
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in COPIED:
        if (like / name).is_file():
            shutil.copy2(like / name, partial / name)
    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.from_pretrained(str(like))
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    model.save_pretrained(str(partial))
    (partial / MARKER).write_text(json.dumps(
        {"weights": "random", "seed": seed, "dtype": dtype, "like": str(like)}, indent=2) + "\n")
    partial.rename(out)
    return out
