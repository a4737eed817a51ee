"""`--backend auto` for a bench run: the backend (and dtype) of its main engine."""

from __future__ import annotations

from collections.abc import Callable

from draftsman.backends.choose import AUTO
from draftsman.bench.spec import parse_methods
from draftsman.engine import DEFAULT_DTYPE, pick_backend
from draftsman.proposers.drafters import is_model_free
from draftsman.strategies.default_method import (
    measured_configuration,
    measured_dtype,
    measured_reason,
)


def choose_engine(target: str, draft: str | None, methods: str | list[str], dtype: str | None,
                  numerics: str, device: str, log: Callable[[str], None]) -> tuple[str, str]:
    """(backend, dtype). Where only `default` runs and no dtype is given, on a CPU: what
    `draftsman generate` would take, this machine's fastest record (engine.load does the
    same); else the dtype given (bf16 if none) on a backend every method of the run (and the
    draft) can use. Methods with an engine of their own do not count."""
    wanted = [(m.method, m.kwargs()) for m in parse_methods(methods) if not m.engine]
    # the baseline (first) runs wherever the run does: it does not pin the backend
    measured = measured_configuration(target, numerics, wanted[1:], dtype, device)
    if measured is not None:
        log(f"bench: backend {measured_reason(measured)}")
        return measured.backend, measured_dtype(measured)
    dtype = dtype or DEFAULT_DTYPE
    model_draft = None if is_model_free(draft) else draft
    choice = pick_backend(target, AUTO, dtype=dtype, draft=model_draft, methods=wanted)
    log(f"bench: backend {choice.backend} ({choice.reason})")
    return choice.backend, dtype
