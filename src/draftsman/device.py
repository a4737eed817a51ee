"""Which torch device a run uses: `--device auto|cpu|cuda|cuda:N` -> torch.device.

`auto` takes the first GPU when torch sees one and the CPU otherwise. An explicit GPU that is
not there is refused in one line, never silently replaced by the CPU: a run asked for on a
GPU must not be timed on a CPU.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from draftsman.errors import DeviceError, UnsupportedError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
DEVICE_HELP = "auto (default: the GPU when PyTorch sees one, else the CPU), cpu, cuda or cuda:N"
_CUDA = re.compile(r"cuda(?::(\d+))?")


def resolve_device(spec: str | torch.device | None = "auto", *,
                   cpu_only: str | None = None) -> torch.device:
    """'auto' (or None) | 'cpu' | 'cuda' | 'cuda:N' -> torch.device; DeviceError otherwise.

    `cpu_only`, the reason a caller cannot leave the CPU (e.g. "--backend llama.cpp runs on
    the CPU"): then `auto` is the CPU and a GPU, once checked to exist, is UnsupportedError.
    Invariant: a returned CUDA device exists on this machine (index < device_count)."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = (spec or "auto").strip().lower()
    if cpu_only and text != "auto":
        device = resolve_device(text)
        if device.type != "cpu":
            raise UnsupportedError(f"--device {spec}: {cpu_only}")
        return device
    if text == "auto" and cpu_only:
        return torch.device("cpu")
    if text == "auto":
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = _CUDA.fullmatch(text)
    if match is None:
        raise DeviceError(f"--device {spec}: unknown device; choose {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {spec}: no CUDA device here "
                          "(torch.cuda.is_available() is False)")
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"--device {spec}: this machine has {count} CUDA device(s), "
                          f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def to_host(obj: Any) -> Any:
    """A copy of `obj` (nested dicts, lists, tuples) with every tensor moved to the CPU:
    what a checkpoint holds, so one written on a GPU loads anywhere."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj
