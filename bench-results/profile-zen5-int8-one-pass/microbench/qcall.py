"""us a call of an int8-row matrix (Int8RecordsMatrix) at 1, 8, 16 rows, best of 7 loops.
    python qcall.py                 # one 16-row group of 1536 and of 8960 (the quantisation's share)
    python qcall.py 896x896 1152x896 1536x1536 16x896
"""
import sys
import time

import torch

from draftsman.kernels import native
from draftsman.models.int8_linear import Int8RecordsMatrix

native.kquant_available()
torch.set_num_threads(2)
for shape in sys.argv[1:] or ["16x1536", "16x8960"]:
    n, k = map(int, shape.split("x"))
    m = Int8RecordsMatrix(torch.randn(n, k))
    for rows in (1, 8, 16):
        x = torch.randn(rows, k)
        for _ in range(200):
            m(x)
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(300):
                m(x)
            ts.append((time.perf_counter() - t) / 300 * 1e6)
        print(n, k, rows, f"{min(ts):.1f} us")
