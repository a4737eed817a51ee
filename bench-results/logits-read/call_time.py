"""The timing both scripts here use: ms per call, the median of 7 runs of n calls."""
import statistics
import time
from collections.abc import Callable


def ms(f: Callable[[], object], n: int) -> float:
    f()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(n):
            f()
        runs.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(runs)
