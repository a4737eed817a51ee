"""Early predictions: the next token read from the residual stream after layer d̄.

After the first d̄ of d layers, the residual stream h_d̄ already carries much of the final
prediction. Applying the final norm and an LM head to it gives early logits

    z_d̄ = W_U · T(norm(h_d̄))                                     [V]

where W_U is the model's own LM head and T is the identity (the "shared" head) or a trained
exit head's translator. The top-k of z_d̄ are the early guesses used by the `pipelined`
strategy (Yang et al., "Predictive Pipelined Decoding", section 3), by BiLD's early-exit
small model, and by the match-rate analysis.

Exit heads (`ExitHead`) are small trained translators in front of the *shared* LM head,
trained by `draftsman train exit-head` (distillation towards the final layer's distribution,
model frozen). Three kinds:

    lowrank  T(x) = x + B(A x) + b        A [r, H], B [H, r] (B = 0 at the start)
    affine   T(x) = x + W x + b           W [H, H] (W = 0 at the start; a "tuned lens")
    head     logits = W' x                 W' [V, H] a full LM head (initialised from W_U)

Invariant: a freshly initialised lowrank / affine / head exit head gives exactly the shared
head's logits, so training starts from the "N" row of the paper's Table 2.

Files: `layer<L>.safetensors` holding the trainable tensors plus metadata (kind, layer,
rank, a fingerprint of the model's LM head, held-out metrics). They live in
`<model folder>/exit_heads/` for user folders and in `$DRAFTSMAN_HOME/exit_heads/<name>/` for
store-managed folders (whose contents the store's manifest pins); `find_exit_head` looks in
both, so a trained head is picked up automatically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from draftsman.errors import InvalidArgumentError
from draftsman.models.base import DecoderLM
from draftsman.store.home import draftsman_home

KINDS = ("lowrank", "affine", "head")
EXIT_HEADS_DIR = "exit_heads"
MANIFEST_NAME = "draftsman-manifest.json"  # a store-managed folder (contents hash-pinned)


# ----------------------------------------------------------------------------- layers


def check_layer(model: DecoderLM, layer: int, *, name: str = "exit layer") -> int:
    """`layer` counts layers run (1..d-1): the hidden state after layers[0..layer)."""
    d = model.config.num_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < d:
        raise InvalidArgumentError(
            f"{name} must be an integer from 1 to {d - 1} (the model has {d} layers), "
            f"got {layer!r}")
    return layer


def layer_from_fraction(num_layers: int, value: float | int | str) -> int:
    """'20' -> 20 layers; '0.5' -> round(0.5 d); clipped to 1..d-1."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        raise InvalidArgumentError(f"a layer is an integer or a fraction of depth, got "
                                   f"{value!r}") from None
    layer = round(number * num_layers) if ("." in text or number < 1) else int(number)
    if not 1 <= layer < num_layers:
        raise InvalidArgumentError(f"layer {value!r} -> {layer} is outside 1..{num_layers - 1}")
    return layer


# ----------------------------------------------------------------------------- exit heads


@dataclass(frozen=True)
class ExitHeadConfig:
    layer: int
    kind: str = "lowrank"
    rank: int = 64  # lowrank only
    hidden_size: int = 0
    vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"exit head kind must be one of {', '.join(KINDS)}, "
                                       f"got {self.kind!r}")
        if self.kind == "lowrank" and self.rank < 1:
            raise InvalidArgumentError(f"rank must be >= 1, got {self.rank}")


class ExitTranslator(nn.Module):
    """The trainable part of an exit head: normed hidden [.., H] -> [.., H] (or logits).

    Applied after the model's final norm. For `head` it is a full [V, H] LM head and its
    output is already logits; otherwise the shared LM head follows (see `ExitHead`).
    """

    def __init__(self, config: ExitHeadConfig, lm_head_weight: torch.Tensor | None = None,
                 seed: int = 0) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        gen = torch.Generator().manual_seed(seed)
        if config.kind == "lowrank":
            self.down = nn.Parameter(torch.randn(config.rank, h, generator=gen) / h ** 0.5)
            self.up = nn.Parameter(torch.zeros(h, config.rank))
            self.bias = nn.Parameter(torch.zeros(h))
        elif config.kind == "affine":
            self.weight = nn.Parameter(torch.zeros(h, h))
            self.bias = nn.Parameter(torch.zeros(h))
        else:
            if lm_head_weight is None:
                raise InvalidArgumentError("a 'head' exit head starts from the model's LM head")
            self.weight = nn.Parameter(lm_head_weight.detach().float().clone())

    @property
    def gives_logits(self) -> bool:
        return self.config.kind == "head"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.config.kind
        if kind == "lowrank":
            return x + (x @ self.down.T.to(x.dtype)) @ self.up.T.to(x.dtype) + self.bias.to(x.dtype)
        if kind == "affine":
            return x + x @ self.weight.T.to(x.dtype) + self.bias.to(x.dtype)
        return x @ self.weight.T.to(x.dtype)


class ExitHead(nn.Module):
    """Translator + the model's shared LM head: what `DecoderLM.head(h, exit_head=...)` takes.

    Only the translator is saved; the LM head is the model's (held by reference).
    """

    def __init__(self, translator: ExitTranslator, lm_head: nn.Module) -> None:
        super().__init__()
        self.translator = translator
        self._lm_head = (lm_head,)  # a reference, not a submodule: never saved or moved

    def forward(self, normed: torch.Tensor) -> torch.Tensor:  # [.., H] -> [.., V]
        y = self.translator(normed)
        return y if self.translator.gives_logits else self._lm_head[0](y)


def head_fingerprint(model: DecoderLM) -> str:
    """A short hash of the LM head and final norm: an exit head is only valid on these."""
    h = hashlib.sha256()
    for t in (model.lm_head.weight, model.norm.weight):
        flat = t.detach().flatten()
        h.update(flat[:: max(1, flat.numel() // 4096)].float().numpy().tobytes())
        h.update(str(tuple(t.shape)).encode())
    return h.hexdigest()[:16]


def save_exit_head(translator: ExitTranslator, path: Path, meta: dict[str, Any]) -> Path:
    """Atomically write the translator's tensors (float32) and metadata to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().float().cpu().contiguous()
               for k, v in translator.state_dict().items()}
    metadata = {"config": json.dumps(asdict(translator.config)),
                "meta": json.dumps(meta, default=str)}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return path


def read_exit_head_meta(path: Path) -> tuple[ExitHeadConfig, dict[str, Any]]:
    with safe_open(str(path), framework="pt") as f:
        md = f.metadata() or {}
    return ExitHeadConfig(**json.loads(md["config"])), json.loads(md.get("meta", "{}"))


def load_translator(path: Path, model: DecoderLM | None = None) -> ExitTranslator:
    """Read an exit head file; with `model`, check it fits (sizes and LM head fingerprint)."""
    config, meta = read_exit_head_meta(path)
    with safe_open(str(path), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open API)
    if model is not None:
        c = model.config
        if config.hidden_size != c.hidden_size or not 1 <= config.layer < c.num_layers:
            raise InvalidArgumentError(f"exit head {path} does not fit this model "
                                       f"(hidden {config.hidden_size} vs {c.hidden_size})")
        want = meta.get("fingerprint")
        if want and want != head_fingerprint(model):
            raise InvalidArgumentError(f"exit head {path} was trained for another model "
                                       "(LM head fingerprint differs)")
    translator = ExitTranslator(config, lm_head_weight=state.get("weight")
                                if config.kind == "head" else None)
    translator.load_state_dict(state)
    return translator.eval().requires_grad_(False)


def _home_dir(folder: Path) -> Path:
    return draftsman_home() / EXIT_HEADS_DIR / folder.resolve().name


def exit_head_dirs(folder: str | Path) -> list[Path]:
    """Where exit heads for the model in `folder` are looked for, in order."""
    folder = Path(folder)
    return [folder / EXIT_HEADS_DIR, _home_dir(folder)]


def exit_head_save_dir(folder: str | Path) -> Path:
    """Beside the model, unless the folder is store-managed (its manifest pins every file)
    or not writable: then under $DRAFTSMAN_HOME/exit_heads/<folder name>/."""
    folder = Path(folder)
    if (folder / MANIFEST_NAME).is_file() or not os.access(folder, os.W_OK):
        return _home_dir(folder)
    return folder / EXIT_HEADS_DIR


def exit_head_filename(layer: int) -> str:
    return f"layer{layer}.safetensors"


def find_exit_head(folder: str | Path | None, layer: int) -> Path | None:
    if folder is None:
        return None
    for d in exit_head_dirs(folder):
        path = d / exit_head_filename(layer)
        if path.is_file():
            return path
    return None


def exit_head_file(folder: str | Path | None, layer: int, spec: str | None = "auto"
                   ) -> Path | None:
    """Which exit head to use. `spec`: 'auto' (a trained head for this layer if there is
    one), 'trained' (one must exist), 'shared' / 'none' (the model's own head: None), or a
    path to a layer<L>.safetensors file."""
    spec = "auto" if spec is None else str(spec)
    low = spec.lower()
    if low in ("shared", "none", "off", "n"):
        return None
    if low in ("auto", "trained", "y"):
        path = find_exit_head(folder, layer)
        if path is None and low != "auto":
            raise InvalidArgumentError(
                f"no trained exit head for layer {layer}; run "
                f"`draftsman train exit-head --layer {layer}`")
        return path
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InvalidArgumentError(f"exit head file not found: {path}")
    return path


def resolve_exit_head(model: DecoderLM, folder: str | Path | None, layer: int,
                      spec: str | None = "auto") -> tuple[ExitTranslator, Path] | None:
    """The translator `exit_head_file` names, checked against `model` and `layer`, in the
    model's dtype, with the file it came from; None for the shared head."""
    path = exit_head_file(folder, layer, spec)
    if path is None:
        return None
    translator = load_translator(path, model).to(device=model.device, dtype=model.dtype)
    if translator.config.layer != layer:
        raise InvalidArgumentError(f"{path} is an exit head for layer "
                                   f"{translator.config.layer}, not {layer}")
    return translator, path


# ----------------------------------------------------------------------------- predictions


class EarlyPredictor:
    """Early logits and top-k guesses from the hidden state after `layer` layers."""

    def __init__(self, model: DecoderLM, layer: int,
                 translator: ExitTranslator | nn.Module | None = None) -> None:
        self.model = model
        self.layer = check_layer(model, layer)
        if isinstance(translator, ExitTranslator):
            self.head: nn.Module | None = ExitHead(translator, model.lm_head)
        else:
            self.head = translator  # None (shared head) or any module normed -> logits

    @property
    def trained(self) -> bool:
        return self.head is not None

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [.., H] (residual stream after `layer` layers) -> logits [.., V]."""
        return self.model.head(hidden, exit_head=self.head)

    def topk(self, hidden: torch.Tensor, k: int) -> list[int]:
        """The k best early guesses for one position (hidden [H] or [1, 1, H])."""
        logits = self.logits(hidden.reshape(-1, hidden.shape[-1])[-1])
        return torch.topk(logits.float(), k).indices.tolist()


