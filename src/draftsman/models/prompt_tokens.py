"""Prompt tokens' weights (Chen et al., "Hardware-Aware Parallel Prompt Decoding"):
trained embeddings E [m, n, H] (m prompt tokens, n ensemble prompt tokens (EPTs) each,
hidden size H) appended after the last token let the target guess several future tokens.
Saved as ``prompt_tokens.safetensors`` + ``prompt_tokens.json`` (+ ``trees.json``, the
dynamic sparse trees computed from validation accuracies) in a folder beside the model, or
shipped in ``draftsman/assets/prompt_tokens/<model name>/``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from draftsman.errors import DraftsmanError, IncompatibleModelsError
from draftsman.models.base import DecoderLM

EMBEDDINGS_FILE = "prompt_tokens.safetensors"


META_FILE = "prompt_tokens.json"


TREES_FILE = "trees.json"


ASSETS = Path(__file__).resolve().parent.parent / "assets" / "prompt_tokens"


@dataclass
class PromptTokens:
    """Embeddings [m, n, H] (float32) and what they were trained for."""

    embeddings: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None

    @property
    def count(self) -> int:
        """m: prompt tokens (the deepest guess distance)."""
        return int(self.embeddings.shape[0])

    @property
    def epts(self) -> int:
        """n: ensemble prompt tokens per prompt token."""
        return int(self.embeddings.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.embeddings.shape[2])

    @classmethod
    def from_vocabulary(cls, model: DecoderLM, count: int = 3, epts: int = 1,
                        seed: int = 0) -> PromptTokens:
        """Initialise every EPT from the embedding of a random real token (the paper's init)."""
        if count < 1 or epts < 1:
            raise ValueError("need at least one prompt token and one EPT")
        gen = torch.Generator().manual_seed(seed)
        # drawn on the host (the same ids on every device), looked up on the model's device
        ids = torch.randint(0, model.config.vocab_size, (count * epts,), generator=gen)
        ids = ids.to(model.device)
        pos = torch.zeros_like(ids)
        with torch.inference_mode():
            rows = model.embed(ids[None], pos[None])[0].float().cpu()  # [m*n, H]
        emb = rows.reshape(count, epts, -1).clone()
        return cls(emb, {"init": "vocabulary", "seed": seed, **model_fingerprint(model)})

    def check(self, model: DecoderLM) -> None:
        c = model.config
        if self.hidden_size != c.hidden_size:
            raise IncompatibleModelsError(
                f"prompt tokens have hidden size {self.hidden_size}, the model {c.hidden_size}")
        want = model_fingerprint(model)
        have = {k: self.meta.get(k) for k in want}
        if any(have[k] is not None and have[k] != want[k] for k in want):
            raise IncompatibleModelsError(
                f"prompt tokens were trained for a different model ({have} vs {want})")

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"embeddings": self.embeddings.detach().float().contiguous()},
                  str(folder / EMBEDDINGS_FILE))
        (folder / META_FILE).write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        self.folder = folder
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> PromptTokens:
        folder = Path(folder)
        if folder.is_file():
            folder = folder.parent
        path = folder / EMBEDDINGS_FILE
        if not path.is_file():
            raise DraftsmanError(f"no prompt tokens at {folder} (expected {EMBEDDINGS_FILE})")
        emb = load_file(str(path))["embeddings"].float()
        if emb.dim() != 3:
            raise DraftsmanError(f"{path}: expected embeddings [m, n, H], got {list(emb.shape)}")
        meta_path = folder / META_FILE
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        return cls(emb, meta, folder)

    def trees(self) -> dict[str, Any] | None:
        """The cached trees.json beside the embeddings (see sparse_tree.py), if any."""
        if self.folder is None or not (self.folder / TREES_FILE).is_file():
            return None
        return json.loads((self.folder / TREES_FILE).read_text())


def model_fingerprint(model: DecoderLM) -> dict[str, int]:
    c = model.config
    return {"hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "num_layers": c.num_layers}


def find_prompt_tokens(model_folder: Path | None, name: str | None) -> Path | None:
    """Where a model's prompt tokens are: beside the model, else in the shipped assets."""
    options: list[Path] = []
    if model_folder is not None:
        options.append(Path(model_folder) / "prompt_tokens")
    for n in (name, model_folder.name if model_folder is not None else None):
        if n:
            options.append(ASSETS / Path(str(n)).name)
    for folder in options:
        if (folder / EMBEDDINGS_FILE).is_file():
            return folder
    return None

