"""The 0.5B's gate/up call (9728 x 896 int8 rows, silu * up in the call) from cache: p10 and
median us of 2,000 calls at 1, 8 and 16 rows, 2 threads."""

import time

import numpy as np
import torch

from draftsman.kernels.block_types import I8_ROW
from draftsman.kernels.native import byte_records
from draftsman.models.int8_linear import Int8RecordsMatrix


def main() -> None:
    byte_records()  # loads the kernels
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    m = Int8RecordsMatrix(torch.from_numpy(rng.standard_normal((9728, 896), dtype=np.float32)))
    with torch.inference_mode():
        for rows in (1, 8, 16):
            x = torch.randn(rows, 896, dtype=torch.bfloat16)
            for _ in range(200):
                torch.ops.draftsman.kquant_records_swiglu(x, m.packed, I8_ROW, 9728, 0)
            times = []
            for _ in range(2000):
                start = time.perf_counter()
                torch.ops.draftsman.kquant_records_swiglu(x, m.packed, I8_ROW, 9728, 0)
                times.append(time.perf_counter() - start)
            times.sort()
            print(rows, f"p10 {times[200] * 1e6:.1f} med {times[1000] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
