"""add_rms_norm alone: p10 and median us of 2,000 calls for 1/8/16 rows of 896 and 1536
(bf16), on 1 and 2 threads."""

import time

import torch

from draftsman.kernels.native import kquant_available


def timed(call, n: int = 2000) -> tuple[float, float]:
    for _ in range(100):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[n // 10] * 1e6, times[n // 2] * 1e6


def main() -> None:
    kquant_available()  # loads the kernels
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in (1, 8, 16):
            for width in (896, 1536):
                x = torch.randn(rows, width).bfloat16()
                delta = torch.randn(rows, width).bfloat16()
                w = torch.randn(width).bfloat16()
                p10, median = timed(lambda x=x, delta=delta, w=w:
                                    torch.ops.draftsman.add_rms_norm(x, delta, w, 1e-6))
                print(threads, rows, width, f"{p10:.1f} {median:.1f} us")


if __name__ == "__main__":
    main()
