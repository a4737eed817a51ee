"""The timing the scripts in this folder share."""

import time
from collections.abc import Callable


def ms(f: Callable[[], object], repeats: int = 5) -> float:
    """Milliseconds a call of f, the mean of `repeats` after one warm-up call."""
    f()
    start = time.perf_counter()
    for _ in range(repeats):
        f()
    return (time.perf_counter() - start) / repeats * 1e3
