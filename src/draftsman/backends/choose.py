"""`--backend auto`: which backend runs a request, and why, from facts gathered by the caller.

Invariants:
- an explicit `torch` or `llama.cpp` is always honoured (a method llama.cpp cannot run then
  fails later with the capability error of models/protocol.py, never silently on torch);
- `auto` picks llama.cpp only when every condition holds: no CUDA GPU (torch's CUDA path is
  the fast one there), the default dtype (the others are torch's number formats), a GGUF for
  every model to load, every capability the methods need declared by llama.cpp, and
  bindings that load; otherwise torch, with the first condition that failed as the reason.

`choose_backend` is pure: the caller passes what it found (engine.py gathers it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftsman.backends.llama_cpp import NUMERICS
from draftsman.errors import InvalidArgumentError
from draftsman.models.protocol import Capabilities

AUTO = "auto"
BACKENDS = ("torch", "llama.cpp")
CHOICES = (AUTO, *BACKENDS)
DEFAULT_DTYPE = "bf16"  # an explicit other dtype asks for torch's number formats


@dataclass(frozen=True)
class Need:
    """One capability a method to be run needs: `method` needs `why` (`capability`)."""

    method: str
    capability: str
    why: str


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "torch" or "llama.cpp"
    reason: str  # one line for --verbose


def choose_backend(requested: str, *, llama_cpp: Capabilities, needs: Sequence[Need] = (),
                   has_gguf: bool, has_cuda: bool, dtype: str = DEFAULT_DTYPE,
                   llama_cpp_problem: Callable[[], str | None] = lambda: None
                   ) -> BackendChoice:
    """The backend for `requested` ("auto", "torch" or "llama.cpp").

    `llama_cpp` is what the llama.cpp backend declares; `has_gguf` whether every model to
    load has a GGUF; `llama_cpp_problem` returns why the bindings do not load (None when
    they do) and is called only when everything else allows llama.cpp.
    """
    if requested in BACKENDS:
        return BackendChoice(requested, f"--backend {requested} was asked for")
    if requested != AUTO:
        raise InvalidArgumentError(
            f"unknown backend {requested!r}; choose from {', '.join(CHOICES)}")
    if dtype != DEFAULT_DTYPE:
        return BackendChoice("torch", f"--dtype {dtype} is a torch number format; llama.cpp "
                                      "runs the GGUF's own quantisation")
    if has_cuda:
        return BackendChoice("torch", "a CUDA GPU is present")
    if not has_gguf:
        return BackendChoice("torch", "the model has no GGUF file (catalogue models and "
                                      ".gguf files have one)")
    for need in needs:
        if not llama_cpp.has(need.capability):
            return BackendChoice("torch", f"{need.method} needs {need.why}, which llama.cpp "
                                          "does not expose")
    problem = llama_cpp_problem()
    if problem:
        return BackendChoice("torch", f"the llama.cpp bindings do not load: {problem}")
    return BackendChoice("llama.cpp", "no CUDA GPU, the model has a GGUF and the method runs "
                                      "on llama.cpp")


def check_backend(backend: str, numerics: str) -> None:
    """Refuse an unknown backend or numerics mode before any model loads. The torch backend
    has one mode, "fast": batch-variant in bf16, exact in fp32, nothing to trade."""
    if backend not in CHOICES:  # "auto" passes here and is checked again once chosen
        raise InvalidArgumentError(
            f"unknown backend {backend!r}; choose from {', '.join(CHOICES)}")
    if numerics not in NUMERICS:
        raise InvalidArgumentError(
            f"unknown --numerics {numerics!r}; choose from {', '.join(NUMERICS)}")
    if backend == "torch" and numerics != "fast":
        raise InvalidArgumentError(
            f"--numerics {numerics} needs --backend llama.cpp (torch is exact in --dtype fp32)")


def check_static(static: object, backend: str) -> None:
    """Static-shape steps (a bool or a StaticConfig) run on the torch backend only."""
    if static and backend != "torch":
        raise InvalidArgumentError(f"--static needs --backend torch, not {backend}")
