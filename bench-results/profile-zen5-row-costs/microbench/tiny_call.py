"""A tiny int8-row product (OUT x 896) called N times at ROWS rows: the per-call cost that
is not the products (python tiny_call.py ROWS OUT N; under perf, which thread waits)."""

import sys
import time

import numpy as np
import torch

from draftsman.kernels.native import byte_records
from draftsman.models.int8_linear import Int8RecordsMatrix


def main() -> None:
    rows, out, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    byte_records()  # loads the kernels
    torch.set_num_threads(2)
    weights = np.random.default_rng(0).standard_normal((out, 896), dtype=np.float32)
    m = Int8RecordsMatrix(torch.from_numpy(weights))
    x = torch.randn(rows, 896, dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(1000):
            m(x)
        start = time.perf_counter()
        for _ in range(n):
            m(x)
        print(rows, f"{(time.perf_counter() - start) / n * 1e6:.2f} us")


if __name__ == "__main__":
    main()
